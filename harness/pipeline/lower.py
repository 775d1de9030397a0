"""Host side of lowering: run harness.pipeline.lower_job for a case and read back what it made."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness import fork_client
from harness.paths import REPO_ROOT
from harness.pipeline.card import ModelCard
from harness.qnn import qnnlog
from harness.qnn.toolchain import Toolchain

LOWER_TIMEOUT_S = 900


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: card x dtype x skip_mutable_buffer x SoC (x how it is lowered)."""

    card: ModelCard
    dtype: str
    skip_mutable_buffer: bool
    soc: str
    lowering: str = "qnn"  # to_edge_transform_and_lower_to_qnn, or "meta_llama" (export_llama_lib's way)

    @property
    def mode(self) -> str:
        if self.lowering == "meta_llama":
            return "meta_llama"
        return "skip_mutbuf" if self.skip_mutable_buffer else "delegate_mutbuf"

    @property
    def id(self) -> str:
        return f"{self.card.name}-{self.dtype}-{self.mode}-{self.soc}"


@dataclass
class LoweredArtifact:
    case: Case
    directory: Path
    facts: dict
    log: str
    wall_s: float
    qnn_errors: list[str] = field(default_factory=list)
    cached: bool = False  # read back from the artifact cache rather than lowered now

    @property
    def pte(self) -> Path:
        return self.directory / "model.pte"

    @property
    def ok(self) -> bool:
        return self.facts.get("error") is None and self.pte.exists()

    @property
    def failure(self) -> str:
        """One line saying why lowering produced no program."""
        error = self.facts.get("error")
        if error:
            return f"lowering failed: {error['type']}: {error['message']}"
        return "lowering produced no model.pte" + (f" (QNN: {self.qnn_errors[0]})" if self.qnn_errors else "")

    @property
    def delegate_count(self) -> int:
        return len(self.facts.get("partitions", {}).get("delegates", []))


def lower_case(case: Case, toolchain: Toolchain, directory: Path, steps: int,
               server: Path | None = None) -> LoweredArtifact:
    """Lower in a process of its own: a child of the run's lowering server (harness.pipeline.lower_server)
    when there is one, else a fresh `python -m harness.pipeline.lower_job`."""
    directory.mkdir(parents=True, exist_ok=True)
    request = {"card": case.card.reference, "dtype": case.dtype, "skip_mutable_buffer": case.skip_mutable_buffer,
               "soc": case.soc, "lowering": case.lowering, "steps": steps, "out_dir": str(directory)}
    request_path = directory / "request.json"
    request_path.write_text(json.dumps(request, indent=1))
    for stale in ("model.pte", "facts.json"):
        (directory / stale).unlink(missing_ok=True)
    log_path = directory / "lower.log"
    started = time.perf_counter()
    with open(log_path, "wb") as log_file:
        ended = _run_lower_job(request_path, toolchain.child_env(), log_file, server)
    wall = time.perf_counter() - started
    log = log_path.read_text(errors="replace")
    facts_path = directory / "facts.json"
    if facts_path.exists():
        facts = json.loads(facts_path.read_text())
    else:
        facts = {"error": {"type": "LoweringCrashed", "message": f"lowering process {ended} without facts; "
                           f"see {log_path}", "traceback": ""}}
    return LoweredArtifact(case, directory, facts, log, wall, qnnlog.error_lines(log))


def _run_lower_job(request_path: Path, env: dict[str, str], log: IO[bytes], server: Path | None) -> str:
    """Run lower_job on the request, its stdout and stderr into log; returns how it ended, in words."""
    if server is not None:
        with open(os.devnull, "rb") as stdin:
            try:
                status = fork_client.request(str(server), [str(request_path)], str(REPO_ROOT), env,
                                             {0: stdin.fileno(), 1: log.fileno(), 2: log.fileno()}, LOWER_TIMEOUT_S)
                return f"exited {status}"
            except fork_client.NotStarted:
                pass  # no server (any more): the slow way below
            except fork_client.ServerGone as gone:
                return f"was lost ({gone})"
            except TimeoutError:
                return f"was killed after {LOWER_TIMEOUT_S} s"
    try:
        completed = subprocess.run([sys.executable, "-m", "harness.pipeline.lower_job", str(request_path)],
                                   cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, timeout=LOWER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"was killed after {LOWER_TIMEOUT_S} s"
    return f"exited {completed.returncode}"
