"""The state on the device, judged from a device run: address_sharing (each delegated buffer's input and
output share one address), state (state persists step by step as in eager) and initial_state (the device
starts from each buffer's registered value)."""

from __future__ import annotations

import numpy as np

from harness import numerics
from harness.check_registry import CheckFailure, NotApplicable, NotMeasured, check
from harness.checks.common import (
    UNINITIALISED_DELEGATED_BUFFER,
    method_steps,
    method_writes,
    negated,
    per_method,
    reads_other_methods,
    require_run,
    step_evidence,
)
from harness.outcome import CaseOutcome, PatternReference
from harness.pipeline import cases, mutbuf


@check(
    "address_sharing",
    short="addr",
    needs_device=True,
    signatures=(
        "mutbuf_in_skip_mode",
        "missing_executes",
        "no_mutbuf_pair",
        "unpaired_mutbuf",
        "split_address",
        "moved_address",
    ),
)
def check_address_sharing(outcome: CaseOutcome) -> dict:
    """Each delegated buffer's input and output share one address, the same at every execute. A multi-method
    case: per method, on the executes of its QNN graph (the interposer records each execute's graph name,
    which executorch's QNN backend names after the method); a method that writes no buffer has no output
    address to pair (NotApplicable for it)."""
    require_run(outcome)
    if outcome.run.trace is None:
        device = outcome.device
        if device is not None and not device.has_execute_trace:
            raise NotMeasured(
                f"no execute trace from a {device.name}: its libQnnHtp.so is Qualcomm's own; pass "
                f"--android-ndk PATH (or set ANDROID_NDK_ROOT) to push the interposer in front of it"
            )
        raise NotApplicable("no execute trace from this device (no QNN graph was executed)")
    records = [r for r in mutbuf.read_trace(outcome.run.trace) if r.get("event") == "execute"]
    skip, card = outcome.case.skip_mutable_buffer, outcome.case.card
    if not card.multi_method:
        return _address_rule(records, len(outcome.steps), len(card.mutated_buffers), skip)
    steps = method_steps(outcome)
    graphs = sorted({str(r.get("graph")) for r in records})
    if records and not set(graphs) & set(card.methods):
        raise NotMeasured(
            f"the traced graphs {graphs} are none of the program's methods {list(card.methods)}: which method an "
            f"execute belongs to is unknown (executorch's QNN backend names a method's graph after it)"
        )

    def judge(method: str) -> dict:
        writes = method_writes(outcome, method)
        if not skip and not writes:
            raise NotApplicable("it writes no buffer: no output address to pair with its input")
        own = [r for r in records if r.get("graph") == method]
        return _address_rule(own, len(steps[method]), len(writes), skip)

    return per_method(outcome, judge)


def _address_rule(executes: list[dict], steps: int, buffers_expected: int, skip: bool) -> dict:
    """The address-sharing rule on one graph's execute records: `steps` executes at least, and (buffers
    delegated) `buffers_expected` mutbuf pairs whose input and output share one address that never moves."""
    bindings = mutbuf.bindings(executes)
    evidence = {"executes": len(executes), "bindings": [b.__dict__ for b in bindings[:64]]}
    if skip:
        if bindings:
            raise CheckFailure(
                f"skip_mutable_buffer=True but the graph has mutbuf tensors ({bindings[0].input_name})",
                evidence,
                "mutbuf_in_skip_mode",
            )
        return evidence
    if len(executes) < steps:
        raise CheckFailure(f"{len(executes)} graph execute(s) traced for {steps} steps", evidence, "missing_executes")
    buffers = sorted({b.position for b in bindings})
    if len(buffers) < buffers_expected:
        raise CheckFailure(
            f"{len(buffers)} mutbuf pair(s) in the compiled graph for {buffers_expected} mutated buffer(s)",
            evidence,
            "no_mutbuf_pair",
        )
    unpaired = [b for b in bindings if b.output_name is None]
    if unpaired:
        raise CheckFailure(
            f"mutbuf input {unpaired[0].input_name} has no output with the same position", evidence, "unpaired_mutbuf"
        )
    split = [b for b in bindings if not b.shared]
    if split:
        b = split[0]
        raise CheckFailure(
            f"execute {b.execute}: {b.input_name} at {b.input_address} but {b.output_name} at "
            f"{b.output_address} ({len(split)} split binding(s))",
            evidence,
            "split_address",
        )
    moved = [p for p in buffers if len({b.input_address for b in bindings if b.position == p}) > 1]
    if moved:
        raise CheckFailure(f"mutbuf {moved[0]} changed address between executes", evidence, "moved_address")
    return evidence


def _classify(
    outcome: CaseOutcome, comparison: numerics.Comparison, what: str, judged: numerics.Outputs | None = None
) -> None:
    """Name a state mismatch; `judged`: the output elements the caller judges (None: all), where the heap
    pattern's reference is read too."""
    errors = comparison.errors
    bad = [e for e in errors if e.mismatches]
    first = bad[0]
    line = (
        f"{what}: {sum(e.mismatches for e in bad)} element(s) out of tolerance in {len(bad)}/{len(errors)} step(s); "
        f"first at step {first.step}, max abs error {first.max_abs_error:.4g}, SQNR {first.sqnr_db:.1f} dB"
    )
    if outcome.delegated_buffers:  # no buffer in the delegate (skip mode, or rejected ops): not this defect
        pattern = outcome.pattern_reference
        pattern_masks = None if pattern.comparison is None else pattern.comparison.masks
        if judged is not None and pattern_masks is not None:
            pattern_masks = numerics.only_where(pattern_masks, judged)
        if pattern_masks is not None and not numerics.count(pattern_masks):
            raise CheckFailure(
                line + f"; the device equals eager started from its heap pattern {pattern.description}",
                step_evidence(errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
        if pattern_masks is not None and not pattern.inconclusive:
            wrong = numerics.count(pattern_masks)
            line += (
                f"; not the uninitialised-buffer defect: eager started from the heap pattern "
                f"{pattern.description} differs too ({wrong} element(s))"
            )
        elif _only_where_initial_value_matters(outcome, comparison.masks):
            raise CheckFailure(
                line + f"; every mismatch depends on the buffer's initial value (unconfirmed: {_unconfirmed(pattern)})",
                step_evidence(errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
    raise CheckFailure(line, step_evidence(errors), "state_mismatch")


def _unconfirmed(pattern: PatternReference) -> str:
    """Why the exact signature could not decide, for the loose one's message."""
    if pattern.comparison is None:
        return pattern.description
    return (
        f"the device differs from eager started from the heap pattern {pattern.description}, but {pattern.inconclusive}"
    )


def _only_where_initial_value_matters(outcome: CaseOutcome, masks: numerics.Outputs) -> bool:
    """The loose signature: no mismatch in an element that does not depend on the initial value."""
    return all(
        not np.any(mask & ~dep)
        for mask_row, dep_row in zip(masks, outcome.initial_value_dependence)
        for mask, dep in zip(mask_row, dep_row)
    )


@check(
    "state",
    short="state",
    needs_device=True,
    signatures=("state_mismatch", UNINITIALISED_DELEGATED_BUFFER),
    matrix=cases.with_meta_llama,
)
def check_state(outcome: CaseOutcome) -> dict:
    """Step by step the device matches eager within the dtype's tolerance.

    A multi-method case: per method, the output elements of its steps that do NOT read what another method
    wrote (eager with each method on its own copy of the state computes them alike), i.e. each method's own
    state from step to step, which is what this check adds to cross_method_state: a mismatch here names the
    method whose own state went wrong. The elements that do read another method's writes are judged by
    cross_method_state alone (its signatures say how the state was lost between methods), never here."""
    require_run(outcome)
    if outcome.case.card.multi_method:
        return _state_per_method(outcome)
    comparison = outcome.comparison
    if comparison.mismatched:
        _classify(outcome, comparison, "state differs from eager")
    return step_evidence(comparison.errors)


def _state_per_method(outcome: CaseOutcome) -> dict:
    own = negated(reads_other_methods(outcome))
    steps = method_steps(outcome)
    whole = _comparison_where(outcome, own)

    def judge(method: str) -> dict:
        judged = _only_steps(own, steps[method])
        if not numerics.count(judged):
            raise NotApplicable(
                "every output element of its steps reads what another method wrote (cross_method_state)"
            )
        comparison = _comparison_where(outcome, judged)
        if comparison.mismatched:
            _classify(outcome, comparison, "state differs from eager", judged)
        return {"plan_steps": steps[method], "judged_elements": numerics.count(judged)}

    return {**per_method(outcome, judge), **step_evidence(whole.errors)}


def _only_steps(masks: numerics.Outputs, steps: list[int]) -> numerics.Outputs:
    """The masks at the given steps, all False at the others."""
    wanted = set(steps)
    return [[mask if step in wanted else np.zeros_like(mask) for mask in row] for step, row in enumerate(masks)]


def _comparison_where(outcome: CaseOutcome, judged: numerics.Outputs) -> numerics.Comparison:
    """The device compared with eager on the judged elements only (elsewhere eager's own value stands in), so
    the per-step numbers (errors, SQNR, mismatch counts) are of those elements."""
    device = [
        [np.where(chosen, got, want) for got, want, chosen in zip(got_row, want_row, chosen_row)]
        for got_row, want_row, chosen_row in zip(outcome.device_outputs(), outcome.reference, judged)
    ]
    return numerics.compare(device, outcome.reference, outcome.case.dtype)


@check(
    "initial_state",
    short="init",
    needs_device=True,
    signatures=("initial_value_ignored", UNINITIALISED_DELEGATED_BUFFER),
    matrix=cases.with_meta_llama,
)
def check_initial_state(outcome: CaseOutcome) -> dict:
    """Output elements that depend on the registered initial value match eager (the buffer started
    from that value on the device). A multi-method case: per method, at its first step of the plan, the
    elements that depend on the initial value without reading what another method wrote (those are
    cross_method_state's): the plan's first step reads the registered value, and so does each method's copy
    where no other method's write reaches it."""
    require_run(outcome)
    if not outcome.case.card.multi_method:
        return _initial_rule(outcome, outcome.initial_value_dependence)
    own = numerics.only_where(outcome.initial_value_dependence, negated(reads_other_methods(outcome)))
    steps = method_steps(outcome)
    return per_method(outcome, lambda method: _initial_rule(outcome, _only_steps(own, steps[method][:1])))


def _initial_rule(outcome: CaseOutcome, dependence: numerics.Outputs) -> dict:
    """The initial-state rule on the output elements `dependence` selects."""
    if not numerics.count(dependence):
        raise NotApplicable("no output element depends on the buffers' initial values")
    comparison = outcome.comparison
    only_dependent = numerics.only_where(comparison.masks, dependence)
    wrong = numerics.count(only_dependent)
    if wrong:
        step_errors = [
            numerics.StepError(e.step, e.max_abs_error, e.sqnr_db, int(sum(m.sum() for m in row)), e.tolerance)
            for e, row in zip(comparison.errors, only_dependent)
        ]
        first = next(e for e in step_errors if e.mismatches)
        message = (
            f"{wrong} output element(s) that depend on the registered initial value differ from eager, "
            f"first at step {first.step}"
        )
        if not outcome.delegated_buffers:
            raise CheckFailure(message, step_evidence(step_errors), "initial_value_ignored")
        pattern = outcome.pattern_reference
        unexplained = (
            numerics.count(numerics.only_where(pattern.comparison.masks, dependence))
            if pattern.comparison is not None
            else None
        )
        if unexplained == 0:
            raise CheckFailure(
                message + f"; they equal eager started from the heap pattern {pattern.description}: "
                f"the delegated buffer started uninitialised",
                step_evidence(step_errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
        if unexplained is None or pattern.inconclusive:
            raise CheckFailure(
                message + f"; the delegated buffer did not start from its registered value "
                f"(unconfirmed: {_unconfirmed(pattern)})",
                step_evidence(step_errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
        raise CheckFailure(
            message + f"; not the uninitialised-buffer defect: {unexplained} of them differ from eager "
            f"started from the heap pattern {pattern.description} too",
            step_evidence(step_errors),
            "initial_value_ignored",
        )
    return {"dependent_elements": numerics.count(dependence)}
