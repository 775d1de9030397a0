"""The driver checks on broken inputs: device outputs computed as a broken runtime would (eager driven with the
state lost at a chunk, at a turn, or a reset not made; per-method copies; an error that drifts) each fail with
their own signature and message, and the healthy run (eager itself) passes. Pure: no lowering, no device (the
emulated runtime's faults are harness/tests/pipeline/test_drivers_device.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from fixtures import drivers as driven_cards  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure
from harness.checks import driving as driver_checks
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.paths import REPO_ROOT
from harness.pipeline import card as cards, cases, drivers
from harness.pipeline.facts import LoweringFacts, QuantizeFacts
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import Case, Mode

PD, RING = "fixtures.drivers:drv_prefill_decode_kv", "fixtures.drivers:drv_sliding_window_kv"
COUNTER, RELOADED = "fixtures.drivers:drv_counter", "fixtures.drivers:drv_reloaded_counter"


def _case(card: str, driver: str, mode: Mode = Mode.SKIP, dtype: str = "fp16") -> Case:
    return Case(cards.find(card), dtype, mode, "SM8650", driver=driver)


def _outcome(
    case: Case, device: list[list[np.ndarray]], tmp_path: Path, facts: LoweringFacts | None = None
) -> CaseOutcome:
    """A driven case whose device computed `device`; its program file exists so the artifact is ok."""
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"pte")
    artifact = LoweredArtifact(case.lowering, tmp_path, facts or LoweringFacts(), "", 0.0)
    plan = drivers.of_case(case)
    run = DeviceRun([[np.array(out).ravel() for out in row] for row in device], [], None, "")
    return CaseOutcome(
        case,
        plan.inputs(case.card.drive),
        artifact,
        drivers.run_eager(case.card, plan),
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=run,
    )


def _as(case: Case, runtime: drivers.Runtime | None = None) -> list[list[np.ndarray]]:
    return drivers.run_eager(case.card, drivers.of_case(case), runtime or drivers.Runtime())


def _failure(outcome: CaseOutcome) -> CheckFailure:
    with pytest.raises(CheckFailure) as failure:
        driver_checks.check_driver_invariance(outcome)
    return failure.value


@pytest.mark.parametrize(
    ("card", "driver"),
    [(PD, "chunked"), (PD, "second_prefill"), (PD, "reset"), (RING, "long"), (COUNTER, "reset"), (RELOADED, "reset")],
)
def test_eager_driven_alike_passes(card, driver, tmp_path):
    case = _case(card, driver)
    judged = driver_checks.check_driver_invariance(_outcome(case, _as(case), tmp_path))
    _valid_evidence(judged)
    assert judged["driver"] == driver


def test_a_prefill_that_keeps_only_its_first_chunk_reads_as_such(tmp_path):
    case = _case(PD, "chunked")
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(fresh_at=(1,))), tmp_path))
    assert failure.signature == driver_checks.LOST_CHUNK
    assert "chunk 2 lost chunk 1's rows" in str(failure) and "steps 0..0 agree" in str(failure)
    assert "single steps over the same tokens" in str(failure)  # the twin still agrees: a simpler driver
    assert failure.evidence["position"] == 4


def test_a_second_prefill_that_forgets_the_conversation_reads_as_such(tmp_path):
    case = _case(PD, "second_prefill")
    turn = next(index for index, chunk in enumerate(drivers.of_case(case).chunks) if chunk.turn == 1)
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(fresh_at=(turn,))), tmp_path))
    assert failure.signature == driver_checks.LOST_TURN, str(failure)
    assert "second prefill at position 12 forgot the conversation" in str(failure)


def test_a_reload_that_does_not_reset_reads_as_such(tmp_path):
    case = _case(RELOADED, "reset")
    plan = drivers.of_case(case)
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(ignore=plan.reloads)), tmp_path))
    assert failure.signature == driver_checks.NO_RESET, str(failure)
    assert f"the reload before step {plan.reloads[0]} did not reset" in str(failure)


def test_per_method_copies_are_the_known_finding_not_a_driver_defect(tmp_path):
    case = _case(PD, "prefill_decode", Mode.DELEGATE)
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(per_method=True)), tmp_path))
    assert failure.signature == driver_checks.PER_METHOD, str(failure)
    # skip_mutbuf keeps no delegated copy: the same outputs are the driver's own loss there
    skipped = _case(PD, "prefill_decode")
    assert _failure(_outcome(skipped, _as(skipped, drivers.Runtime(per_method=True)), tmp_path)).signature != (
        driver_checks.PER_METHOD
    )


def test_a_lost_chunk_in_a_program_with_folded_reads_is_the_folding(tmp_path):
    case = _case(PD, "chunked", dtype="16a8w")
    folded = LoweringFacts(quantize=QuantizeFacts([], [], {"step_4: kv_cache": {"before": 2, "after": 1}}))
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(fresh_at=(1,))), tmp_path, folded))
    assert failure.signature == driver_checks.FOLDED and "chunk 2 lost chunk 1's rows" in str(failure)
    assert _failure(_outcome(case, _as(case, drivers.Runtime(fresh_at=(1,))), tmp_path)).signature == (
        driver_checks.LOST_CHUNK
    )


def test_an_unexplained_difference_is_a_plain_mismatch(tmp_path):
    case = _case(PD, "chunked")
    device = [[np.asarray(out) + (1.0 if step == 1 else 0.0) for out in row] for step, row in enumerate(_as(case))]
    failure = _failure(_outcome(case, device, tmp_path))
    assert failure.signature == driver_checks.MISMATCH and "step 1" in str(failure)


def test_drivers_eager_calls_equal_must_agree_on_the_device(tmp_path):
    """Within tolerance of eager on each side, but the twin's rows off the driver's by more than the tolerance."""
    case = _case(PD, "chunked")
    plan = drivers.of_case(case)
    device = [
        [np.asarray(out) + (0.009 if step >= plan.twin_from else -0.009) for out in row]
        for step, row in enumerate(_as(case))
    ]
    assert _failure(_outcome(case, device, tmp_path)).signature == driver_checks.DISAGREEMENT


def test_error_drift_catches_a_growing_error_and_not_a_flat_one():
    tolerance = [0.01] * 64
    assert driver_checks.error_drift([0.0001 * step for step in range(64)], tolerance) is not None
    assert driver_checks.error_drift([0.004 + 0.0001 * (step % 3) for step in range(64)], tolerance) is None
    assert driver_checks.error_drift([0.0] * 64, tolerance) is None


def test_the_driver_matrix_shares_each_lowering_and_keeps_the_long_driver_small():
    matrix = cases.driver_matrix(cards.cards(), ("fp16", "16a8w"), ["SM8650", "SM8750"])
    assert {case.driver for case in matrix} >= {"chunked", "second_prefill", "reset", "adapter_switch", "long"}
    assert all(case.lowering.driver == "" and case.lowering.id in case.id for case in matrix)
    assert all(case.dtype == "fp16" for case in matrix if case.driver == "long")
    assert not [case for case in cases.matrix(cards.cards(), ("fp16",), ["SM8650"]) if case.card.drive]


def _long_outcome(tmp_path: Path, registrations, rss_kb, times_us) -> CaseOutcome:
    case = _case(RING, "long")
    outcome = _outcome(case, _as(case), tmp_path)
    outcome.run.step_registrations = registrations(len(outcome.steps))
    outcome.run.step_rss_kb = rss_kb(len(outcome.steps))
    outcome.run.step_times_us = times_us(len(outcome.steps))
    return outcome


def test_horizon_catches_a_registration_leak_and_memory_growth_and_not_a_flat_long_run(tmp_path):
    """The long driver's costs per step (harness/horizon.py): a registration held per execute, and peak RSS that
    keeps rising, each fail with their own signature; a flat run (noisy times, one warm-up step) passes."""
    flat = {
        "registrations": lambda n: [2] * n,
        "rss_kb": lambda n: [229_000] * n,
        "times_us": lambda n: [30_000] + [250 + (step * 7) % 40 for step in range(1, n)],
    }
    passed = driver_checks.check_horizon(_long_outcome(tmp_path, **flat))
    assert passed["step_count"] >= 256 and len(passed["horizon"]) == 3
    _valid_evidence(passed)
    leaking = {**flat, "registrations": lambda n: [2 + step for step in range(n)]}
    with pytest.raises(CheckFailure) as leak:
        driver_checks.check_horizon(_long_outcome(tmp_path, **leaking))
    assert leak.value.signature == "registrations_grow" and "grow by 1 per execute" in str(leak.value)
    growing = {**flat, "rss_kb": lambda n: [229_000 + 64 * step for step in range(n)]}
    with pytest.raises(CheckFailure) as rss:
        driver_checks.check_horizon(_long_outcome(tmp_path, **growing))
    assert rss.value.signature == "peak_rss_grows"


def test_horizon_judges_execute_time_against_the_reference_and_raw_without_it(tmp_path):
    """The long run's reference program (timed after each step, DeviceRun.reference_us) slowed alike with the
    case: the machine, not the program, and the check passes; the case slowing alone fails; the same run
    without the reference is judged raw, and its failure says so."""
    case_us = lambda n: [30_000] + [250 + step + (step * 7) % 40 for step in range(1, n)]  # noqa: E731
    alike = {"registrations": lambda n: [2] * n, "rss_kb": lambda n: [229_000] * n, "times_us": case_us}
    outcome = _long_outcome(tmp_path, **alike)
    outcome.run.reference_us = [200 + 4 * step // 5 for step in range(len(outcome.steps))]
    passed = driver_checks.check_horizon(outcome)
    assert passed["horizon"][2]["judged_against"] == "reference" and not passed["horizon"][2]["grows"]
    _valid_evidence(passed)
    outcome.run.reference_us = [200] * len(outcome.steps)
    with pytest.raises(CheckFailure) as alone:
        driver_checks.check_horizon(outcome)
    assert alone.value.signature == "execute_time_grows" and "against the reference program" in str(alone.value)
    outcome.run.reference_us = []
    with pytest.raises(CheckFailure) as raw:
        driver_checks.check_horizon(outcome)
    assert "execute time judged raw: no reference timing; execute time grows by" in str(raw.value)


def _valid_evidence(evidence: dict) -> None:
    """A check's evidence as report.json's schema takes it (its `steps` are per-step errors): a report the diff,
    the gate and a baseline refuse is a night lost."""
    schema = json.loads((REPO_ROOT / "harness" / "report" / "report.schema.json").read_text())
    jsonschema.validate(
        json.loads(json.dumps(evidence, default=str)),
        {"$ref": "#/$defs/check/properties/evidence", "$defs": schema["$defs"]},
    )


def test_an_uninitialised_start_is_named_without_a_heap_pattern_only_where_the_start_matters(tmp_path):
    """A phone gives no heap pattern: a delegated cache that started elsewhere is still the uninitialised start
    (every differing element is one the start decides), and a device off where the start does not matter (the
    rows a step wrote) is not."""
    case = next(
        case
        for case in cases.driver_matrix(cards.cards(), ("fp16",), ["SM8650"])
        if case.id == "kv_index_copy_dim1-fp16-delegate_mutbuf-SM8650-single"
    )
    started = _as(case, drivers.Runtime(pattern=0x5A, buffers=("cache",)))
    outcome = _outcome(case, started, tmp_path)
    assert outcome.run.heap_pattern is None
    assert _failure(outcome).signature == driver_checks.UNINITIALISED
    everywhere = [[np.asarray(out) + 100.0 for out in row] for row in _as(case)]
    assert _failure(_outcome(case, everywhere, tmp_path)).signature != driver_checks.UNINITIALISED


def test_the_buffers_are_read_back_at_the_end_of_every_conversation():
    """Before a reset (the reset method, a rewind, the twin's reload) and at the end of the plan; a long run's
    record names its plan by its steps, read-back included."""
    plan = drivers.plan(cards.find(PD).drive, "reset")
    ends = plan.read_backs
    assert [plan.chunks[step].turn for step in ends] == [0, 1, 1] and ends[-1] == len(plan.chunks) - 1
    assert plan.chunks[ends[0] + 1].turn == 1 and ends[1] == plan.twin_from - 1  # before the rewind, the reload
    counter = drivers.plan(cards.find(COUNTER).drive, "reset")
    assert counter.chunks[counter.read_backs[0] + 1].method == "reset"
    long = _case(COUNTER, "long")
    for horizon in (256, 300):
        driven = drivers.of_case(long, horizon)
        assert len(driven.chunks) == horizon + 1 and drivers.of_run(long, len(driven.chunks)) == driven
    assert not drivers.plan(cards.find(RING).drive, "chunked").read_backs  # a card that exposes none


def test_a_read_back_of_the_registered_values_is_the_constant_read(tmp_path):
    """Every step agrees, but the read-back gives the buffer's registered values (a method that only reads a
    buffer gets it as a constant: F16's signature), named as a read-back after the last step."""
    case = _case(COUNTER, "single")
    last = len(drivers.of_case(case).chunks) - 2
    failure = _failure(_outcome(case, _as(case, drivers.Runtime(constant_reads=("read_count",))), tmp_path))
    assert failure.signature == driver_checks.READ_AS_CONSTANT, str(failure)
    assert f"the buffers read back after step {last} (count, by read_count at step {last + 1}" in str(failure)
    assert f"steps 0..{last} agree" in str(failure) and failure.evidence["read_back_after"] == last


def test_a_read_back_off_eager_is_a_read_back_failure_and_a_step_off_is_not(tmp_path):
    case = _case(PD, "prefill_decode")
    plan = drivers.of_case(case)
    first = plan.read_backs[0]

    def off_at(step: int, by: float) -> list[list[np.ndarray]]:
        return [
            [np.asarray(out) + (by if index == step else 0.0) for out in row] for index, row in enumerate(_as(case))
        ]

    failure = _failure(_outcome(case, off_at(first, 1.0), tmp_path))
    assert failure.signature == driver_checks.READ_BACK_MISMATCH, str(failure)
    assert str(failure).startswith(f"driver prefill_decode: the buffers read back after step {first - 1} (kv_cache")
    step = _failure(_outcome(case, off_at(1, 1.0), tmp_path))
    assert step.signature == driver_checks.MISMATCH and "read back" not in str(step)
    assert str(step).startswith("driver prefill_decode: step 1 (step_4 position 4")
    # within the tolerance (fp16: 1e-2 absolute) the read-back agrees, and a later twin read-back is judged too
    judged = driver_checks.check_driver_invariance(_outcome(case, off_at(first, 0.004), tmp_path))
    assert judged["step_count"] == len(plan.chunks)
    assert _failure(_outcome(case, off_at(plan.read_backs[-1], 1.0), tmp_path)).signature == (
        driver_checks.READ_BACK_MISMATCH
    )


def test_a_known_defect_of_the_steps_is_not_hidden_by_the_read_back(tmp_path):
    """The delegated count starts from the heap (F1) and its reader gets the registered values (F16): the steps'
    known defect names the failure, judged on the steps alone."""
    case = _case(COUNTER, "single", Mode.DELEGATE)
    device = _as(case, drivers.Runtime(pattern=0x40, buffers=("count",)))
    device[-1] = _as(case, drivers.Runtime(constant_reads=("read_count",)))[-1]
    outcome = _outcome(case, device, tmp_path)
    outcome.run.heap_pattern = 0x40
    failure = _failure(outcome)
    assert failure.signature == driver_checks.UNINITIALISED and "step 0 (step_1 position 0" in str(failure)


def test_horizon_widens_the_long_driver_to_every_driven_card_and_dtype():
    """By default the long driver runs on its small subset (the cards that ask for it, fp16); --horizon N
    (widen_long_driver) runs it on every driven card in every dtype its drive runs in, and changes no other case."""
    every = ("fp16", "16a8w")

    def matrix() -> list[Case]:
        return cases.driver_matrix(cards.cards(), every, ["SM8650"])

    default = matrix()
    try:
        cases.widen_long_driver(True)
        widened = matrix()
    finally:
        cases.widen_long_driver(False)
    assert matrix() == default

    def long(cells: list[Case]) -> set[tuple[str, str]]:
        return {(case.card.name, case.dtype) for case in cells if case.driver == "long"}

    driven = {card.name for card in map(drivers.driven, cards.cards()) if card is not None}
    assert {dtype for _, dtype in long(default)} == {"fp16"} and {name for name, _ in long(default)} < driven
    assert {name for name, _ in long(widened)} == driven
    assert ("drv_prefill_decode_kv", "16a8w") in long(widened) and ("kv_index_copy_dim1", "16a8w") not in long(widened)
    assert [case for case in widened if case.driver != "long"] == [case for case in default if case.driver != "long"]


def test_horizon_judges_the_decode_steps_and_not_the_read_back(tmp_path):
    """The long counter's read-back (its last step, another method) is driver_invariance's to judge: its error and
    its costs are not part of the horizon's series; the same outlier on a decode step is."""
    case = _case(COUNTER, "long")
    device = _as(case, drivers.Runtime(constant_reads=("read_count",)))  # the read-back off (F16), steps right
    outcome = _outcome(case, device, tmp_path)
    steps = len(outcome.steps)
    outcome.run.step_registrations = [2] * (steps - 1) + [40]
    outcome.run.step_rss_kb, outcome.run.step_times_us = [229_000] * steps, [250 + step % 7 for step in range(steps)]
    judged = driver_checks.check_horizon(outcome)
    assert judged["step_count"] == steps - 1 == 256
    outcome.run.step_registrations = [2] * (steps // 2) + [3] * (steps - steps // 2)
    with pytest.raises(CheckFailure) as grown:
        driver_checks.check_horizon(outcome)
    assert grown.value.signature == "registrations_grow"


def test_the_read_backs_of_a_driver_and_its_twin_must_agree_on_the_device(tmp_path):
    """Each within tolerance of eager, but the chunked prefill's cache read back off the single steps' by more
    than the tolerance: the disagreement eager rules out, named as the buffers'; the same shift on both passes."""
    case = _case(PD, "chunked")
    plan = drivers.of_case(case)
    own, twin = plan.read_backs

    def shifted(by: dict[int, float]) -> list[list[np.ndarray]]:
        return [[np.asarray(out) + by.get(step, 0.0) for out in row] for step, row in enumerate(_as(case))]

    failure = _failure(_outcome(case, shifted({own: -0.009, twin: 0.009}), tmp_path))
    assert failure.signature == driver_checks.DISAGREEMENT, str(failure)
    assert f"the buffers read back after step {own - 1} differ on the device from those read back after" in str(failure)
    judged = driver_checks.check_driver_invariance(_outcome(case, shifted({own: 0.009, twin: 0.009}), tmp_path))
    assert judged["equivalent_read_backs"] is True
