"""End to end on an emulated device: driven cards pass driver_invariance where the runtime carries the state
(the suite's compiled runner runs a driver's plan in one process, reloading the program where the plan says;
a read-back of the buffers reads their registered values: docs/FINDINGS.md#F16),
and each broken runtime the emulated device's fault switches make fails with its own signature and message:
a prefill that keeps only its first chunk (runner_drop_prefill_chunks), a second prefill that forgets the
conversation (runner_forget_at_turn), a reset that does not reset (runner_ignore_reload).

Real lowerings on the HTP simulator, fp16 with the buffers outside the delegate (skip_mutable_buffer=True: the
mode where executorch carries a cache across methods; docs/FINDINGS.md#F15 for the other), on a real emulated
device through adbutils.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures import drivers as driven_cards  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure
from harness.checks import driving as driver_checks
from harness.device import kinds
from harness.device.execute import DeviceRunRequest, run_case
from harness.device.payload import SUITE_RUNNER_NAME
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, drivers
from harness.pipeline.lower import LoweredArtifact, lower_case
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


def test_a_runtime_that_carries_the_state_passes_a_reset_by_reload(lowerings, device_and_workspace, tmp_path):
    assert _judged(lowerings, device_and_workspace, tmp_path, RELOADED, "reset")["driver"] == "reset"


@pytest.mark.parametrize("driver", ["chunked", "second_prefill"])
def test_every_step_carries_the_state_and_the_read_back_reads_the_registered_values(
    lowerings, device_and_workspace, tmp_path, driver
):
    """Every step of the prefill/decode card agrees with eager driven alike; its read-back (read_cache, which
    only reads the cache) gives the registered zeros: executorch's constant read (docs/FINDINGS.md#F16)."""
    with pytest.raises(CheckFailure) as failure:
        _judged(lowerings, device_and_workspace, tmp_path / driver, PD, driver)
    read_back = drivers.of_case(Case(cards.find(PD), "fp16", Mode.SKIP, "SM8650", driver=driver)).read_backs[0]
    assert failure.value.signature == driver_checks.READ_AS_CONSTANT, str(failure.value)
    assert f"read back after step {read_back - 1}" in str(failure.value)
    assert f"steps 0..{read_back - 1} agree" in str(failure.value)


@pytest.mark.parametrize(
    ("switches", "reference", "driver", "signature", "words"),
    [
        (
            {"runner_drop_prefill_chunks": {"method": "step_4"}},
            PD,
            "chunked",
            "LOST_CHUNK",
            "chunk 2 lost chunk 1's rows",
        ),
        ({"runner_forget_at_turn": {"method": "step_4"}}, PD, "second_prefill", "LOST_TURN", "forgot the conversation"),
        ({"runner_ignore_reload": True}, RELOADED, "reset", "NO_RESET", "did not reset"),
    ],
)
def test_each_broken_runtime_is_caught_with_its_own_signature(
    lowerings, device_and_workspace, faults, tmp_path, switches, reference, driver, signature, words
):
    faults(**switches)
    with pytest.raises(CheckFailure) as failure:
        _judged(lowerings, device_and_workspace, tmp_path / driver, reference, driver)
    assert failure.value.signature == getattr(driver_checks, signature), str(failure.value)
    assert words in str(failure.value)
