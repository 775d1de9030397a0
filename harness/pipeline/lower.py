"""Host side of lowering: run harness.pipeline.lower_job for a case and read back what it made."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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


def lower_case(case: Case, toolchain: Toolchain, directory: Path, steps: int) -> LoweredArtifact:
    directory.mkdir(parents=True, exist_ok=True)
    request = {"card": case.card.reference, "dtype": case.dtype, "skip_mutable_buffer": case.skip_mutable_buffer,
               "soc": case.soc, "lowering": case.lowering, "steps": steps, "out_dir": str(directory)}
    request_path = directory / "request.json"
    request_path.write_text(json.dumps(request, indent=1))
    for stale in ("model.pte", "facts.json"):
        (directory / stale).unlink(missing_ok=True)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "harness.pipeline.lower_job", str(request_path)],
                               cwd=REPO_ROOT, env=toolchain.child_env(), capture_output=True, text=True,
                               timeout=LOWER_TIMEOUT_S)
    wall = time.perf_counter() - started
    log = completed.stdout + completed.stderr
    (directory / "lower.log").write_text(log)
    facts_path = directory / "facts.json"
    if facts_path.exists():
        facts = json.loads(facts_path.read_text())
    else:
        facts = {"error": {"type": "LoweringCrashed", "message": f"lowering process exited {completed.returncode} "
                           f"without facts; see {directory / 'lower.log'}", "traceback": ""}}
    return LoweredArtifact(case, directory, facts, log, wall, qnnlog.error_lines(log))
