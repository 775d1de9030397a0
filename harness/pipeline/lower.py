"""Host side of lowering: run harness.pipeline.lower_job for a case and read back what it made."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.paths import REPO_ROOT
from harness.pipeline import cache
from harness.pipeline.facts import FactsError, LoweringFacts, LoweringRequest
from harness.process import fork_client
from harness.process.services import LOWERING
from harness.qnn import qnnlog
from harness.qnn.toolchain import Toolchain
from harness.vocabulary import Case

LOWER_TIMEOUT_S = 900


@dataclass
class LoweredArtifact:
    case: Case
    directory: Path
    facts: LoweringFacts
    log: str
    wall_s: float
    qnn_errors: list[str] = field(default_factory=list)
    cached: bool = False  # read back from the artifact cache rather than lowered now

    @property
    def pte(self) -> Path:
        return self.directory / "model.pte"

    @property
    def ok(self) -> bool:
        return self.facts.error is None and self.pte.exists()

    @property
    def failure(self) -> str:
        """One line saying why lowering produced no program; the QNN library's first error line with it, as
        executorch's own message ("Failed to generate Qnn context binary.") names no op and no cause."""
        error = self.facts.error
        if error:
            return f"lowering failed: {error.type}: {error.message}" + (
                f" (QNN: {self.qnn_errors[0]})" if self.qnn_errors else ""
            )
        return "lowering produced no model.pte" + (f" (QNN: {self.qnn_errors[0]})" if self.qnn_errors else "")

    @property
    def work(self) -> dict[str, int]:
        """What this run computed for the case (nothing when read from the cache): the counts a run's report
        sums, so a benchmark can tell that each card and dtype was exported and quantized once."""
        fresh = not self.cached
        return {
            "export": int(fresh and self.facts.exported),
            "quantize": int(fresh and self.facts.quantized),
            "lower": int(fresh),
        }

    @property
    def delegate_count(self) -> int:
        return len(self.facts.partitions.delegates) if self.facts.partitions else 0


def lower_case(
    case: Case,
    toolchain: Toolchain,
    directory: Path,
    steps: int,
    server: Path | None = None,
    shared_root: Path | None = None,
    profile_level: int = 0,
) -> LoweredArtifact:
    """Lower in a process of its own: a child of the run's lowering server (harness/process/services.py)
    when there is one, else a fresh `python -m harness.pipeline.lower_job`. shared_root: where the entries
    of what a card's lowerings share live (its export facts, its quantized program per dtype:
    harness/pipeline/prepared.py), by content key; None: the case makes its own."""
    directory.mkdir(parents=True, exist_ok=True)
    request_path = directory / "request.json"
    exported = prepared = ""
    if shared_root is not None:
        exported = str(shared_root / cache.exported_key(case, steps))
        quantized = cache.prepared_key(case, steps)
        prepared = str(shared_root / quantized) if quantized else ""
    LoweringRequest(
        case.card.reference,
        case.dtype,
        case.mode,
        case.soc,
        steps,
        str(directory),
        exported,
        prepared,
        case.share_mutable_buffers,
        profile_level,
    ).write(request_path)
    for stale in ("model.pte", "facts.json"):
        (directory / stale).unlink(missing_ok=True)
    log_path = directory / "lower.log"
    started = time.perf_counter()
    with open(log_path, "wb") as log_file:
        ended = _run_lower_job(request_path, toolchain.child_env(), log_file, server)
    wall = time.perf_counter() - started
    log = log_path.read_text(errors="replace")
    try:
        facts = LoweringFacts.read(directory / "facts.json")
    except FactsError:
        facts = LoweringFacts.crashed(f"lowering process {ended} without facts; see {log_path}")
    return LoweredArtifact(case, directory, facts, log, wall, qnnlog.error_lines(log))


def _run_lower_job(request_path: Path, env: dict[str, str], log: IO[bytes], server: Path | None) -> str:
    """Run lower_job on the request, its stdout and stderr into log; returns how it ended, in words."""
    with open(os.devnull, "rb") as stdin:
        try:
            status = fork_client.run(
                str(server) if server else None,
                LOWERING.entry,
                [str(request_path)],
                str(REPO_ROOT),
                env,
                {0: stdin.fileno(), 1: log.fileno(), 2: log.fileno()},
                LOWER_TIMEOUT_S,
            )
        except fork_client.ServerGone as gone:
            return f"was lost ({gone})"
        except TimeoutError:
            return f"was killed after {LOWER_TIMEOUT_S} s"
    return f"exited {status}"
