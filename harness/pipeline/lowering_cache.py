"""Where a case's lowering is kept, whether one finished there and whether a kept one may be served.

The session asks whether the run needs a lowering server (is every collected case's lowering kept?), the
case store where to lower a case and whether its kept lowering is sound; both ask here, so the two agree.
The content key itself is harness/pipeline/cache.py's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.files import say
from harness.pipeline import cache
from harness.pipeline.facts import FactsError, LoweringFacts
from harness.pipeline.lower import LoweredArtifact
from harness.qnn import qnnlog
from harness.qnn.toolchain import Toolchain
from harness.user_state import entry_problem
from harness.vocabulary import Case


def lowering_directory(case: Case, steps: int, toolchain: Toolchain, cache_dir: Path | None, work_dir: Path) -> Path:
    """Where the case's lowering is kept: by content key in the cache, else in this run's work folder. A driven
    case's is its undriven case's: a driver changes how the program is run, never the program."""
    case = case.lowering
    if cache_dir is None:
        return work_dir / "artifacts" / case.id
    return cache_dir / cache.key(case, steps, toolchain)


def is_lowered(directory: Path) -> bool:
    """Whether a lowering of this user's finished there (whether it is sound is checked when it is served;
    one another account owns is set aside then, harness/user_state.py claim_entry)."""
    return (directory / "facts.json").exists() and (directory / "lower.log").exists() and not entry_problem(directory)


def served(case: Case, directory: Path) -> LoweredArtifact | None:
    """The lowering kept in directory, when its facts parse and its program is the one they describe; None
    when there is none, or (said in one line on stderr) when it is damaged and must be lowered again."""
    facts_path, log_path = directory / "facts.json", directory / "lower.log"
    if not is_lowered(directory):
        return None
    try:
        facts = LoweringFacts.read_cached(facts_path)
    except FactsError as error:
        problem = str(error)
    else:
        problem = program_problem(directory / "model.pte", facts)
        if problem is None:
            log = log_path.read_text(errors="replace")
            return LoweredArtifact(case, directory, facts, log, 0.0, qnnlog.error_lines(log), cached=True)
    say(f"qnnsuite: cached lowering of {case.id} is damaged ({problem}); lowering it again")
    return None


def program_problem(pte: Path, facts: LoweringFacts) -> str | None:
    """Why a cached model.pte is not the program its facts describe (None: it is, or there is none to be)."""
    if facts.error is not None:
        return None  # a lowering failure has no program
    if facts.program is None:
        return "its facts do not describe a program"
    try:
        data = pte.read_bytes()
    except OSError as error:
        return f"model.pte unreadable: {error.strerror or error}"
    if len(data) != facts.program.bytes:
        return f"model.pte has {len(data)} bytes, its facts say {facts.program.bytes}"
    if hashlib.sha256(data).hexdigest() != facts.program.sha256:
        return "model.pte's sha256 differs from its facts'"
    return None
