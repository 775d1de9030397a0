"""The controller's reporter: collects every check's record from pytest's test reports and, at the end of
the session, writes the per-SoC reports, gates against a baseline and prints the summary.

Registered on the controller only (as pytest's junitxml registers its LogXML), so with xdist it sees each
worker's reports once, as they arrive, and nothing is written per worker. The baseline it gates against
was read before this run wrote anything, so `--baseline reports/latest` means the previous run.
"""

from __future__ import annotations

import collections
import json
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import pytest

from harness import check_registry, environment, report, selection
from harness.context import RunContext
from harness.files import say, unwritable, write_atomically
from harness.options import REPORTS_NOT_WRITTEN, RunOptions
from harness.qnn.toolchain import prepare
from harness.record import CheckRecord, carried_record
from harness.report import perf_gate, structure_gate
from harness.report.document import tally
from harness.report.gate import BaselineError, GateResult, Key, Outcome, Selection, clip, read_documents
from harness.report.nightly.promote import identity
from harness.report.perf_gate import FAIL, PASS, WARN
from harness.repro import layout
from harness.user_state import UnsafeStateDir, state_dir
from harness.vocabulary import DTYPES, Verdict

SECTION = "QNN mutable-buffer conformance"
GATE_LINES = 20  # the gate's lines the terminal shows; gate.json, summary.md and report.html have all of them
# pytest's (category, progress letter, verbose word) for a verdict its own outcomes would miscount: a check the
# device cannot measure is not "skipped". An infrastructure error stays a pytest failure (its FAILED line and
# its section carry the device's words, and junit and CI annotations see it); the closing line counts it apart.
STATUS = {Verdict.NOT_MEASURED: (Verdict.NOT_MEASURED.spoken, "n", "NOT MEASURED")}
REASON_LINES = 5  # per verdict that is not executorch's: the distinct reasons the terminal names
KEPT_RECORDS = "records"  # the user's state folder for records no report could take


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class ConformanceReporter:
    def __init__(self, options: RunOptions, context: RunContext, baseline: dict[Key, Outcome] | None) -> None:
        """baseline: the outcomes of --baseline, read before this run wrote anything (None: no gate)."""
        self._options, self._context, self._baseline = options, context, baseline
        # The baseline's case timings, read now too (before this run writes): the performance gate's side.
        # The plugin read the same path as outcomes already; a path that cannot be read (given as outcomes
        # only) leaves the performance gate nothing to compare.
        self._perf_baseline: dict = {}
        self._baseline_identity: dict[str, str] = {}  # how the gate names its baseline (night, run id, executorch)
        self._structure_baseline: dict = {}
        if baseline is not None and options.baseline is not None:
            try:
                documents = [document for _, document in read_documents(Path(options.baseline))]
            except BaselineError:
                documents = []
            self._perf_baseline = perf_gate.baseline_timings(documents)
            self._baseline_identity = identity(Path(options.baseline), documents) if documents else {}
            self._structure_baseline = structure_gate.baseline_structures(documents)
        self.records: list[CheckRecord] = []
        self._lines: list[str] = []
        self._notes: list[str] = []  # records that could not be read
        self._started = _now()
        self.failed = False  # reporting failed: the run's work folder must be kept
        self._printed_records: list[str] = []  # the records, when no folder could take them
        self._skipped: collections.Counter[str] = collections.Counter()  # reasons of checks skipped unjudged

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = carried_record(getattr(report, "user_properties", None))
        if data is None:
            if getattr(report, "skipped", False) and isinstance(
                report.longrepr, tuple
            ):  # skipped before a verdict: (file, line, reason)
                self._skipped[str(report.longrepr[2]).removeprefix("Skipped: ")] += 1
            return
        try:
            self.records.append(CheckRecord.from_dict(data))
        except (TypeError, ValueError) as error:  # one bad record costs its own check, never the report
            self._notes.append(
                f"unreadable record of {report.nodeid} ({type(error).__name__}: {error}); left out of the report"
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> tuple[str, str, str] | None:
        """pytest's own counts (its last line, its progress letters) name the two verdicts that are not about
        executorch, instead of counting a not-measured check as skipped and an infrastructure error as failed."""
        data = carried_record(getattr(report, "user_properties", None))
        verdict = data.get("verdict") if isinstance(data, dict) else None
        if verdict in STATUS:
            return STATUS[verdict]
        return None

    def _empty_selection_lines(self, session: pytest.Session) -> list[str]:
        """A run that selected nothing (pytest's exit 5): the filter that emptied it, in one line."""
        if getattr(session, "exitstatus", None) != pytest.ExitCode.NO_TESTS_COLLECTED:
            return []
        options = self._options
        line = selection.empty_selection_line(
            self._context.socs(()),
            options.soc_filter,
            options.dtypes,
            session.config.option.keyword,
            options.shard.label if options.shard else None,
        )
        return [line] if line else []

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Writes the reports (before pytest's terminal summary: see pytest_sessionfinish_last for the lines)."""
        if not self.records:
            self._lines = nothing_judged_lines(self._skipped) or self._empty_selection_lines(session)
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
        shard = self._options.shard.label if self._options.shard else None
        selection = run_selection(self._options, getattr(session, "config", None))
        if self._baseline is not None:
            partial = " ".join(filter(None, (selection.partial, f"--shard {shard}" if shard else "")))
            verdict = replace(
                report.gate(
                    self.records, self._baseline, self._options.allow_missing, replace(selection, partial=partial)
                ),
                performance=perf_gate.compare(self._perf_baseline, self.records, self._options.perf_budget),
                perf_fails_gate=self._options.perf_gate,
                baseline=self._baseline_identity,
                structure=structure_gate.compare(self._structure_baseline, self.records),
            )
        toolchain = prepare(self._options.qnn_sdk)
        environments = environment.per_soc(self._context, toolchain, self._started, _now(), shard)
        for entry in environments.values():  # the phones' delegation rule reads it from report.json
            entry["perf_budget_pct"] = self._options.perf_budget
            entry |= (
                selection.environment()
            )  # a merge of this run's shards gates by it (harness/report/nightly/merge.py)
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
            report.summary_line(
                self.records, soc, folders[soc] / "report.html", shard, bool(environments.get(soc, {}).get("emulated"))
            )
            for soc in sorted(folders)
        ]
        self._lines += [line for soc in sorted(folders) for line in provenance.get(soc, {}).get("warnings", [])]
        self._lines += self._notes
        for soc in sorted(folders):
            if bundles := layout.sizes(folders[soc]):
                self._lines.append(
                    f"{soc}: {len(bundles)} reproduction bundle(s), "
                    f"{sum(b.archive_bytes for b in bundles) / 1024:.0f} KiB as .tar.gz -> {folders[soc] / layout.REPRO_DIR}"
                )
        if unbundled := [r for r in self.records if r.verdict.bundled and not r.repro]:
            self._lines.append(
                f"{len(unbundled)} check(s) have no reproduction bundle (it could not be written; "
                f"stderr says why), e.g. {unbundled[0].case_id} {unbundled[0].check}"
            )
        if verdict is not None:
            named = verdict.lines()
            self._lines += [
                f"gate against {self._options.baseline}"
                + (f" ({said})" if (said := verdict.baseline_line()) else "")
                + ": "
                + ("no regressions" if verdict.ok else "FAILED")
                + f"; performance: {_perf_counts(verdict)}; structure: {_structure_counts(verdict)}"
                + (
                    f" ({len(checks)} check(s) named; gate.json beside each report.json)"
                    if (checks := verdict.entries())
                    else ""
                )
            ]
            self._lines += [f"  {line}" for line in named[:GATE_LINES]]
            if len(named) > GATE_LINES:
                self._lines.append(f"  and {len(named) - GATE_LINES} more: gate.json and report.html name every one")
            if not verdict.ok:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._lines += reason_lines(self.records)
        self._lines.append(closing_line(self.records, verdict is not None and not verdict.ok))

    @pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_sessionfinish")
    def pytest_sessionfinish_last(self, session: pytest.Session):
        """The conformance lines after everything pytest prints at the end (its short failure list and its
        counts line, which its terminal reporter writes when the session finishes), so a run's terminal ends
        with the per-SoC and gate lines and the closing counts: the outermost wrapper's end comes last. (A
        second implementation of the hook on this plugin: pytest takes only pytest_* names, hence specname.)"""
        try:
            return (yield)
        finally:
            self.write_summary(session.config.pluginmanager.get_plugin("terminalreporter"))

    def write_summary(self, terminal) -> None:
        """The conformance block on pytest's terminal reporter (None: -p no:terminal, then on stderr)."""
        lines = (self._lines or self._notes) + self._printed_records
        if not lines:
            return
        try:
            if terminal is None:
                raise ValueError("no terminal reporter")
            terminal.section(SECTION)
            for line in lines:
                terminal.write_line(line)
        except (OSError, ValueError):  # no terminal, or one that cannot take them: the exit code still tells
            for line in lines:
                say(f"qnnsuite: {line}")


def run_selection(options: RunOptions, config: pytest.Config | None) -> Selection:
    """What narrowed the run's cases (-k, -m, --soc, --dtype), as the gate and report.json say it; empty
    for the whole matrix. A shard is said apart (environment.shard). The options' defaults stand for what a
    caller without them (a plugin test's options, a session without its config) did not narrow."""
    said = []
    for flag, name in (("-k", "keyword"), ("-m", "markexpr")):
        if value := (config.getoption(name, "") if config is not None else ""):
            said.append(f"{flag} {value}")
    dtypes = frozenset(getattr(options, "dtypes", DTYPES))
    return Selection(
        frozenset(getattr(options, "soc_filter", ())),
        frozenset() if dtypes == set(DTYPES) else dtypes,
        " ".join(said),
    )


def _perf_counts(verdict: GateResult) -> str:
    """e.g. `2 PASS, 1 FAIL (reported; --perf-gate fails on it)`: the performance gate in the gate's line."""
    return _counts(verdict.performance, verdict.perf_fails_gate, "no case timed in both runs")


def _structure_counts(verdict: GateResult) -> str:
    """e.g. `3 PASS, 1 FAIL`: the structural gate in the gate's line."""
    return _counts(verdict.structure, verdict.perf_fails_gate, "no case with structural facts in both runs")


def _counts(verdicts: tuple, fails_gate: bool, nothing: str) -> str:
    counts = {name: sum(v.verdict == name for v in verdicts) for name in (PASS, WARN, FAIL)}
    said = ", ".join(f"{n} {name}" for name, n in counts.items() if n) or nothing
    if counts[FAIL] and not fails_gate:
        said += " (reported; --perf-gate fails on it)"
    return said


def nothing_judged_lines(skipped: collections.Counter[str]) -> list[str]:
    """Why a run wrote no report: no check was judged (a selection of cells the matrix cannot run, or of no
    cell at all); the distinct skip reasons, so the fix is on the terminal rather than an absent report."""
    if not skipped:
        return []
    lines = [f"no check was judged, so no report was written: {sum(skipped.values())} check(s) skipped:"]
    lines += [f"  {count} x {reason}" for reason, count in skipped.most_common(REASON_LINES)]
    if len(skipped) > REASON_LINES:
        lines.append(f"  and {len(skipped) - REASON_LINES} more reason(s) (pytest -rs lists each)")
    return lines


def reason_lines(records: list[CheckRecord]) -> list[str]:
    """Why checks were not measured or met an infrastructure error, one line per distinct reason with its count
    and an example (at most REASON_LINES each): pytest's -r list does not name a not-measured check, and a
    device that dropped names itself once here rather than once per check."""
    last = {(r.soc, r.case_id, r.check): r for r in records}
    lines = []
    for verdict in (verdict for verdict in Verdict if verdict.apart):
        by_reason: dict[str, list[CheckRecord]] = {}
        for record in last.values():
            if record.verdict == verdict:
                by_reason.setdefault(
                    clip(record.message.splitlines()[0] if record.message else "(no message)"), []
                ).append(record)
        for reason, same in sorted(by_reason.items(), key=lambda item: -len(item[1]))[:REASON_LINES]:
            lines.append(f"  {verdict.spoken}: {len(same)} check(s), e.g. {same[0].case_id} {same[0].check}: {reason}")
        if len(by_reason) > REASON_LINES:
            lines.append(f"  {verdict.spoken}: {len(by_reason) - REASON_LINES} more reason(s) in report.html")
    return lines


def closing_line(records: list[CheckRecord], gate_failed: bool = False) -> str:
    """The run's last line: every verdict's count over all SoCs, the two that are not executorch's by name
    (pytest's own line counts a not-measured check apart too, see pytest_report_teststatus), and whether the gate
    failed."""
    counts = tally(records)
    shown = ", ".join(
        f"{counts[verdict]} {verdict.spoken}"
        for verdict in Verdict
        if counts[verdict] or verdict.always_counted or verdict.apart
    )
    socs = len({record.soc for record in records})
    return f"conformance: {shown} ({counts['total']} checks on {socs} SoC(s))" + (
        "; gate FAILED" if gate_failed else ""
    )
