"""End to end on an emulated device: a two-method card whose decode reads the cache its
prefill wrote passes cross_method_state where the state crosses methods (the device's compiled runner runs
the plan in one process), and fails with the check's own signature when the runner reloads the program
between steps (the device's fault switch runner_reload_each_line: one runner process per step).

The device is a real emulated device (adb protocol, jail), reached through adbutils and the run's own adb
server; the program is a real lowering on the HTP simulator (skip_mutable_buffer=True, fp16: the mode where
executorch carries the cache across methods, docs/FINDINGS.md#F15 for the other).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import multi_method  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure
from harness.checks import cross_method
from harness.device.execute import DeviceRunRequest, run_case
from harness.device.payload import SUITE_RUNNER_NAME
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.lower import lower_case
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4
CARD = "fixtures.multi_method:mm_prefill_decode"


@pytest.fixture(scope="module")
def lowered(toolchain, tmp_path_factory) -> CaseOutcome:
    card = cards.find(CARD)
    case = Case(card, "fp16", Mode.SKIP, "SM8650")
    artifact = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)
    assert artifact.ok, artifact.failure
    steps = card.steps(STEPS)
    return CaseOutcome(case, steps, artifact, eager.run_steps(card, steps), device_kind="emulated")


def _judged(outcome: CaseOutcome, device_and_workspace, folder: Path) -> dict:
    device, workspace = device_and_workspace
    methods = outcome.case.card.step_methods(len(outcome.steps))
    request = DeviceRunRequest(
        folder.name, outcome.artifact.pte, outcome.steps, folder, output_count=1, methods=methods
    )
    run = run_case(device, workspace, request)
    assert run.runner == SUITE_RUNNER_NAME and len(run.step_times_us) == STEPS
    judged = CaseOutcome(
        outcome.case, outcome.steps, outcome.artifact, outcome.reference, device_kind="emulated", run=run
    )
    return cross_method.check_cross_method_state(judged)


def test_decode_reads_what_prefill_wrote_on_the_device(lowered, device_and_workspace, tmp_path):
    assert _judged(lowered, device_and_workspace, tmp_path / "healthy")["plan"][:2] == ["prefill", "decode"]


def test_a_runner_reloading_between_steps_fails_with_the_checks_signature(
    lowered, device_and_workspace, fleet, tmp_path
):
    serial = fleet.devices[0].serial
    fleet.set_faults(serial, runner_reload_each_line=True)
    try:
        with pytest.raises(CheckFailure) as failure:
            _judged(lowered, device_and_workspace, tmp_path / "reload")
    finally:
        fleet.set_faults(serial, runner_reload_each_line=None)
    assert failure.value.signature == "state_reset_between_steps", str(failure.value)
