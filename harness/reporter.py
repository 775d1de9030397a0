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
from pathlib import Path

import pytest

from harness import check_registry, environment, report
from harness.context import RunContext
from harness.files import say, unwritable, write_atomically
from harness.options import RunOptions
from harness.qnn.toolchain import prepare
from harness.record import REPORT_ATTRIBUTE, CheckRecord
from harness.report.gate import Key, Outcome
from harness.repro import layout
from harness.user_state import UnsafeStateDir, state_dir

SECTION = "QNN mutable-buffer conformance"
# The run's exit code when its reports could not be written (disk full, read-only or foreign folder): not 1,
# which reads as "tests failed", nor pytest's own 0-5. docs/FAULTS.md lists it.
REPORTS_NOT_WRITTEN = 6
KEPT_RECORDS = "records"  # the user's state folder for records no report could take


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
        self._printed_records: list[str] = []  # the records, when no folder could take them

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if data is None:
            return
        try:
            self.records.append(CheckRecord.from_dict(data))
        except (TypeError, ValueError) as error:  # one bad record costs its own check, never the report
            self._notes.append(
                f"unreadable record of {report.nodeid} ({type(error).__name__}: {error}); left out of the report"
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.records:
            return
        try:
            self._report(session)
        except Exception as error:  # keep what the run found: the records and the work folder
            self.failed = True
            kept = self._keep_records()
            if unwritable(error):  # the lab's fault, not the suite's: one line, no traceback, a code of its own
                written = [
                    soc
                    for soc in sorted({r.soc for r in self.records})
                    if (self._options.report_dir / self._context.run_id / soc / "report.json").is_file()
                ]
                self._lines = [
                    *self._notes,
                    (
                        f"reports not written: {error.strerror} ({getattr(error, 'filename', None) or self._options.report_dir})"
                        f"; report.json written for {', '.join(written) if written else 'no SoC'}; {kept}; `latest` still "
                        f"names the last complete run: free space there or pass --report-dir on another filesystem "
                        f"(exit {REPORTS_NOT_WRITTEN})"
                    ),
                ]
                session.exitstatus = REPORTS_NOT_WRITTEN
                return
            try:
                traceback.print_exc(file=sys.stderr)
            except (OSError, ValueError):
                pass
            self._lines = [*self._notes, f"writing the reports failed ({type(error).__name__}: {error}); {kept}"]
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def _keep_records(self) -> str:
        """Keep the records where they can be written: the run's work folder (then kept), else the user's
        state folder (XDG_RUNTIME_DIR or the temporary folder: often another filesystem), else the terminal
        (one compact JSON line per record). Returns what was done, in words."""
        data = json.dumps([r.to_dict() for r in self.records], separators=(",", ":"))
        candidates = [
            lambda: self._context.work_dir / "records.json",
            lambda: state_dir(KEPT_RECORDS) / f"{self._context.run_id}.json",
        ]
        for candidate in candidates:
            try:
                path: Path = candidate()
                write_atomically(path, data)
            except (OSError, UnsafeStateDir):
                continue
            return f"the records are in {path} and the run's work folder is kept"
        self._printed_records = [json.dumps(r.to_dict(), separators=(",", ":")) for r in self.records]
        return "no folder could take the records either: they follow, one JSON line per check"

    def _report(self, session: pytest.Session) -> None:
        verdict = None
        if self._baseline is not None:
            verdict = report.gate(self.records, self._baseline, self._options.allow_missing)
        toolchain = prepare(self._options.qnn_sdk)
        shard = self._options.shard.label if self._options.shard else None
        environments = environment.per_soc(self._context, toolchain, self._started, _now(), shard)
        provenance = environment.provenance_per_soc(self._context, toolchain)
        folders = report.write_run(
            self.records,
            environments,
            self._options.report_dir,
            self._context.run_id,
            check_registry.columns(),
            verdict,
            provenance,
        )
        self._lines = [
            report.summary_line(self.records, soc, folders[soc] / "report.html", shard) for soc in sorted(folders)
        ]
        self._lines += [line for soc in sorted(folders) for line in provenance.get(soc, {}).get("warnings", [])]
        self._lines += self._notes
        for soc in sorted(folders):
            if bundles := layout.sizes(folders[soc]):
                self._lines.append(
                    f"{soc}: {len(bundles)} reproduction bundle(s), "
                    f"{sum(b.archive_bytes for b in bundles) / 1024:.0f} KiB as .tar.gz -> {folders[soc] / layout.REPRO_DIR}"
                )
        if unbundled := [r for r in self.records if r.verdict in layout.BUNDLED_VERDICTS and not r.repro]:
            self._lines.append(
                f"{len(unbundled)} check(s) have no reproduction bundle (it could not be written; "
                f"stderr says why), e.g. {unbundled[0].case_id} {unbundled[0].check}"
            )
        if verdict is not None:
            named = len(verdict.entries())
            self._lines += [
                f"gate against {self._options.baseline}: "
                + ("no regressions" if verdict.ok else "FAILED")
                + (f" ({named} check(s) named; gate.json beside each report.json)" if named else "")
            ]
            self._lines += [f"  {line}" for line in verdict.lines()]
            if not verdict.ok:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = (self._lines or self._notes) + self._printed_records
        if not lines:
            return
        try:
            terminalreporter.section(SECTION)
            for line in lines:
                terminalreporter.write_line(line)
        except (OSError, ValueError):  # a terminal that cannot take them: the exit code still tells
            say(f"qnnsuite: {lines[0]}")
