"""A case's device runs are decided once, as data (harness/case_store.py CaseRuns of DeviceRunRequest), and
all made before any check judges the case: the run, its --perf-repeats, and the run through the reference
runner a check compares with (runner_parity), whose result is the outcome's reference_run. Notes of a run
that stopped short go in their own outcome field, never in the device log. The device layer is a recorder
here: these tests are about the requests, not about a device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness import case_store as store_module
from harness.case_store import CaseStore
from harness.checks import runner_parity
from harness.device.execute import DeviceRun, DeviceRunRequest
from harness.device.retry import Attempt
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import LoweringFacts
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import Case, Mode

STEPS = 3


class RecordingPool:
    """Stands in for the device layer (retry.run_with_reconnects): records each request, answers each with
    eager's outputs through the runner asked for, or fails the names in `failing`."""

    def __init__(self, reference: list[list[np.ndarray]], failing: tuple[str, ...] = ()) -> None:
        self.reference, self.failing = reference, failing
        self.requests: list[DeviceRunRequest] = []

    def __call__(self, pool: object, request: DeviceRunRequest, holder: str) -> Attempt:
        self.requests.append(request)
        if request.name in self.failing:
            return Attempt(error=f"runner on emu-1 exited 1 ({request.name})", device_serial="emu-1")
        raw = [[np.ascontiguousarray(a).view(np.uint8).ravel().copy() for a in row] for row in self.reference]
        run = DeviceRun(raw, [], None, "", runner=request.runner, step_times_us=[5] * len(request.steps))
        return Attempt(run=run, device_serial="emu-1", device_kind="emulated", timings_s={"device_total": 0.5})


def _outcome(tmp_path: Path) -> CaseOutcome:
    card = cards.find("fixtures.zoo:kv_gather_written")
    case = Case(card, "fp16", Mode.DELEGATE, "SM8650")
    steps = card.steps(STEPS)
    (tmp_path / "lowered").mkdir()
    (tmp_path / "lowered" / "model.pte").write_bytes(b"")
    artifact = LoweredArtifact(case, tmp_path / "lowered", LoweringFacts(), "", 0.0)
    return CaseOutcome(case, steps, artifact, eager.run_steps(card, steps))


def _store(tmp_path: Path, reference_runner=None, perf_repeats: int = 1) -> CaseStore:
    return CaseStore(
        None,
        object(),  # a pool: never touched, the recorder stands in for the device layer
        tmp_path / "work",
        "gw0",
        lambda tags: STEPS,
        60.0,
        None,
        None,
        perf_repeats=perf_repeats,
        reference_runner=lambda case: reference_runner,
    )


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    def install(outcome: CaseOutcome, failing: tuple[str, ...] = ()) -> RecordingPool:
        pool = RecordingPool(outcome.reference, failing)
        monkeypatch.setattr(store_module, "run_with_reconnects", pool)
        return pool

    return install


def test_a_parity_case_is_run_through_the_reference_runner_before_judging(tmp_path, recorder):
    outcome = _outcome(tmp_path)
    pool = recorder(outcome)
    _store(tmp_path, runner_parity.REFERENCE_RUNNER)._run(outcome)
    run, reference = pool.requests
    assert (run.runner, reference.runner) == (runner_parity.COMPILED_RUNNER, runner_parity.REFERENCE_RUNNER)
    assert (
        reference.name == f"{run.name}.{runner_parity.REFERENCE_RUNNER}" and reference.local_dir.name == reference.name
    )
    # the same program, inputs, outputs and plan: only the runner and the folder differ
    assert (reference.program, reference.steps, reference.output_bytes, reference.soc) == (
        run.program,
        run.steps,
        run.output_bytes,
        "SM8650",
    )
    assert outcome.reference_run is not None and outcome.reference_run.device_serial == "emu-1"
    assert runner_parity.check_runner_parity(outcome)["differences"] == []  # judged from the outcome alone
    assert len(pool.requests) == 2, "judging ran nothing more"


def test_a_case_without_a_parity_check_gets_no_reference_run(tmp_path, recorder):
    outcome = _outcome(tmp_path)
    pool = recorder(outcome)
    _store(tmp_path)._run(outcome)
    assert [request.runner for request in pool.requests] == [runner_parity.COMPILED_RUNNER]
    assert outcome.reference_run is None


def test_a_failed_run_gets_no_other_runs(tmp_path, recorder):
    outcome = _outcome(tmp_path)
    pool = recorder(outcome, failing=(outcome.case.id,))
    _store(tmp_path, runner_parity.REFERENCE_RUNNER, perf_repeats=3)._run(outcome)
    assert len(pool.requests) == 1 and outcome.run is None and outcome.reference_run is None


def test_repeats_run_the_plan_cycled_beside_the_reference_program_and_the_checks_run_alone(
    tmp_path, recorder, monkeypatch
):
    """The repeats (timing only) carry the reference program and the plan cycled to TIMED_STEPS steps; the run
    whose outputs the checks read has neither."""
    outcome = _outcome(tmp_path)
    pool = recorder(outcome)
    reference = tmp_path / "reference.pte"
    monkeypatch.setattr(CaseStore, "_reference_program", lambda self, soc: reference)
    _store(tmp_path, perf_repeats=3)._run(outcome)
    run, *repeats = pool.requests
    assert run.reference is None and len(run.steps) == STEPS
    cycles = -(-store_module.TIMED_STEPS // STEPS)
    for repeat in repeats:
        assert repeat.reference == reference and repeat.steps == run.steps * cycles
        assert repeat.output_bytes == run.output_bytes * cycles and repeat.program == run.program
    assert len(repeats) == 2


def _driven_outcome(tmp_path: Path, driver: str) -> CaseOutcome:
    from fixtures import drivers as driver_cards  # noqa: F401  (registers the driven cards)
    from harness.pipeline import drivers

    card = cards.find("fixtures.drivers:drv_counter")
    case = Case(card, "fp16", Mode.DELEGATE, "SM8650", driver=driver)
    plan = drivers.of_case(case)
    artifact = LoweredArtifact(case.lowering, tmp_path / "lowered", LoweringFacts(), "", 0.0)
    return CaseOutcome(case, plan.inputs(card.drive), artifact, drivers.run_eager(card, plan))


def test_the_long_drivers_run_is_timed_beside_the_reference_program_and_no_other_case_is(tmp_path, monkeypatch):
    """The horizon check judges the long run's execute time against the reference program's (harness/horizon.py):
    its request carries it; any other case's, driven or not, does not; with none lowered, none."""
    reference = tmp_path / "reference.pte"
    monkeypatch.setattr(CaseStore, "_reference_program", lambda self, soc: reference)
    store, long = _store(tmp_path), _driven_outcome(tmp_path, "long")
    assert store._device_runs(long).run.reference == reference
    assert len(store._device_runs(long).run.steps) > 256, "the whole long plan, not cycled or cut"
    for other in (_driven_outcome(tmp_path, "reset"), _outcome(tmp_path)):
        assert store._device_runs(other).run.reference is None, other.case.id
    monkeypatch.setattr(CaseStore, "_reference_program", lambda self, soc: None)
    assert store._device_runs(long).run.reference is None


def test_a_failed_repeat_is_noted_in_its_own_field_not_the_device_log(tmp_path, recorder, monkeypatch):
    outcome = _outcome(tmp_path)
    pool = recorder(outcome, failing=(f"{outcome.case.id}.repeat2",))
    monkeypatch.setattr(CaseStore, "_reference_program", lambda self, soc: None)  # none lowered: the plan as is
    _store(tmp_path, perf_repeats=4)._run(outcome)
    assert [request.name.removeprefix(outcome.case.id) for request in pool.requests] == ["", ".repeat1", ".repeat2"]
    assert outcome.repeat_steps_us == [[5] * STEPS]
    assert outcome.repeat_note.startswith("--perf-repeats: repeat 2 failed: runner on emu-1 exited 1")
    assert outcome.device_log == "", "the device log is a failed run's log tail, nothing else"


def test_the_collected_checks_decide_which_cases_get_a_reference_run(tmp_path):
    from types import SimpleNamespace

    from harness.check_registry import get
    from harness.fixtures import reference_runners

    case = _outcome(tmp_path).case

    def item(check: str, params: dict) -> SimpleNamespace:
        return SimpleNamespace(function=SimpleNamespace(check_spec=get(check)), callspec=SimpleNamespace(params=params))

    items = [item("export", {"case": case}), SimpleNamespace(function=None)]
    assert reference_runners(items) == {}
    assert reference_runners([*items, item("runner_parity", {"case": case})]) == {
        case.id: runner_parity.REFERENCE_RUNNER
    }
