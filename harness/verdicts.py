"""A check's final verdict and record, decided once on the worker that ran it.

run_check leaves a CheckDraft on the test item; pytest_runtest_makereport calls settle(), which applies
the known-failures manifest (a failure with the expected signature becomes xfailed; a pass where one was
expected becomes a strict XPASS failure), words failures as one line, has the case's reproduction bundle
written or extended (harness/repro/bundle.py) and attaches the CheckRecord to the test report, where the
controller's reporter finds it (harness/reporter.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import known_failures
from harness.check_registry import CheckFailure, CheckSpec, InfrastructureError, NotMeasured
from harness.device.device import DeviceError
from harness.known_failures import KnownFailure
from harness.record import REPORT_ATTRIBUTE, CheckRecord
from harness.repro.bundle import BundleWriter
from harness.outcome import CaseOutcome
from harness.vocabulary import Case

EXPECTED = pytest.StashKey[list[KnownFailure]]()


@dataclass
class CheckDraft:
    """What run_check learnt, for the report hook to turn into a record."""

    spec: CheckSpec
    case: Case
    outcome: CaseOutcome
    evidence: dict = field(default_factory=dict)
    failure_line: str = ""  # the check's one line (a log tail in its message is evidence)
    check_s: float | None = None  # the comparison alone
    bundles: BundleWriter | None = None  # where the case's reproduction bundle is written (None: no bundles)


DRAFT = pytest.StashKey[CheckDraft]()


def expect_known_failures(items: list[pytest.Item], manifest: Path) -> None:
    """Attach to each collected item the manifest entries that name it (ValueError on a bad manifest)."""
    for item in items:
        item.stash[EXPECTED] = known_failures.matching(item.name, path=manifest)


def settle(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> None:
    """Rewrite the report by the manifest and attach the check's record (call phase, or a failed set-up)."""
    failure = call.excinfo.value if call.excinfo is not None else None
    verdict, known = report.outcome, ""
    expected = item.stash.get(EXPECTED, []) if call.when == "call" else []
    explaining = next((entry for entry in expected if failure is not None and entry.explains(failure)), None)
    if isinstance(failure, NotMeasured):
        # Its own verdict, never a plain skip: pytest counts it with the skips, the reports apart.
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, f"not measured: {failure}")
        verdict, explaining = "not_measured", None
    elif isinstance(failure, InfrastructureError):
        # The device or the lab failed: no known failure can explain it, and it is no conformance verdict.
        report.longrepr = f"{item.nodeid}: infrastructure error: {failure}"
        verdict, explaining = "infra_error", None
    elif report.failed and explaining is not None:
        report.outcome, report.wasxfail = "skipped", explaining.describe()
        verdict, known = "xfailed", explaining.describe()
    elif report.passed and expected and not all(entry.flaky for entry in expected):
        known = expected[0].describe()
        report.outcome = "failed"
        report.longrepr = f"[XPASS(strict)] {known}: it passes now; update the known-failures manifest"
        verdict = "xpassed"
    elif report.failed and isinstance(failure, CheckFailure):
        hint = (f"; the known failure expected here is {', '.join(entry.signature for entry in expected)}"
                if expected else "")
        report.longrepr = f"{item.nodeid}: {failure} [signature: {failure.signature}{hint}]"
    elif report.failed and isinstance(failure, DeviceError):
        report.longrepr = f"{item.nodeid}: {failure}"
    draft = item.stash.get(DRAFT, None)
    if draft is None or not (call.when == "call" or (call.when == "setup" and not report.passed)):
        return
    record = _record(item, report, draft, verdict, known)
    if draft.bundles is not None:
        entry = explaining or (expected[0] if verdict == "xpassed" else None)
        signature = failure.signature if isinstance(failure, CheckFailure) else (entry.signature if entry else "")
        record = draft.bundles.add(record, outcome=draft.outcome, signature=signature, known=entry)
    setattr(report, REPORT_ATTRIBUTE, record.to_dict())


def _message(report: pytest.TestReport, draft: CheckDraft, verdict: str) -> str:
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else (str(longrepr) if longrepr else "")
    if draft.failure_line and verdict != "xpassed":
        message = draft.failure_line
    return message.strip().splitlines()[-1] if message.strip() else ""


def _record(item: pytest.Item, report: pytest.TestReport, draft: CheckDraft, verdict: str, known: str) -> CheckRecord:
    case, outcome = draft.case, draft.outcome
    return CheckRecord(
        nodeid=item.nodeid, check=draft.spec.name, case_id=case.id, card=case.card.name, tags=tuple(sorted(case.card.tags)),
        dtype=case.dtype, mode=case.mode.value, soc=case.soc, verdict=verdict, message=_message(report, draft, verdict),
        known_failure=known, evidence=draft.evidence, device_serial=outcome.device_serial,
        delegates=outcome.artifact.delegate_count, retries=outcome.retries, cached_lowering=outcome.artifact.cached,
        work=outcome.artifact.work,
        timings_s={**outcome.timings_s, "lower_wall": round(outcome.artifact.wall_s, 3)},
        duration_s=round(report.duration, 3), check_s=draft.check_s)
