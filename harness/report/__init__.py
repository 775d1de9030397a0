"""Per-SoC reports of a run (JSON, JUnit, Markdown, HTML) and gating against a baseline."""

from harness.report.gate import BaselineError, GateResult, gate
from harness.report.render.writer import summary_line, write_run

__all__ = ["BaselineError", "GateResult", "gate", "summary_line", "write_run"]
