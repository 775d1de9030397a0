"""F19 on a real device run: an online-prepared program lowered by the suite and run by the suite's compiled
runner on an emulated device crashes at load, and the failure the suite reports (the runner's signal and
log, as retry.py hands it to the checks) is the one the manifest expects; a runner crash of another cause
(the emulated device's fault switch runner_crash, docs/FAULTS.md row 16) on the same test is not."""

from __future__ import annotations

import pytest

import harness.checks  # noqa: F401  (registers the checks' signatures, which the manifest is checked against)
from fixtures import online_prepare  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure
from harness.device.execute import RunnerFailed, run_case
from harness.known_failures import matching
from harness.pipeline import card as cards
from harness.pipeline.lower import lower_case
from harness.tests.emulator import test_suite_runner_device as emulated
from harness.verdicts import decide
from harness.vocabulary import Case, Mode, Verdict

pytestmark = pytest.mark.qnn
CARD = "fixtures.online_prepare:online_prepare_kv_write"
TEST = "test_state[online_prepare_kv_write-fp16-delegate_mutbuf-SM8650]"
# The emulated device's fixtures (one SM8650, its payload, its fault switches, an offline-prepared program).
fleet, device, workspace, faults, lowered = (
    emulated.fleet,
    emulated.device,
    emulated.workspace,
    emulated.faults,
    emulated.lowered,
)


def _failure_of(run) -> CheckFailure:
    """The device run's failure as the checks raise it (retry.py keeps str(RunnerFailed) as the run error)."""
    with pytest.raises(RunnerFailed) as failed:
        run()
    return CheckFailure(str(failed.value), signature="not_run")


def test_loading_an_online_prepared_program_crashes_as_the_manifest_expects(toolchain, device, workspace, tmp_path):
    case = Case(cards.find(CARD), "fp16", Mode.DELEGATE, "SM8650")
    program = lower_case(case, toolchain, tmp_path / "lowered", emulated.STEPS)
    assert program.ok, program.failure
    steps = case.card.steps(emulated.STEPS)
    failure = _failure_of(
        lambda: run_case(device, workspace, "online", program.pte, steps, tmp_path / "online", output_count=1)
    )
    assert "crashed with signal 11 SIGSEGV" in str(failure), str(failure)
    assert decide(failure, matching(TEST), TEST)[0] is Verdict.XFAILED


def test_a_fault_switch_crash_on_the_same_test_stays_a_failure(device, workspace, lowered, tmp_path, faults):
    faults(runner_crash=True)
    failure = _failure_of(lambda: emulated._run(device, workspace, lowered, tmp_path, "crash"))
    assert "crashed with signal 11 SIGSEGV" in str(failure), str(failure)
    assert decide(failure, matching(TEST), TEST)[0] is Verdict.FAILED
