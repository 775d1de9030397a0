"""The one verdict path (harness/verdicts.py): each way a check can end, with and without a manifest entry
that names it, gives the verdict, one-line message and record the reports have always shown; and the
verdicts travel as the strings report.json has always held. No device, no lowering: a stand-in outcome."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest

from harness.check_registry import CheckFailure, CheckSpec, InfrastructureError, NotApplicable, NotMeasured
from harness.device.device import DeviceError
from harness.known_failures import KnownFailure
from harness.record import CheckRecord, carried_record
from harness.verdicts import EXPECTED, JUDGEMENT, decide, judge, settle
from harness.vocabulary import VERDICTS, Case, Mode, ModelCard, Verdict, VerdictMeaning

CARD = ModelCard(
    name="made_up",
    build=lambda: None,
    steps=lambda n: [],
    mutated_buffers=("state",),
    tags=frozenset({"b", "a"}),
    module=__name__,
)
CASE = Case(CARD, "fp16", Mode.DELEGATE, "SM8650")
NODEID = "suites/test_state.py::test_state[made_up-fp16-delegate_mutbuf-SM8650]"
OUTCOME = SimpleNamespace(
    device_serial="host:5037/S",
    retries=1,
    timings_s={"run": 0.5},
    timing={"runner": "suite_runner", "steps_us": [9, 4], "first_step_us": 9, "peak_rss_kb": 64000},
    structure=None,
    artifact=SimpleNamespace(delegate_count=1, cached=True, work={"lower": 0}, wall_s=1.23456),
)
STATE_MISMATCH = KnownFailure(pattern="test_state[*]", signature="state_mismatch", reason="made up", reference="F9")
ADDRESS = KnownFailure(pattern="test_state[*]", signature="split_address", reason="another")
FLAKY = KnownFailure(pattern="test_state[*]", signature="state_mismatch", reason="made up", flaky=True)


def _spec(raises: BaseException | None = None, evidence: dict | None = None) -> CheckSpec:
    def function(outcome) -> dict:
        if raises is not None:
            raise raises
        return evidence or {}

    return CheckSpec("state", function, "state", True, ("state_mismatch", "split_address"))


def _judge(raises: BaseException | None = None, expected: tuple = (), evidence: dict | None = None):
    return judge(
        _spec(raises, evidence),
        CASE,
        OUTCOME,
        list(expected),
        NODEID,
        words=lambda error: f"harness/checks.py:1: {type(error).__name__}",
    )


def test_a_pass_is_passed_and_the_record_carries_the_case():
    judgement = _judge(evidence={"max": 0.0})
    record = judgement.record
    assert (record.verdict, record.message, record.known_failure, judgement.exception()) == (
        Verdict.PASSED,
        "",
        "",
        None,
    )
    assert record.evidence == {"max": 0.0} and record.tags == ("a", "b") and record.mode == "delegate_mutbuf"
    assert record.timings_s == {"run": 0.5, "lower_wall": 1.235} and record.retries == 1 and record.cached_lowering
    assert record.timing == OUTCOME.timing


def test_a_pass_where_a_failure_is_expected_is_a_strict_xpass_unless_every_entry_is_flaky():
    judgement = _judge(expected=(STATE_MISMATCH,))
    assert judgement.record.verdict is Verdict.XPASSED
    assert (
        judgement.record.message
        == judgement.report_line
        == (f"[XPASS(strict)] {STATE_MISMATCH.describe()}: it passes now; update the known-failures manifest")
    )
    assert judgement.record.known_failure == STATE_MISMATCH.describe() and judgement.signature == "state_mismatch"
    assert _judge(expected=(FLAKY,)).record.verdict is Verdict.PASSED


def test_the_expected_signature_is_xfailed_another_is_failed_with_a_hint():
    failure = CheckFailure("state differs from eager\nstep 0: 3 elements", {"max": 2.0}, "state_mismatch")
    xfailed = _judge(failure, expected=(STATE_MISMATCH,))
    assert xfailed.record.verdict is Verdict.XFAILED and xfailed.known is STATE_MISMATCH
    assert xfailed.record.message == "state differs from eager" and xfailed.report_line is None
    assert xfailed.record.evidence == {"max": 2.0, "detail": "step 0: 3 elements"}
    assert xfailed.record.known_failure == STATE_MISMATCH.describe()
    failed = _judge(failure, expected=(ADDRESS,))
    assert failed.record.verdict is Verdict.FAILED and failed.record.known_failure == "" and failed.known is None
    assert failed.report_line == (
        f"{NODEID}: state differs from eager\nstep 0: 3 elements [signature: state_mismatch; "
        f"the known failure expected here is split_address]"
    )
    assert isinstance(failed.exception(), CheckFailure) and failed.exception().__traceback__ is None


def test_an_undeclared_signature_is_named_in_the_message():
    judgement = _judge(CheckFailure("odd", signature="made_up_signature"))
    assert judgement.record.verdict is Verdict.FAILED
    assert (
        "raised signature 'made_up_signature', which its @check declaration does not list" in judgement.record.message
    )


def test_a_check_that_does_not_apply_is_skipped_as_pytest_words_a_skip():
    judgement = _judge(NotApplicable("fp16 is not quantized"))
    assert (judgement.record.verdict, judgement.record.message) == (Verdict.SKIPPED, "Skipped: fp16 is not quantized")
    assert isinstance(judgement.exception(), pytest.skip.Exception)


def test_not_measured_and_infrastructure_errors_are_never_expected_failures():
    measured = _judge(NotMeasured("no trace"), expected=(STATE_MISMATCH,))
    assert (measured.record.verdict, measured.record.message, measured.record.known_failure) == (
        Verdict.NOT_MEASURED,
        "not measured: no trace",
        "",
    )
    lost = _judge(InfrastructureError("device S lost\nits last words"), expected=(STATE_MISMATCH,))
    assert (lost.record.verdict, lost.record.message, lost.record.known_failure) == (
        Verdict.INFRA_ERROR,
        "its last words",
        "",
    )
    assert lost.report_line == f"{NODEID}: infrastructure error: device S lost\nits last words"


def test_a_harness_bug_fails_in_pytest_words_with_its_traceback():
    judgement = _judge(KeyError("x"), expected=(STATE_MISMATCH,))
    assert (judgement.record.verdict, judgement.record.message) == (Verdict.FAILED, "harness/checks.py:1: KeyError")
    assert judgement.report_line is None and judgement.exception().__traceback__ is not None
    device = _judge(DeviceError("adb refused"))
    assert (device.record.verdict, device.record.message) == (Verdict.FAILED, f"{NODEID}: adb refused")


def test_a_fixture_failure_is_worded_but_only_a_check_has_a_record():
    assert decide(None, [], NODEID) == (Verdict.PASSED, None, None)
    assert decide(InfrastructureError("quarantined"), [STATE_MISMATCH], NODEID)[0] is Verdict.INFRA_ERROR
    assert decide(RuntimeError("bug"), [], NODEID) == (Verdict.FAILED, None, None)


def test_verdicts_travel_as_the_strings_reports_hold():
    assert VERDICTS == ("passed", "failed", "xpassed", "xfailed", "skipped", "not_measured", "infra_error")
    data = _judge(CheckFailure("x", signature="state_mismatch"), expected=(STATE_MISMATCH,)).record.to_dict()
    assert data["verdict"] == "xfailed" and type(data["verdict"]) is str
    assert CheckRecord.from_dict(data).verdict is Verdict.XFAILED
    with pytest.raises(ValueError):
        CheckRecord.from_dict({**data, "verdict": "made_up"})


def _settled(when: str, failure: BaseException | None, judgement=None, expected: tuple = ()) -> SimpleNamespace:
    """The report pytest made for a phase, after settle() (outcome as pytest decides it from the exception)."""
    item = SimpleNamespace(stash=pytest.Stash(), nodeid=NODEID, path="suites/test_state.py", location=("x", 7, "y"))
    item.stash[EXPECTED] = list(expected)
    if judgement is not None:
        item.stash[JUDGEMENT] = judgement
    outcome = "passed" if failure is None else ("skipped" if isinstance(failure, pytest.skip.Exception) else "failed")
    report = SimpleNamespace(
        outcome=outcome, longrepr="pytest's words" if failure else None, duration=1.23456, user_properties=[]
    )
    settle(item, SimpleNamespace(when=when, excinfo=SimpleNamespace(value=failure) if failure else None), report)
    return report


def test_settle_words_the_report_as_the_judgement_says_and_carries_the_record():
    failure = CheckFailure("state differs", signature="state_mismatch")
    xfailed = _settled("call", failure, _judge(failure, expected=(STATE_MISMATCH,)), (STATE_MISMATCH,))
    assert (xfailed.outcome, xfailed.wasxfail, xfailed.longrepr) == (
        "skipped",
        STATE_MISMATCH.describe(),
        "pytest's words",
    )
    record = carried_record(xfailed.user_properties)
    assert (record["verdict"], record["duration_s"], record["message"]) == ("xfailed", 1.235, "state differs")
    xpassed = _settled("call", None, _judge(expected=(STATE_MISMATCH,)), (STATE_MISMATCH,))
    assert xpassed.outcome == "failed" and xpassed.longrepr.startswith("[XPASS(strict)] known failure [state_mismatch]")
    measured = _settled("call", NotMeasured("no trace"), _judge(NotMeasured("no trace")))
    assert (measured.outcome, measured.longrepr) == ("skipped", ("suites/test_state.py", 7, "not measured: no trace"))
    passed = _settled("call", None, _judge())
    assert (passed.outcome, passed.longrepr, carried_record(passed.user_properties)["verdict"]) == (
        "passed",
        None,
        "passed",
    )


def test_settle_words_a_fixture_failure_without_a_record():
    infra = _settled("setup", InfrastructureError("device quarantined"))
    assert infra.longrepr == f"{NODEID}: infrastructure error: device quarantined" and not infra.user_properties
    bug = _settled("setup", RuntimeError("fixture bug"))
    assert (bug.outcome, bug.longrepr) == ("failed", "pytest's words")
    # a pass where a failure is expected is an XPASS only for a judged check: never a set-up that passed
    assert _settled("setup", None, expected=(STATE_MISMATCH,)).outcome == "passed"


def test_every_verdict_carries_every_meaning_and_the_meanings_agree():
    """Each member holds every field of VerdictMeaning (the renderers and the gate read nothing else), and the
    meanings keep the rules the reports have always shown."""
    for verdict in Verdict:
        for meaning in fields(VerdictMeaning):
            assert isinstance(getattr(verdict, meaning.name), {"str": str, "bool": bool}[meaning.type]), meaning.name
        assert verdict.label and verdict.spoken
        assert not (verdict.passes and verdict.fails), verdict
        assert not (verdict.apart and verdict.measured), verdict  # not about executorch: never a measurement
        assert (verdict.junit == "failure") == verdict.fails_run, verdict
        assert verdict.measured == (verdict.passes or verdict.fails), verdict
    assert [v for v in Verdict if v.bundled] == [Verdict.FAILED, Verdict.XPASSED, Verdict.XFAILED]
    assert [v for v in Verdict if v.apart] == [Verdict.NOT_MEASURED, Verdict.INFRA_ERROR]
    assert len({v.label for v in Verdict}) == len(Verdict), "two verdicts would share a table cell"
    assert Verdict.of("absent") is None and Verdict.of("xfailed") is Verdict.XFAILED
