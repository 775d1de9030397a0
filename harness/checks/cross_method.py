"""cross_method_state: what one method of a multi-method program writes, the next method reads, as eager
running the plan on one module; a failure is explained by the model the device equals."""

from __future__ import annotations

import numpy as np

from harness import numerics
from harness.check_registry import CheckFailure, NotApplicable, check
from harness.checks.common import (
    UNINITIALISED_DELEGATED_BUFFER,
    negated,
    reads_other_methods,
    require_run,
    step_evidence,
)
from harness.outcome import CaseOutcome
from harness.pipeline import cases, eager
from harness.vocabulary import FLOAT_DTYPE

# Multi-method programs -------------------------------------------------------------------------------------
# Outputs first: the device is compared with its reference at every step, and a failure is then explained by
# the model the device equals: the quantized CPU programs with the state carried (a quantized device that shares
# its state, encodings and all), or a way of losing the state (harness/pipeline/eager.py STATE_MODELS), each
# run on eager's module and, quantized, on the methods' quantize/dequantize programs (stages.quantized_models).
CROSS_METHOD_SIGNATURES = (
    "buffer_encoding_mismatch",  # the state crossed, the methods' two encodings of a shared buffer are the error
    "quantization_error",  # the state crossed, the quantized programs (one encoding) are the error
    "state_reset_between_steps",  # every step started from the registered values (the program reloaded)
    "state_per_method",  # each method kept its own copy of the state, started from the registered values
    "state_read_as_constant",  # a method read the buffers it does not write as their registered values
    "state_not_shared",  # mismatches only where a step reads what another method wrote (its own copy, not zeros)
    "cross_method_mismatch",  # anything else
    UNINITIALISED_DELEGATED_BUFFER,  # state crossed methods, but the delegated buffer started from the heap (F1)
)
# The ways to lose state, in the order a signature is chosen when several explain the device alike.
LOST_STATE = {
    "reset": "state_reset_between_steps",
    "per_method": "state_per_method",
    "constant_read": "state_read_as_constant",
}


def _encoding_difference(outcome: CaseOutcome) -> str:
    """Where two methods of a quantized program read or write one shared buffer through different encodings,
    the sentence naming both ("" where they agree; read from the lowering's facts: harness/pipeline/stages.py
    buffer_encodings)."""
    per_method = outcome.artifact.facts.buffer_encodings
    for buffer in outcome.case.card.mutated_buffers:
        for kind in ("read", "write"):
            found = [
                (method, enc[buffer][kind]) for method, enc in sorted(per_method.items()) if kind in enc.get(buffer, {})
            ]
            differing = [(method, encoding) for method, encoding in found if encoding != found[0][1]]
            if differing:
                (first, first_encoding), (other, other_encoding) = found[0], differing[0]
                return (
                    f"shared buffer {buffer}: method {first} {kind}s it as {first_encoding} but method {other} "
                    f"{kind}s it as {other_encoding}: one buffer's bytes through two encodings"
                )
    return ""


def _equal(device: numerics.Outputs, other: numerics.Outputs, dtype: str) -> bool:
    return not numerics.compare(device, other, dtype).mismatched


def _method_writes_of(outcome: CaseOutcome) -> dict[str, list[str]] | None:
    export = outcome.artifact.facts.export
    return dict(export.methods) if export is not None and export.methods else None


def _quantized_models(outcome: CaseOutcome) -> dict[str, numerics.Outputs]:
    """The lowering's quantized programs run on the plan (LoweringFacts.modelled), shaped as eager's outputs;
    {} where none were recorded (a float case, or outputs too large to keep)."""
    recorded = outcome.artifact.facts.modelled
    models = {}
    for name, steps in recorded.items():
        if len(steps) != len(outcome.reference):
            continue
        models[name] = [
            [
                np.asarray(values, dtype=np.float64).astype(want.dtype).reshape(want.shape)
                for values, want in zip(row, ref)
            ]
            for row, ref in zip(steps, outcome.reference)
        ]
    return models


def _lost_state_models(outcome: CaseOutcome) -> list[tuple[str, str, numerics.Outputs]]:
    """(how, started from, outputs) of every way to lose the state this case can be compared with: the
    quantized programs' where recorded, eager's from each start (_starts) otherwise."""
    quantized = _quantized_models(outcome)
    writes = _method_writes_of(outcome)
    if quantized:
        return [(how, "the registered values", quantized[how]) for how in LOST_STATE if how in quantized]
    card, found = outcome.case.card, []
    for start, initial in _starts(outcome):
        for how in LOST_STATE:
            if how != "constant_read" or writes is not None:
                found.append((how, start, eager.run_plan_isolated(card, outcome.steps, False, initial, how, writes)))
    return found


def _story(
    outcome: CaseOutcome, comparison: numerics.Comparison, modelled: numerics.Comparison | None, plan: list[str]
) -> str:
    """Where and by how much the device differs from eager, and, quantized, by how much the modelled programs
    (the state carried) do at the same steps: the two numbers a reader weighs."""
    bad = [e for e in comparison.errors if e.mismatches]
    line = (
        f"{sum(e.mismatches for e in bad)} element(s) differ from eager running the plan on one module in "
        f"{len(bad)}/{len(plan)} step(s), first at step {bad[0].step} ({plan[bad[0].step]}, max abs error "
        f"{bad[0].max_abs_error:.4g})"
    )
    if modelled is None:
        return line
    device = ", ".join(f"{e.max_abs_error:.4g}" for e in bad)
    model = ", ".join(f"{modelled.errors[e.step].max_abs_error:.4g}" for e in bad)
    steps = ", ".join(f"{e.step} ({plan[e.step]})" for e in bad)
    return (
        line + f"; at steps {steps} the device is off eager by {device}, the {outcome.case.dtype} CPU "
        f"quantize/dequantize programs with the state carried across methods by {model}"
    )


@check(
    "cross_method_state",
    short="xmeth",
    needs_device=True,
    signatures=CROSS_METHOD_SIGNATURES,
    matrix=cases.multi_method_matrix,
)
def check_cross_method_state(outcome: CaseOutcome) -> dict:
    """What one method writes, the next method reads: the device matches eager running the same step plan on
    ONE module at every step (never silent garbage). A quantized device that differs is explained by its
    encodings only where it equals the methods' CPU quantize/dequantize programs run on the plan with the
    state carried (each method's own encodings); a device that differs from them lost state or is wrong, and
    the message gives both errors. Judged where a step reads what another method wrote: a device that differs
    only elsewhere (a method's own state) passes here and fails state, which names that method (one verdict
    per defect). Single-method cases: NotApplicable."""
    card = outcome.case.card
    if not card.multi_method:
        raise NotApplicable("a single-method program: no state crosses methods")
    require_run(outcome)
    plan = card.step_methods(len(outcome.steps))
    device, dtype, comparison = outcome.device_outputs(), outcome.case.dtype, outcome.comparison
    encodings = _encoding_difference(outcome)
    carried = _quantized_models(outcome).get("carried")
    modelled = numerics.compare(carried, outcome.reference, dtype) if carried is not None else None
    evidence = {
        "plan": plan,
        **step_evidence(comparison.errors),
        **({"encoding_difference": encodings} if encodings else {}),
        **({"modelled_steps": [e.__dict__ for e in modelled.errors]} if modelled is not None else {}),
    }
    if not comparison.mismatched:
        return evidence
    crossing = reads_other_methods(outcome)
    if not numerics.count(numerics.only_where(comparison.masks, crossing)):
        return {**evidence, "within_method_mismatches": numerics.count(comparison.masks)}  # state's verdict
    where = _story(outcome, comparison, modelled, plan)
    if carried is not None and _equal(device, carried, dtype):
        crossed = (
            "; the device equals them: the state crossed methods, and the error is the quantized programs' "
            "(docs/FINDINGS.md#F18 where the encodings differ)"
        )
        if encodings:
            raise CheckFailure(where + crossed + "; " + encodings, evidence, "buffer_encoding_mismatch")
        raise CheckFailure(
            where + crossed + "; every method encodes the shared buffers alike", evidence, "quantization_error"
        )
    _diagnose_lost_state(outcome, device, where, evidence)
    if numerics.count(comparison.masks) and not numerics.count(
        numerics.only_where(comparison.masks, negated(crossing))
    ):
        raise CheckFailure(
            where + "; every mismatch is in an element that reads what another method wrote, and the device "
            "equals no model of lost state either: the reading method used a state of its own",
            evidence,
            "state_not_shared",
        )
    raise CheckFailure(where, evidence, "cross_method_mismatch")


def _diagnose_lost_state(outcome: CaseOutcome, device: numerics.Outputs, where: str, evidence: dict) -> None:
    """Raise the failure that names how the state was lost, where the device equals a model of it: F1's heap
    start with the state carried (float, delegated), or the ways to lose it (LOST_STATE). Several that give the
    same outputs are all named, with what would tell them apart; the signature is the first in LOST_STATE."""
    card, dtype = outcome.case.card, outcome.case.dtype
    for start, initial in _starts(outcome):
        if initial and _equal(device, eager.run_steps(card, outcome.steps, initial=initial), dtype):
            raise CheckFailure(
                where + f"; the device equals eager running the plan on one module from {start}: state crossed "
                "methods, the delegated buffer started uninitialised (docs/FINDINGS.md#F1)",
                evidence,
                UNINITIALISED_DELEGATED_BUFFER,
            )
    matched = [(how, start) for how, start, outputs in _lost_state_models(outcome) if _equal(device, outputs, dtype)]
    if not matched:
        return
    how, start = matched[0]
    named = [f"{eager.STATE_MODEL_WORDS[h]}, from {s}" for h, s in matched]
    evidence = {**evidence, "explanations": [LOST_STATE[h] for h, _ in matched]}
    if len(matched) == 1:
        raise CheckFailure(where + f"; the device equals {named[0]}", evidence, LOST_STATE[how])
    separation = _separation(outcome, sorted({h for h, _ in matched}, key=list(LOST_STATE).index))
    raise CheckFailure(
        where + f"; the device equals {len(matched)} explanations alike, which give identical outputs on this "
        f"card's inputs: {'; '.join(named)}. {separation}",
        {**evidence, "separation": separation},
        LOST_STATE[how],
    )


def _separation(outcome: CaseOutcome, hows: list[str]) -> str:
    """What would tell the given ways of losing state apart: eager's models of them from a non-zero initial
    state (eager.perturbed_initial), which a card gives by registering its buffers with non-zero values."""
    card, writes = outcome.case.card, _method_writes_of(outcome)
    if len(set(hows)) < 2:
        return "They are one way of losing the state from different starts: the device run alone cannot tell the starts apart."
    perturbed = eager.perturbed_initial(card)
    runs = {how: eager.run_plan_isolated(card, outcome.steps, False, perturbed, how, writes) for how in hows}
    apart = [
        (a, b)
        for index, a in enumerate(hows)
        for b in hows[index + 1 :]
        if not all(
            np.allclose(x, y, equal_nan=True) for row_a, row_b in zip(runs[a], runs[b]) for x, y in zip(row_a, row_b)
        )
    ]
    buffers = ", ".join(card.mutated_buffers)
    if apart:
        pairs = ", ".join(f"{LOST_STATE[a]} from {LOST_STATE[b]}" for a, b in apart)
        return (
            f"A non-zero initial state separates {pairs}: register {buffers} with non-zero values (eager's models "
            f"then differ) and run the card again."
        )
    return (
        f"No initial state of {buffers} separates them: on this plan they are one explanation (a method that "
        f"writes none of a buffer reads the same value either way); a plan where that method writes the buffer "
        f"would."
    )


def _starts(outcome: CaseOutcome) -> list[tuple[str, dict | None]]:
    """What a method's copy of the state may have started from: the registered values, and, for delegated
    buffers on a device whose heap pattern is known, that pattern in a float graph (docs/FINDINGS.md#F1; a
    quantized delegate decodes it through an encoding the check does not know, so it is not tried there)."""
    starts: list[tuple[str, dict | None]] = [("the registered values", None)]
    pattern, buffers = outcome.run.heap_pattern, outcome.delegated_buffers
    if pattern is not None and buffers and outcome.case.dtype == FLOAT_DTYPE:
        initial = eager.pattern_initial(outcome.case.card, pattern, buffers)
        if all(value.is_floating_point() for value in initial.values()):
            starts.append((f"the heap pattern 0x{pattern:02x} in {', '.join(buffers)}", initial))
    return starts
