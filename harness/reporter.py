"""The controller's reporter: collects every check's record from pytest's test reports and, at the end of
the session, writes the per-SoC reports, gates against a baseline and prints the summary.

Registered on the controller only (as pytest's junitxml registers its LogXML), so with xdist it sees each
worker's reports once, as they arrive, and nothing is written per worker. The baseline it gates against
was read before this run wrote anything, so `--baseline reports/latest` means the previous run.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

import pytest

from harness import check_registry, environment, report
from harness.context import RunContext
from harness.files import write_atomically
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
        self._notes: list[str] = []  # records that could not be read
        self._started = _now()
        self.failed = False  # reporting failed: the run's work folder must be kept

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if data is None:
            return
        try:
            self.records.append(CheckRecord.from_dict(data))
        except (TypeError, ValueError) as error:  # one bad record costs its own check, never the report
            self._notes.append(f"unreadable record of {report.nodeid} ({type(error).__name__}: {error}); left out of the report")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.records:
            return
        try:
            self._report(session)
        except Exception as error:  # keep what the run found: the records and the work folder
            self.failed = True
            kept = self._context.work_dir / "records.json"
            write_atomically(kept, json.dumps([r.to_dict() for r in self.records], indent=1))
            traceback.print_exc(file=sys.stderr)
            self._lines.append(f"writing the reports failed ({type(error).__name__}: {error}); the records are in "
                               f"{kept} and the run's work folder is kept")
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _report(self, session: pytest.Session) -> None:
        verdict = None
        if self._baseline is not None:
            verdict = report.gate(self.records, self._baseline, self._options.allow_missing)
        toolchain = prepare(self._options.qnn_sdk)
        shard = self._options.shard.label if self._options.shard else None
        environments = environment.per_soc(self._context, toolchain, self._started, _now(), shard)
        provenance = environment.provenance_per_soc(self._context, toolchain)
        folders = report.write_run(self.records, environments, self._options.report_dir, self._context.run_id,
                                   check_registry.columns(), verdict, provenance)
        self._lines = [report.summary_line(self.records, soc, folders[soc] / "report.html", shard) for soc in sorted(folders)]
        self._lines += [line for soc in sorted(folders) for line in provenance.get(soc, {}).get("warnings", [])]
        self._lines += self._notes
        for soc in sorted(folders):
            if bundles := layout.sizes(folders[soc]):
                self._lines.append(f"{soc}: {len(bundles)} reproduction bundle(s), "
                                   f"{sum(b.archive_bytes for b in bundles) / 1024:.0f} KiB as .tar.gz -> {folders[soc] / layout.REPRO_DIR}")
        if verdict is not None:
            named = len(verdict.entries())
            self._lines += [f"gate against {self._options.baseline}: " + ("no regressions" if verdict.ok else "FAILED")
                            + (f" ({named} check(s) named; gate.json beside each report.json)" if named else "")]
            self._lines += [f"  {line}" for line in verdict.lines()]
            if not verdict.ok:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self._lines or self._notes
        if lines:
            terminalreporter.section(SECTION)
            for line in lines:
                terminalreporter.write_line(line)
