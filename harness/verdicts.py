"""A check's verdict, decided once, in this module, on the worker that ran it:
outcome -> check -> known-failures manifest -> verdict -> record.

run_check (harness/fixtures.py) hands judge() the case's shared outcome and the manifest entries that name
the test; judge() runs the check, applies the entries (a failure with the expected signature is xfailed; a
pass where one was expected is a strict XPASS failure), words the failure as one line and returns a
Judgement with the CheckRecord. run_check then asks the bundle writer for the case's reproduction bundle and
raises what pytest must see. The report hook (harness/plugin.py) only calls settle(), which words pytest's
report as the judgement says and puts the record in its user_properties, where the controller's reporter finds
it (harness/reporter.py), as junitxml's properties travel on reports (xdist forwards them from its workers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from harness import known_failures
from harness.check_registry import (
    WORDED_BY_THE_SUITE,
    CheckFailure,
    CheckSpec,
    InfrastructureError,
    NotApplicable,
    raised_verdict,
)
from harness.device.device import DeviceError
from harness.known_failures import KnownFailure
from harness.outcome import CaseOutcome
from harness.record import CheckRecord, finding_in, record_property
from harness.vocabulary import Case, Verdict

EXPECTED = pytest.StashKey[list[KnownFailure]]()
HINTS = pytest.StashKey[Path]()  # the manifest whose signature hints a failure no entry expects is matched with


@dataclass(frozen=True)
class Judgement:
    """A check's verdict and record, and what pytest must be told (raised) and show (report_line)."""

    record: CheckRecord  # duration_s is the report's, filled in by settle()
    signature: str  # the failure's signature, or the expecting entry's (for the reproduction bundle)
    known: KnownFailure | None  # the entry that explains the failure, or expected the pass that happened
    report_line: str | None  # what pytest's report says instead of its own words (None: its own)
    error: BaseException | None = None  # what the check raised

    def exception(self) -> BaseException | None:
        """What run_check raises for pytest: a skip for a check that does not apply, the verdicts the suite
        words without their traceback (pytest would format it only to be thrown away), anything else as it is."""
        error = self.error
        if isinstance(error, NotApplicable):
            return pytest.skip.Exception(str(error))
        if isinstance(error, WORDED_BY_THE_SUITE):
            return error.with_traceback(None)
        return error


JUDGEMENT = pytest.StashKey[Judgement]()


def expect_known_failures(items: list[pytest.Item], manifest: Path) -> None:
    """Attach to each collected item the manifest entries that name it (ValueError on a bad manifest)."""
    for item in items:
        item.stash[EXPECTED] = known_failures.matching(item.name, path=manifest)
        item.stash[HINTS] = manifest
    known_failures.hints(manifest)  # a manifest whose hints cannot be used fails here, once, not at each check


def judge(
    spec: CheckSpec,
    case: Case,
    outcome: CaseOutcome,
    expected: list[KnownFailure],
    nodeid: str,
    words: Callable[[BaseException], str],
    manifest: Path = known_failures.MANIFEST,
) -> Judgement:
    """Run the check on the outcome and decide its verdict. words: pytest's own words for an exception the
    suite does not word (a harness bug), whose last line is the record's message; manifest: whose signature
    hints a failure that no entry expects is matched with (it stays failed, its message says which finding's
    signature it matches)."""
    started = time.perf_counter()
    evidence, error, failure_line = {}, None, ""
    try:
        evidence = spec.function(outcome)
    except (Exception, pytest.skip.Exception) as raised:
        error = raised
        if isinstance(raised, InfrastructureError):  # the device's line (quarantined, lost) is the record's message
            failure_line = str(raised)
        elif isinstance(raised, AssertionError):
            line, _, detail = str(raised).partition("\n")
            evidence = {**getattr(raised, "evidence", {}), **({"detail": detail} if detail else {})}
            failure_line = line
            if isinstance(raised, CheckFailure) and not spec.declares(raised.signature):
                failure_line = (
                    f"{line} [check {spec.name} raised signature {raised.signature!r}, which its "
                    f"@check declaration does not list: add it to signatures=]"
                )
    check_s = round(time.perf_counter() - started, 4)
    verdict, report_line, entry = decide(error, expected, nodeid)
    hint = known_failures.hint_for(spec.name, case.mode.value, error, manifest) if verdict is Verdict.FAILED else ""
    if hint and failure_line:
        failure_line, evidence = f"{hint}: {failure_line}", {**evidence, "matches_signature_of": hint}
        report_line = f"{nodeid}: {hint}: {report_line.removeprefix(f'{nodeid}: ')}" if report_line else None
    if failure_line and verdict is not Verdict.XPASSED:
        message = failure_line
    elif report_line is not None:
        message = report_line
    elif isinstance(error, (NotApplicable, pytest.skip.Exception)):
        message = f"Skipped: {error}"  # as pytest's skip report says it
    else:
        message = words(error) if error is not None else ""
    known = entry.describe() if entry is not None and verdict in (Verdict.XFAILED, Verdict.XPASSED) else ""
    signature = error.signature if isinstance(error, CheckFailure) else (entry.signature if entry else "")
    record = CheckRecord(
        nodeid=nodeid,
        check=spec.name,
        case_id=case.id,
        card=case.card.name,
        tags=tuple(sorted(case.card.tags)),
        dtype=case.dtype,
        mode=case.mode.value,
        soc=case.soc,
        verdict=verdict,
        message=_last_line(message),
        known_failure=known,
        evidence=evidence,
        device_serial=outcome.device_serial,
        delegates=outcome.artifact.delegate_count,
        retries=outcome.retries,
        cached_lowering=outcome.artifact.cached,
        work=outcome.artifact.work,
        timings_s={**outcome.timings_s, "lower_wall": round(outcome.artifact.wall_s, 3)},
        timing=outcome.timing,
        structure=outcome.structure,
        check_s=check_s,
        signature=signature if verdict in (Verdict.FAILED, Verdict.XFAILED, Verdict.XPASSED) else "",
        finding=finding_in(entry.reference) if known else "",
    )
    return Judgement(record, signature, entry, report_line, error)


def decide(
    failure: BaseException | None, expected: list[KnownFailure], nodeid: str
) -> tuple[Verdict, str | None, KnownFailure | None]:
    """The verdict of a test that raised failure (None: it passed), the line its report shows instead of
    pytest's words (None: pytest's), and the manifest entry that explains it or expected a failure."""
    raised = Verdict.SKIPPED if isinstance(failure, pytest.skip.Exception) else raised_verdict(failure)
    if raised is Verdict.NOT_MEASURED:
        # Its own verdict, never a plain skip: pytest counts it with the skips, the reports apart.
        return Verdict.NOT_MEASURED, f"not measured: {failure}", None
    if raised is Verdict.INFRA_ERROR:
        # The device or the lab failed: no known failure can explain it, and it is no conformance verdict.
        return Verdict.INFRA_ERROR, f"{nodeid}: infrastructure error: {failure}", None
    if raised is Verdict.PASSED:
        if expected and not all(entry.flaky for entry in expected):
            line = f"[XPASS(strict)] {expected[0].describe()}: it passes now; update the known-failures manifest"
            return Verdict.XPASSED, line, expected[0]
        return Verdict.PASSED, None, None
    if raised is Verdict.SKIPPED:
        return Verdict.SKIPPED, None, None
    explaining = next((entry for entry in expected if entry.explains(failure)), None)
    if explaining is not None:
        return Verdict.XFAILED, None, explaining
    if isinstance(failure, CheckFailure):
        hint = (
            f"; the known failure expected here is {', '.join(entry.signature for entry in expected)}"
            if expected
            else ""
        )
        return Verdict.FAILED, f"{nodeid}: {failure} [signature: {failure.signature}{hint}]", None
    if isinstance(failure, DeviceError):
        return Verdict.FAILED, f"{nodeid}: {failure}", None
    return Verdict.FAILED, None, None


def settle(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    """Word pytest's report of any phase as its verdict says; a judged check's report (its call phase)
    also carries the check's record."""
    judgement = item.stash.get(JUDGEMENT, None) if call.when == "call" else None
    if judgement is not None:
        verdict, line, entry = judgement.record.verdict, judgement.report_line, judgement.known
    else:  # a fixture's failure, or a call that failed before its check ran: no record, only words
        failure = call.excinfo.value if call.excinfo is not None else None
        expected = item.stash.get(EXPECTED, []) if call.when == "call" else []
        verdict, line, entry = decide(failure, expected, item.nodeid)
        if failure is None or isinstance(failure, (NotApplicable, pytest.skip.Exception)):
            return  # a phase that passed (a set-up, a teardown) or was skipped keeps pytest's report
    if verdict is Verdict.NOT_MEASURED:
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, line)
    elif verdict is Verdict.XFAILED:
        report.outcome, report.wasxfail = "skipped", entry.describe()
    elif verdict is Verdict.XPASSED:
        report.outcome, report.longrepr = "failed", line
    elif line is not None:
        report.longrepr = line
    if judgement is not None:
        report.user_properties.append(record_property(replace(judgement.record, duration_s=round(report.duration, 3))))


def _last_line(message: str) -> str:
    return message.strip().splitlines()[-1] if message.strip() else ""
