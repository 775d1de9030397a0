"""End to end on an emulated device: driven cards pass driver_invariance where the runtime carries the state
(the suite's compiled runner runs a driver's plan in one process, reloading the program where the plan says),
and each broken runtime the emulated device's fault switches make fails with its own signature and message:
a prefill that keeps only its first chunk (runner_drop_prefill_chunks), a second prefill that forgets the
conversation (runner_forget_at_turn), a reset that does not reset (runner_ignore_reload).

Real lowerings on the HTP simulator, fp16 with the buffers outside the delegate (skip_mutable_buffer=True: the
mode where executorch carries a cache across methods; docs/FINDINGS.md#F15 for the other), on a real emulated
device through adbutils.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures import drivers as driven_cards  # noqa: F401  (registers the cards)
from harness import driver_checks
from harness.check_registry import CheckFailure
from harness.device import kinds
from harness.device.adb import AdbClient
from harness.device.device import Device
from harness.device.execute import DeviceRunRequest, Workspace, prepare_workspace, run_case
from harness.device.payload import RUNNER_COMMANDS, SUITE_RUNNER_NAME
from harness.emulator.launcher import EmulatorFleet
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, drivers
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4
PD, RELOADED = "fixtures.drivers:drv_prefill_decode_kv", "fixtures.drivers:drv_reloaded_counter"


@pytest.fixture(scope="module")
def lowerings(toolchain, tmp_path_factory) -> dict[str, LoweredArtifact]:
    made = {}
    for reference in (PD, RELOADED):
        case = Case(cards.find(reference), "fp16", Mode.SKIP, "SM8650")
        made[reference] = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)
        assert made[reference].ok, made[reference].failure
    return made


@pytest.fixture(scope="module")
def fleet(toolchain, tmp_path_factory) -> Iterator[EmulatorFleet]:
    device_env = {**kinds.EmulatedKind.heap_environment(toolchain.child_env()), "QNNSUITE_PYTHON": sys.executable}
    with EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("fleet"), device_env=device_env) as started:
        yield started


@pytest.fixture(scope="module")
def device_and_workspace(fleet) -> tuple[Device, Workspace]:
    device = Device(fleet.devices[0].serial, AdbClient(server=fleet.server))
    payload = device.workspace("payload")
    files = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(QnnSdk(Path("/nonexistent"), WHEEL_ORIGIN)))
    prepare_workspace(device, payload, files)
    runners = tuple(item.remote_name for item in files if item.remote_name in RUNNER_COMMANDS)
    assert SUITE_RUNNER_NAME in runners, kinds.emulated_suite_runner()[1]
    return device, Workspace(device.workspace("cases"), payload, runners=runners)


def _judged(lowerings, device_and_workspace, folder: Path, reference: str, driver: str, **faults) -> dict:
    """The driver's plan run on the device (with the fault switches given, reset after) and judged."""
    device, workspace = device_and_workspace
    case = Case(cards.find(reference), "fp16", Mode.SKIP, "SM8650", driver=driver)
    plan = drivers.of_case(case)
    steps, reference_outputs = plan.inputs(case.card.drive), drivers.run_eager(case.card, plan)
    request = DeviceRunRequest(
        folder.name,
        lowerings[reference].pte,
        steps,
        folder,
        output_count=1,
        methods=plan.methods,
        reloads=plan.reloads,
    )
    run = run_case(device, workspace, request)
    assert run.runner == SUITE_RUNNER_NAME and len(run.step_times_us) == len(steps)
    judged = CaseOutcome(
        case,
        steps,
        lowerings[reference],
        reference_outputs,
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=run,
    )
    return driver_checks.check_driver_invariance(judged)


@pytest.fixture
def faults(fleet) -> Iterator:
    serial, set_now = fleet.devices[0].serial, []

    def switch(**switches) -> None:
        fleet.set_faults(serial, **switches)
        set_now.extend(switches)

    yield switch
    fleet.set_faults(serial, **dict.fromkeys(set_now))


@pytest.mark.parametrize(("reference", "driver"), [(PD, "chunked"), (PD, "second_prefill"), (RELOADED, "reset")])
def test_a_runtime_that_carries_the_state_passes_every_driver(
    lowerings, device_and_workspace, tmp_path, reference, driver
):
    assert _judged(lowerings, device_and_workspace, tmp_path / driver, reference, driver)["driver"] == driver


def test_a_prefill_that_keeps_only_its_first_chunk(lowerings, device_and_workspace, faults, tmp_path):
    faults(runner_drop_prefill_chunks={"method": "step_4"})
    with pytest.raises(CheckFailure) as failure:
        _judged(lowerings, device_and_workspace, tmp_path / "chunks", PD, "chunked")
    assert failure.value.signature == driver_checks.LOST_CHUNK, str(failure.value)
    assert "chunk 2 lost chunk 1's rows" in str(failure.value)


def test_a_second_prefill_that_forgets_the_conversation(lowerings, device_and_workspace, faults, tmp_path):
    faults(runner_forget_at_turn={"method": "step_4"})
    with pytest.raises(CheckFailure) as failure:
        _judged(lowerings, device_and_workspace, tmp_path / "turn", PD, "second_prefill")
    assert failure.value.signature == driver_checks.LOST_TURN, str(failure.value)
    assert "forgot the conversation" in str(failure.value)


def test_a_reset_that_does_not_reset(lowerings, device_and_workspace, faults, tmp_path):
    faults(runner_ignore_reload=True)
    with pytest.raises(CheckFailure) as failure:
        _judged(lowerings, device_and_workspace, tmp_path / "reset", RELOADED, "reset")
    assert failure.value.signature == driver_checks.NO_RESET, str(failure.value)
    assert "did not reset" in str(failure.value)
