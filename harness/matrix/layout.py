"""What a matrix run folder holds, the one place runner and builder agree on it.

reports/matrix-<id>/ has command.txt, and per combination <combination id>/ has combination.json (what happened: ran, or why not), pytest.log
and the suite's own reports (<run>/<SOC>/report.json, reports/README.md); matrix.{json,md,html} sit
in reports/matrix-<id>/ itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

COMBINATION_FILE = "combination.json"
COMMAND_FILE = "command.txt"  # the commands that made the runs, one a line (written first, so a re-render keeps them)
SUITE_LOG = "pytest.log"
OUTPUTS = ("matrix.json", "matrix.md", "matrix.html")


@dataclass(frozen=True)
class Combination:
    executorch: str
    qnn_wheel: str  # the onnxruntime-qnn release whose host libraries are used

    @property
    def id(self) -> str:
        return f"executorch-{self.executorch}_onnxruntime-qnn-{self.qnn_wheel}"


def report_files(folder: Path) -> list[Path]:
    """The per-SoC report.json files a suite run wrote under `folder` (its `latest` link left out),
    sorted by run id."""
    return sorted(path for path in folder.glob("*/*/report.json") if not path.parent.parent.is_symlink())
