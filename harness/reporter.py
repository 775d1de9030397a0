"""The controller's reporter: collects every check's record from pytest's test reports and, at the end of
the session, writes the per-SoC reports, gates against a baseline and prints the summary.

Registered on the controller only (as pytest's junitxml registers its LogXML), so with xdist it sees each
worker's reports once, as they arrive, and nothing is written per worker. The baseline it gates against
was read before this run wrote anything, so `--baseline reports/latest` means the previous run.
"""
from __future__ import annotations

import time

import pytest

from harness import check_registry, environment, report
from harness.context import RunContext
from harness.options import RunOptions
from harness.qnn.toolchain import prepare
from harness.record import REPORT_ATTRIBUTE, CheckRecord
from harness.repro import layout
from harness.report.gate import Key, Outcome

SECTION = "QNN mutable-buffer conformance"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class ConformanceReporter:
    def __init__(self, options: RunOptions, context: RunContext, baseline: dict[Key, Outcome] | None) -> None:
        """baseline: the outcomes of --baseline, read before this run wrote anything (None: no gate)."""
        self._options, self._context, self._baseline = options, context, baseline
        self.records: list[CheckRecord] = []
        self._lines: list[str] = []
        self._started = _now()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if data is not None:
            self.records.append(CheckRecord.from_dict(data))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.records:
            return
        toolchain = prepare(self._options.qnn_sdk)
        environments = environment.per_soc(self._context, toolchain, self._started, _now())
        folders = report.write_run(self.records, environments, self._options.report_dir, self._context.run_id,
                                   check_registry.columns())
        self._lines = [report.summary_line(self.records, soc, folders[soc] / "report.html") for soc in sorted(folders)]
        for soc in sorted(folders):
            if bundles := layout.sizes(folders[soc]):
                self._lines.append(f"{soc}: {len(bundles)} reproduction bundle(s), "
                                   f"{sum(b.archive_bytes for b in bundles) / 1024:.0f} KiB as .tar.gz -> {folders[soc] / layout.REPRO_DIR}")
        if self._baseline is not None:
            verdict = report.gate(self.records, self._baseline)
            self._lines += [f"gate against {self._options.baseline}: " + ("no regressions" if verdict.ok else "FAILED")]
            self._lines += [f"  {line}" for line in verdict.lines()]
            if not verdict.ok:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self._lines:
            terminalreporter.section(SECTION)
            for line in self._lines:
                terminalreporter.write_line(line)
