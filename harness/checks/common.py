"""What every family of checks reads from a case's outcome: that it was lowered and run, its plan's
steps per method, a multi-method case judged method by method, and the output elements that read another
method's writes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness import numerics
from harness.check_registry import CheckFailure, InfrastructureError, NotApplicable, NotMeasured
from harness.outcome import CaseOutcome
from harness.pipeline import eager

# The delegated buffer did not start from its registered value (docs/FINDINGS.md#F1: QnnManager allocates
# it, never copies it in). Exact where the device's heap pattern is known: the device output equals eager
# started from that pattern in the delegated buffers. Loose elsewhere (phones): every mismatch is in an
# output element that depends on the initial value, and the message says "unconfirmed".
UNINITIALISED_DELEGATED_BUFFER = "uninitialised_delegated_buffer"


def require_lowered(outcome: CaseOutcome) -> None:
    if not outcome.artifact.ok:
        error = outcome.artifact.facts.error
        raise CheckFailure(outcome.artifact.failure, {"traceback": error.traceback if error else ""}, "lowering_failed")


def require_run(outcome: CaseOutcome) -> None:
    require_lowered(outcome)
    if outcome.run is None and outcome.run_error_is_infrastructure:
        raise InfrastructureError(outcome.run_error)
    if outcome.run is None and outcome.run_error_is_not_measured:
        raise NotMeasured(outcome.run_error)
    if outcome.run is None:
        raise CheckFailure(
            outcome.run_error or "the case was not run on a device",
            {"device_log": outcome.device_log} if outcome.device_log else {},
            "not_run",
        )


def method_steps(outcome: CaseOutcome) -> dict[str, list[int]]:
    """Each method's steps, in plan order (a single-method card: forward at every step)."""
    card = outcome.case.card
    plan = card.step_methods(len(outcome.steps))
    return {
        method: [step for step, name in enumerate(plan) if name == method] for method in card.methods or ("forward",)
    }


def per_method(outcome: CaseOutcome, judge: Callable[[str], dict]) -> dict:
    """A multi-method case judged method by method with the single-method rule (`judge`, one body for both):
    the first failing method (the card's order) fails the case, its message and evidence naming it; a method
    the rule cannot apply to is recorded with its reason under not_applicable (never counted as a pass), and
    the case is NotApplicable only when no method could be judged."""
    judged, skipped = {}, {}
    for method in outcome.case.card.methods:
        try:
            judged[method] = judge(method)
        except NotApplicable as reason:
            skipped[method] = str(reason)
        except CheckFailure as failure:
            raise CheckFailure(
                f"method {method}: {failure}", {**failure.evidence, "method": method}, failure.signature
            ) from None
    if not judged:
        raise NotApplicable("; ".join(f"method {method}: {reason}" for method, reason in skipped.items()))
    return {"methods": judged, "not_applicable": skipped}


def method_writes(outcome: CaseOutcome, method: str) -> list[str]:
    """The buffers one method of a multi-method program writes (its exported program's buffers_to_mutate)."""
    export = outcome.artifact.facts.export
    if export is None or method not in export.methods:
        raise NotApplicable(f"the lowering's facts do not say what method {method} writes (lowered by an older suite)")
    return list(export.methods[method])


def step_evidence(errors: list[numerics.StepError]) -> dict:
    return {"steps": [e.__dict__ for e in errors]}


def reads_other_methods(outcome: CaseOutcome) -> numerics.Outputs:
    """Output elements that read what another method wrote: where eager with each method on its own copy
    of the state (harness/pipeline/eager.py run_plan_isolated) differs from eager on one module at all, not
    beyond the dtype's tolerance (measured: a quantized tolerance took 1-2 elements a decode step that read
    prefill's small writes for decode's own, and state then judged them)."""
    isolated = eager.run_plan_isolated(outcome.case.card, outcome.steps, fresh_each_step=False)
    return [
        [~np.isclose(alone, shared, equal_nan=True) for alone, shared in zip(alone_row, shared_row)]
        for alone_row, shared_row in zip(isolated, outcome.reference)
    ]


def negated(masks: numerics.Outputs) -> numerics.Outputs:
    return [[~mask for mask in row] for row in masks]
