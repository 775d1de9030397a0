"""The driver checks: a card's state driven as users drive it (harness/pipeline/drivers.py), judged per driver.

driver_invariance: every output of every step, and the buffers a card exposes read back at the end of every
conversation, equal eager driven the same way, within the dtype's tolerance (harness/numerics.py), and a
driver's rows equal the single-step twin's on the device where eager says they are equal. A difference names the driver, the first step and position that differ, what still agrees, and how the
state was lost where eager driven that way reproduces it (a chunk that lost the chunks before it, a turn that
forgot the conversation, a reset that did not reset).

horizon: on the long driver, the error per step does not drift upward along the run (each step inside the
tolerance is driver_invariance's; this judges the trend of the error series), and what a step costs does not
grow with the step count: QNN memory registrations held, peak RSS and execute time, judged by harness/horizon.py
(the first execute may differ; the 2nd..Nth must not; execute time against the reference program timed after
each step, which the case store asks for on the long driver's run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness import horizon, numerics
from harness.check_registry import CheckFailure, NotApplicable, check
from harness.checks.common import require_run
from harness.outcome import CaseOutcome
from harness.pipeline import cases, drivers
from harness.vocabulary import FLOAT_DTYPE, DriveChunk

LOST_CHUNK, LOST_TURN, LOST_STATE = "driver_lost_chunk", "driver_lost_turn", "driver_lost_state"
NO_RESET, MISMATCH, DISAGREEMENT = "driver_no_reset", "driver_mismatch", "driver_disagreement"
# Known ways a delegated buffer loses the state whatever the driving (the standard checks' signatures, the same
# findings): it starts from the heap (docs/FINDINGS.md#F1), each method holds its own copy (#F15).
UNINITIALISED, PER_METHOD = "uninitialised_delegated_buffer", "state_per_method"
# A lost state the lowering's own facts explain: convert_pt2e folded a buffer's read into a constant (#F7).
FOLDED = "buffer_reads_folded"
# A read-back (Drive.read_back) that differs while every step before it agrees: the reading method got the
# buffers as the constants of their registered values (the cross-method check's signature of #F16), or
# something else.
READ_AS_CONSTANT, READ_BACK_MISMATCH = "state_read_as_constant", "driver_read_back_mismatch"
DRIVER_SIGNATURES = (
    LOST_CHUNK,
    LOST_TURN,
    LOST_STATE,
    NO_RESET,
    MISMATCH,
    DISAGREEMENT,
    UNINITIALISED,
    PER_METHOD,
    FOLDED,
    READ_AS_CONSTANT,
    READ_BACK_MISMATCH,
)
ERROR_DRIFT = "error_drift"
# The error drifts when the last quarter's typical error (in tolerances) is both a real share of the tolerance
# and several times the first quarter's: rounding noise stays flat, a leak of error into the state grows.
DRIFT_SHARE, DRIFT_GROWTH, DRIFT_FLOOR = 0.25, 4.0, 0.01


@dataclass(frozen=True)
class FirstDifference:
    step: int
    chunk: DriveChunk
    position: int | None  # the stream position of the first differing row (None: an output without rows)


def _first_difference(plan: drivers.DrivenPlan, comparison: numerics.Comparison) -> FirstDifference | None:
    for error in comparison.errors:
        if not error.mismatches:
            continue
        chunk = plan.chunks[error.step]
        for mask in comparison.masks[error.step]:
            found = np.argwhere(mask)
            if found.size:
                row = int(found[0][1]) if mask.ndim >= 2 and mask.shape[1] == len(chunk.positions) else None
                return FirstDifference(error.step, chunk, chunk.positions[row] if row is not None else None)
        return FirstDifference(error.step, chunk, None)
    return None


def _matches_at(outcome: CaseOutcome, step: int, other: numerics.Outputs) -> bool:
    device = outcome.device_outputs()
    return not numerics.compare([device[step]], [other[step]], outcome.case.dtype).mismatched


def _state_steps(plan: drivers.DrivenPlan) -> list[int]:
    """The steps that drive the state (all but the read-backs): what the known defects of the state explain."""
    return [step for step in range(len(plan.chunks)) if step not in plan.read_backs]


def _steps_match(outcome: CaseOutcome, plan: drivers.DrivenPlan, other: numerics.Outputs) -> bool:
    device, steps = outcome.device_outputs(), _state_steps(plan)
    return not numerics.compare([device[s] for s in steps], [other[s] for s in steps], outcome.case.dtype).mismatched


def _known_defect(outcome: CaseOutcome, plan: drivers.DrivenPlan) -> tuple[str, str] | None:
    """(signature, words) when every step that drives the state (the read-backs are judged on their own) equals
    eager driven alike on a runtime with a known defect of delegated buffers (fp16 only for the heap pattern: a quantized delegate decodes it through an encoding
    eager does not know); None otherwise."""
    buffers = outcome.delegated_buffers
    if not buffers:
        return None
    pattern = outcome.run.heap_pattern if outcome.case.dtype == FLOAT_DTYPE else None
    started = drivers.Runtime(pattern=pattern, buffers=buffers) if pattern is not None else None
    heap = f"the heap pattern 0x{pattern:02x}" if pattern is not None else ""
    candidates = [
        (UNINITIALISED, f"the delegated {', '.join(buffers)} started from {heap}, not the registered values", started)
    ]
    if len(set(plan.methods)) > 1:
        per_method = "each method ran on its own copy of the state, so no method read what another wrote"
        candidates.append((PER_METHOD, per_method, drivers.Runtime(per_method=True)))
        candidates.append(
            (
                PER_METHOD,
                f"{per_method} (each copy starting from {heap})",
                drivers.Runtime(per_method=True, pattern=pattern, buffers=buffers) if pattern is not None else None,
            )
        )
    for signature, words, runtime in candidates:
        if runtime is not None and _steps_match(outcome, plan, drivers.run_eager(outcome.case.card, plan, runtime)):
            aside = " (its read-backs aside)" if plan.read_backs else ""
            return signature, f"every step of the run{aside} equals eager where {words}"
    if pattern is None and outcome.case.dtype == FLOAT_DTYPE and _only_where_the_start_matters(outcome, plan, buffers):
        return UNINITIALISED, (
            f"every element that differs is one that depends on where the delegated {', '.join(buffers)} started "
            "(the device gives no heap pattern to confirm the start it had)"
        )
    return None


# Starts the delegated buffers are given to see which outputs depend on where they start (any two differ).
PROBE_PATTERNS = (0x40, 0x11)


def _only_where_the_start_matters(outcome: CaseOutcome, plan: drivers.DrivenPlan, buffers: tuple[str, ...]) -> bool:
    """The device differs from eager driven alike, and only in elements that change when the delegated buffers
    start elsewhere: the standard state check's rule for an unconfirmed uninitialised start, for a device
    without a heap pattern (a phone), driven."""
    card, dtype = outcome.case.card, outcome.case.dtype
    differs = outcome.comparison.masks  # the device against eager driven alike: the case's reference
    depends = [
        numerics.compare(
            drivers.run_eager(card, plan, drivers.Runtime(pattern=probe, buffers=buffers)), outcome.reference, dtype
        ).masks
        for probe in PROBE_PATTERNS
    ]
    found = False
    for step in _state_steps(plan):
        for index, mask in enumerate(differs[step]):
            dependent = np.logical_or.reduce([np.asarray(probe[step][index]) for probe in depends])
            if np.any(np.asarray(mask) & ~dependent):
                return False
            found = found or bool(np.any(mask))
    return found


def _how_lost(outcome: CaseOutcome, plan: drivers.DrivenPlan, first: FirstDifference) -> tuple[str, str]:
    """(signature, words) for how the device's first differing step was computed, as far as eager tells; a
    state lost where the lowering folded the buffer's reads into constants is that folding's (#F7)."""
    known = _known_defect(outcome, plan)
    if known is not None:
        return known
    signature, words = _step_lost(outcome, plan, first)
    quantize = outcome.artifact.facts.quantize
    folded = quantize.folded_buffer_reads if quantize is not None else {}
    if signature in (LOST_CHUNK, LOST_TURN, LOST_STATE) and folded:
        name, counts = next(iter(folded.items()))
        return FOLDED, (
            f"{words}, as the quantized program computes it: convert_pt2e folded reads of {name} into constants "
            f"({counts.get('before')} reads before, {counts.get('after')} after)"
        )
    return signature, words


def _step_lost(outcome: CaseOutcome, plan: drivers.DrivenPlan, first: FirstDifference) -> tuple[str, str]:
    """(signature, words) for a state lost or kept at the first differing step (eager driven so equals it)."""
    card, step, chunk = outcome.case.card, first.step, first.chunk
    if (
        plan.reloads
        and step >= plan.reloads[0]
        and _matches_at(outcome, step, drivers.run_eager(card, plan, drivers.Runtime(ignore=plan.reloads)))
    ):
        return (
            NO_RESET,
            f"the reload before step {plan.reloads[0]} did not reset: later steps read what earlier ones left",
        )
    if step and _matches_at(outcome, step, drivers.run_eager(card, plan, drivers.Runtime(fresh_at=(step,)))):
        before = plan.chunks[step - 1]
        if before.method == chunk.method and len(chunk.positions) > 1:
            chunk_index = sum(1 for c in plan.chunks[:step] if c.method == chunk.method and c.turn == chunk.turn)
            return LOST_CHUNK, (
                f"chunk {chunk_index + 1} lost chunk {chunk_index}'s rows (the prefill's step {step} read the "
                f"state as if nothing before it had run)"
            )
        if chunk.turn != before.turn or (len(chunk.positions) > 1 and before.method != chunk.method):
            return LOST_TURN, (
                f"the second prefill at position {chunk.positions[0] if chunk.positions else '?'} forgot the "
                f"conversation (step {step} read the registered state, not what steps 0..{step - 1} wrote)"
            )
        return LOST_STATE, f"step {step} read the registered state, not what steps 0..{step - 1} wrote"
    return MISMATCH, "eager driven with the state lost or kept there does not explain it either"


def _read_back_differs(outcome: CaseOutcome, plan: drivers.DrivenPlan, first: FirstDifference) -> CheckFailure:
    """The failure of a read-back that differs while every step before it agrees, named by what eager driven
    alike says the reading method read: the registered values (a buffer it only reads is a constant: #F16), or
    its own delegated copy started from the heap (#F15, with #F1's start)."""
    card, step, method = outcome.case.card, first.step, first.chunk.method
    buffers = ", ".join(card.mutated_buffers)
    wrote = f"not what steps 0..{step - 1} wrote" if step else "the registered values"
    signature, how = READ_BACK_MISMATCH, "eager reading them as constants or as a copy of their own does not explain it"
    pattern = outcome.run.heap_pattern if outcome.case.dtype == FLOAT_DTYPE else None
    own_copy = drivers.Runtime(per_method=True, pattern=pattern, buffers=outcome.delegated_buffers)
    if _matches_at(outcome, step, drivers.run_eager(card, plan, drivers.Runtime(constant_reads=(method,)))):
        signature, how = READ_AS_CONSTANT, f"{method} read them as the constants of their registered values, {wrote}"
    elif (
        pattern is not None
        and outcome.delegated_buffers
        and _matches_at(outcome, step, drivers.run_eager(card, plan, own_copy))
    ):
        signature, how = PER_METHOD, f"{method} read its own delegated copy, started from the heap pattern, {wrote}"
    error = outcome.comparison.errors[step]
    return CheckFailure(
        f"driver {plan.driver}: the buffers read back after step {step - 1} ({buffers}, by {method} at step {step}, "
        f"turn {first.chunk.turn}) differ from eager driven alike (max error {error.max_abs_error:.3g}): {how}; "
        f"{_still_agrees(outcome, plan, step)}",
        {
            "driver": plan.driver,
            "step": step,
            "method": method,
            "read_back_after": step - 1,
            "turn": first.chunk.turn,
            "max_abs_error": error.max_abs_error,
        },
        signature,
    )


def _still_agrees(outcome: CaseOutcome, plan: drivers.DrivenPlan, step: int) -> str:
    """Which simpler driving still agrees with eager: the steps before the first difference, and the single-step
    twin of the same tokens when the plan has one and it agrees."""
    words = [f"steps 0..{step - 1} agree" if step else "no step agrees"]
    if plan.twin_from is not None and step < plan.twin_from:
        twin = outcome.comparison.errors[plan.twin_from :]
        if not any(error.mismatches for error in twin):
            words.append("single steps over the same tokens (the plan's twin, after a reload) still agree")
    return "; ".join(words)


def _equivalence(outcome: CaseOutcome, plan: drivers.DrivenPlan) -> dict:
    """The driver's rows against the twin's on the device, where eager says they are equal."""
    if plan.twin_from is None:
        return {}
    twin_steps = range(plan.twin_from, len(plan.chunks))
    eager_own = drivers.rows_by_position(plan, outcome.reference, plan.own)
    eager_twin = drivers.rows_by_position(plan, outcome.reference, twin_steps)
    device_own = drivers.rows_by_position(plan, outcome.device_outputs(), plan.own)
    device_twin = drivers.rows_by_position(plan, outcome.device_outputs(), twin_steps)
    keys = sorted(set(eager_own) & set(eager_twin))
    equal = [key for key in keys if not numerics.compare([eager_own[key]], [eager_twin[key]], "fp16").mismatched]
    for key in equal:
        if numerics.compare([device_own[key]], [device_twin[key]], outcome.case.dtype).mismatched:
            turn, position = key
            raise CheckFailure(
                f"driver {outcome.case.driver}: position {position} (turn {turn}) differs on the device from single "
                f"steps over the same tokens, which eager says are equal",
                {"driver": outcome.case.driver, "turn": turn, "position": position},
                DISAGREEMENT,
            )
    return {"equivalent_rows": len(equal), **_equivalent_read_backs(outcome, plan)}


def _equivalent_read_backs(outcome: CaseOutcome, plan: drivers.DrivenPlan) -> dict:
    """The buffers read back after the driver's own steps against those read back after the twin's, on the
    device, where eager says they are equal (a chunked prefill's cache and single steps' over the same tokens)."""
    assert plan.twin_from is not None
    own = [step for step in plan.read_backs if step < plan.twin_from]
    twin = [step for step in plan.read_backs if step >= plan.twin_from]
    if not own or not twin:
        return {}
    own_step, twin_step = own[-1], twin[-1]
    eager, device = outcome.reference, outcome.device_outputs()
    if numerics.compare([eager[own_step]], [eager[twin_step]], "fp16").mismatched:
        return {"equivalent_read_backs": False}
    if numerics.compare([device[own_step]], [device[twin_step]], outcome.case.dtype).mismatched:
        raise CheckFailure(
            f"driver {outcome.case.driver}: the buffers read back after step {own_step - 1} differ on the device from "
            f"those read back after single steps over the same tokens (step {twin_step - 1}), which eager says are "
            "equal",
            {"driver": outcome.case.driver, "step": own_step, "twin_step": twin_step},
            DISAGREEMENT,
        )
    return {"equivalent_read_backs": True}


@check(
    "driver_invariance",
    short="drv",
    needs_device=True,
    signatures=DRIVER_SIGNATURES,
    matrix=cases.driver_matrix,
)
def check_driver_invariance(outcome: CaseOutcome) -> dict:
    """Every step of a driven case and every read-back of its buffers equal eager driven the same way, and
    drivers eager calls equal agree."""
    require_run(outcome)
    plan = drivers.of_run(outcome.case, len(outcome.steps))
    first = _first_difference(plan, outcome.comparison)
    if first is not None and first.step in plan.read_backs:
        raise _read_back_differs(outcome, plan, first)
    if first is not None:
        signature, how = _how_lost(outcome, plan, first)
        where = f" position {first.position}" if first.position is not None else ""
        error = outcome.comparison.errors[first.step]
        raise CheckFailure(
            f"driver {plan.driver}: step {first.step} ({first.chunk.method}{where}, turn {first.chunk.turn}) differs "
            f"from eager driven alike (max error {error.max_abs_error:.3g}): {how}; {_still_agrees(outcome, plan, first.step)}",
            {
                "driver": plan.driver,
                "step": first.step,
                "method": first.chunk.method,
                "position": first.position,
                "turn": first.chunk.turn,
                "max_abs_error": error.max_abs_error,
            },
            signature,
        )
    worst = max((error.max_abs_error for error in outcome.comparison.errors), default=0.0)
    return {
        "driver": plan.driver,
        "step_count": len(plan.chunks),
        "max_abs_error": worst,
        **_equivalence(outcome, plan),
    }


def error_drift(errors: list[float], tolerances: list[float]) -> str | None:
    """Why an error series drifts upward (None: it does not): the last quarter's median error, in tolerances,
    is over DRIFT_SHARE of it and DRIFT_GROWTH times the first quarter's (a series of 8 steps or more)."""
    ratios = [error / tolerance for error, tolerance in zip(errors, tolerances) if tolerance > 0]
    if len(ratios) < 8:
        return None
    quarter = len(ratios) // 4
    early, late = float(np.median(ratios[:quarter])), float(np.median(ratios[-quarter:]))
    if late > DRIFT_SHARE and late > DRIFT_GROWTH * max(early, DRIFT_FLOOR):
        return (
            f"the error grew from {early:.3g} to {late:.3g} of the tolerance between the first and last quarter "
            f"of {len(ratios)} steps"
        )
    return None


def _long_matrix(cards: list, dtypes: tuple[str, ...], socs: list[str]) -> list:
    return [case for case in cases.driver_matrix(cards, dtypes, socs) if case.driver == "long"]


HORIZON_SIGNATURES = (
    ERROR_DRIFT,
    horizon.REGISTRATIONS.signature,
    horizon.PEAK_RSS.signature,
    horizon.EXECUTE_TIME.signature,
)


@check("horizon", short="hzn", needs_device=True, signatures=HORIZON_SIGNATURES, matrix=_long_matrix)
def check_horizon(outcome: CaseOutcome) -> dict:
    """On the long driver, the device's error per step against eager does not drift upward along the run, and
    its registrations, peak RSS and execute time per step do not grow (series the device did not measure are
    said to be not judged in the evidence, never passed silently). A read-back of the buffers at the end is
    another method's step, judged by driver_invariance: the series are the decode steps'."""
    require_run(outcome)
    steps = _state_steps(drivers.of_run(outcome.case, len(outcome.steps)))  # the read-back is no decode step

    def along(values: list) -> list:
        """A per-step series on the run's decode steps ([] or one the device measured otherwise: as it is)."""
        return [values[step] for step in steps] if len(values) == len(outcome.steps) else values

    errors = along(outcome.comparison.errors)
    if not errors:
        raise NotApplicable("the run has no steps")
    series = [error.max_abs_error for error in errors]
    tolerances = [error.tolerance if error.tolerance == error.tolerance else 0.0 for error in errors]
    why = error_drift(series, tolerances)
    if why is not None:
        raise CheckFailure(f"driver long: {why}", {"errors": series, "tolerances": tolerances}, ERROR_DRIFT)
    run = outcome.run
    costs = horizon.long_run_verdict(
        along(run.step_times_us),
        along(run.step_rss_kb),
        along(run.step_registrations),
        step_reference_us=along(run.reference_us),
    )
    if not costs.ok:
        raise CheckFailure(f"driver long: {costs.message()}", costs.evidence(), costs.signature)
    return {"step_count": len(series), "max_abs_error": max(series), **costs.evidence()}
