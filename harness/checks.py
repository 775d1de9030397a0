"""The six checks of DESIGN.md, as functions of a case's shared outcome.

Each check returns the numbers it looked at (for the report) or raises CheckFailure with one line and
its evidence. Failures with a known signature raise a subclass, so the known-failures manifest can
match the signature, not just the test id: a case that fails differently is a new failure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from harness.pipeline import eager, mutbuf
from harness.results import CaseOutcome

# Tolerance per dtype, the one place to read them: |device - eager| <= atol + rtol * |eager|, where
# for quantized dtypes atol is a fraction of the reference's value range (one quantization step of
# 16-bit activations is range/65535; 8-bit is range/255; 4-bit weights add more).
TOLERANCES = {
    "fp16": {"atol": 1e-2, "rtol": 1e-2, "range_fraction": 0.0},
    "16a8w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.02},
    "8a8w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.05},
    "16a4w": {"atol": 1e-3, "rtol": 0.0, "range_fraction": 0.1},
}
QNN_BACKEND = "QnnBackend"


class CheckFailure(AssertionError):
    """A check's verdict: one line, a signature naming the kind of failure (what the known-failures
    manifest matches), and evidence for the report."""

    def __init__(self, message: str, evidence: dict | None = None, signature: str = "unclassified") -> None:
        super().__init__(message)
        self.evidence = evidence or {}
        self.signature = signature


# Every mismatch is in an output element that depends on a buffer's registered initial value: the
# delegated buffer did not start from it (FACTS.md: QnnManager's `new char[]`, never copied in).
UNINITIALISED_DELEGATED_BUFFER = "uninitialised_delegated_buffer"


class NotApplicable(Exception):
    """The check has nothing to check for this case (it is skipped with this reason)."""


SIGNATURES = (
    "lowering_failed", "not_run", "buffers_to_mutate_mismatch", "buffer_annotated", "qdq_around_buffer",
    "buffer_reads_folded", "partition_count", "buffer_not_outside", "buffer_outside_delegate",
    "mutbuf_in_skip_mode", "missing_executes", "no_mutbuf_pair", "unpaired_mutbuf", "split_address",
    "moved_address", "state_mismatch", "initial_value_ignored", UNINITIALISED_DELEGATED_BUFFER,
)


def _require_lowered(outcome: CaseOutcome) -> None:
    if not outcome.artifact.ok:
        error = outcome.artifact.facts.get("error") or {}
        raise CheckFailure(outcome.artifact.failure, {"traceback": error.get("traceback", "")}, "lowering_failed")


def _require_run(outcome: CaseOutcome) -> None:
    _require_lowered(outcome)
    if outcome.run is None:
        raise CheckFailure(outcome.run_error or "the case was not run on a device", signature="not_run")


# 1 ------------------------------------------------------------------------------------------------
def check_export(outcome: CaseOutcome) -> dict:
    facts = outcome.artifact.facts.get("export")
    if facts is None:
        _require_lowered(outcome)
    found, expected = sorted(facts["buffers_to_mutate"]), sorted(outcome.case.card.mutated_buffers)
    if found != expected:
        raise CheckFailure(f"exported buffers_to_mutate {found} != the card's mutated buffers {expected}", facts, "buffers_to_mutate_mismatch")
    return {"buffers_to_mutate": found}


# 2 ------------------------------------------------------------------------------------------------
def check_annotation(outcome: CaseOutcome) -> dict:
    if outcome.case.dtype == "fp16":
        raise NotApplicable("fp16 is not quantized: no annotations to check")
    facts = outcome.artifact.facts.get("quantize")
    if facts is None:
        _require_lowered(outcome)
        raise CheckFailure("quantization facts missing although lowering succeeded", signature="lowering_failed")
    if facts["annotated_buffer_inputs"]:
        first = facts["annotated_buffer_inputs"][0]
        raise CheckFailure(f"mutated buffer {first['buffer']} is annotated for quantization as an input of "
                           f"{first['op']} ({len(facts['annotated_buffer_inputs'])} annotation(s))", facts, "buffer_annotated")
    if facts["qdq_around_buffers"]:
        first = facts["qdq_around_buffers"][0]
        raise CheckFailure(f"mutated buffer {first['buffer']} feeds {first['op']} after convert_pt2e", facts, "qdq_around_buffer")
    folded = facts.get("folded_buffer_reads", {})
    if folded:
        name, counts = next(iter(folded.items()))
        raise CheckFailure(f"convert_pt2e folded reads of mutated buffer {name} into constants "
                           f"({counts['before']} reader(s) before, {counts['after']} after): its state is frozen "
                           f"at the calibration value", facts, "buffer_reads_folded")
    return facts


# 3 ------------------------------------------------------------------------------------------------
def check_partitions(outcome: CaseOutcome) -> dict:
    _require_lowered(outcome)
    facts = outcome.artifact.facts["partitions"]
    card, delegates = outcome.case.card, facts["delegates"]
    backends = sorted({d["backend"] for d in delegates})
    if len(delegates) != card.expected_partitions or backends != [QNN_BACKEND]:
        raise CheckFailure(f"{len(delegates)} delegate(s) {backends}, expected {card.expected_partitions} x "
                           f"{QNN_BACKEND}; outside the delegates: {', '.join(facts['ops_outside']) or 'nothing'}", facts,
                           "partition_count")
    outside = sorted(facts["buffers_outside"])
    if outcome.case.skip_mutable_buffer and outside != sorted(card.mutated_buffers):
        raise CheckFailure(f"skip_mutable_buffer=True must keep {sorted(card.mutated_buffers)} outside the delegate "
                           f"with its copy; outside are {outside}", facts, "buffer_not_outside")
    if not outcome.case.skip_mutable_buffer and outside:
        raise CheckFailure(f"with buffer delegation, {outside} stayed outside the delegate "
                           f"(ops outside: {', '.join(facts['ops_outside'])})", facts, "buffer_outside_delegate")
    return {"delegates": len(delegates), "ops_outside": facts["ops_outside"], "buffers_outside": outside}


# 4 ------------------------------------------------------------------------------------------------
def check_address_sharing(outcome: CaseOutcome) -> dict:
    _require_run(outcome)
    if outcome.run.trace is None:
        raise NotApplicable("no execute trace from this device (the interposer runs on emulated devices only)")
    records = mutbuf.read_trace(outcome.run.trace)
    executes = [r for r in records if r.get("event") == "execute"]
    bindings = mutbuf.bindings(records)
    evidence = {"executes": len(executes), "bindings": [b.__dict__ for b in bindings[:64]]}
    if outcome.case.skip_mutable_buffer:
        if bindings:
            raise CheckFailure(f"skip_mutable_buffer=True but the graph has mutbuf tensors ({bindings[0].input_name})", evidence, "mutbuf_in_skip_mode")
        return evidence
    if len(executes) < len(outcome.steps):
        raise CheckFailure(f"{len(executes)} graph execute(s) traced for {len(outcome.steps)} steps", evidence, "missing_executes")
    buffers = sorted({b.position for b in bindings})
    if len(buffers) < len(outcome.case.card.mutated_buffers):
        raise CheckFailure(f"{len(buffers)} mutbuf pair(s) in the compiled graph for "
                           f"{len(outcome.case.card.mutated_buffers)} mutated buffer(s)", evidence, "no_mutbuf_pair")
    unpaired = [b for b in bindings if b.output_name is None]
    if unpaired:
        raise CheckFailure(f"mutbuf input {unpaired[0].input_name} has no output with the same position", evidence, "unpaired_mutbuf")
    split = [b for b in bindings if not b.shared]
    if split:
        b = split[0]
        raise CheckFailure(f"execute {b.execute}: {b.input_name} at {b.input_address} but {b.output_name} at "
                           f"{b.output_address} ({len(split)} split binding(s))", evidence, "split_address")
    moved = [p for p in buffers if len({b.input_address for b in bindings if b.position == p}) > 1]
    if moved:
        raise CheckFailure(f"mutbuf {moved[0]} changed address between executes", evidence, "moved_address")
    return evidence


# 5 and 6 --------------------------------------------------------------------------------------------
@dataclass
class StepError:
    step: int
    max_abs_error: float
    sqnr_db: float
    mismatches: int


def _tolerance(dtype: str, reference: np.ndarray) -> np.ndarray:
    spec = TOLERANCES[dtype]
    value_range = float(reference.max() - reference.min()) if reference.size else 0.0
    return spec["atol"] + spec["range_fraction"] * value_range + spec["rtol"] * np.abs(reference)


def _sqnr_db(reference: np.ndarray, error: np.ndarray) -> float:
    signal, noise = float(np.sum(reference ** 2)), float(np.sum(error ** 2))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def compare(outcome: CaseOutcome) -> tuple[list[StepError], list[list[np.ndarray]]]:
    """Per-step error numbers and mismatch masks of device vs eager."""
    device = outcome.device_outputs()
    errors, masks = [], []
    for step, (got_row, want_row) in enumerate(zip(device, outcome.reference)):
        worst, sqnr, count, row_masks = 0.0, math.inf, 0, []
        for got, want in zip(got_row, want_row):
            got64, want64 = got.astype(np.float64), want.astype(np.float64)
            diff = np.abs(got64 - want64)
            mask = ~(diff <= _tolerance(outcome.case.dtype, want64))  # NaN counts as a mismatch
            row_masks.append(mask)
            worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
            sqnr = min(sqnr, _sqnr_db(want64, np.nan_to_num(got64 - want64, nan=1e30)))
            count += int(mask.sum())
        errors.append(StepError(step, worst, sqnr, count))
        masks.append(row_masks)
    return errors, masks


def initial_value_dependence(outcome: CaseOutcome) -> list[list[np.ndarray]]:
    """Which output elements depend on the buffers' registered initial values: eager run twice with
    two different initial values; elements that differ depend on them."""
    model = eager.build_model(outcome.case.card)
    buffers = dict(model.named_buffers())
    perturbed = {}
    for name in outcome.case.card.mutated_buffers:
        value = buffers[name]
        if value.is_floating_point():
            perturbed[name] = value + torch.linspace(1.5, 9.5, value.numel()).reshape(value.shape).to(value.dtype)
        else:
            perturbed[name] = value + 7
    other = eager.run_steps(outcome.case.card, outcome.steps, initial=perturbed)
    return [[~np.isclose(a, b, equal_nan=True) for a, b in zip(row_a, row_b)] for row_a, row_b in zip(outcome.reference, other)]


def _evidence(errors: list[StepError]) -> dict:
    return {"steps": [e.__dict__ for e in errors]}


def _classify(outcome: CaseOutcome, masks: list[list[np.ndarray]], errors: list[StepError], what: str) -> None:
    bad = [e for e in errors if e.mismatches]
    first = bad[0]
    line = (f"{what}: {sum(e.mismatches for e in bad)} element(s) out of tolerance in {len(bad)}/{len(errors)} step(s); "
            f"first at step {first.step}, max abs error {first.max_abs_error:.4g}, SQNR {first.sqnr_db:.1f} dB")
    dependence = initial_value_dependence(outcome)
    explained = all(not np.any(mask & ~dep) for mask_row, dep_row in zip(masks, dependence)
                    for mask, dep in zip(mask_row, dep_row))
    if explained and not outcome.case.skip_mutable_buffer:
        raise CheckFailure(line + "; every mismatch depends on the buffer's initial value", _evidence(errors),
                           UNINITIALISED_DELEGATED_BUFFER)
    raise CheckFailure(line, _evidence(errors), "state_mismatch")


def check_state(outcome: CaseOutcome) -> dict:
    """Step by step the device matches eager within the dtype's tolerance."""
    _require_run(outcome)
    errors, masks = compare(outcome)
    if any(e.mismatches for e in errors):
        _classify(outcome, masks, errors, "state differs from eager")
    return _evidence(errors)


def check_initial_state(outcome: CaseOutcome) -> dict:
    """Output elements that depend on the registered initial value match eager (the buffer started
    from that value on the device)."""
    _require_run(outcome)
    dependence = initial_value_dependence(outcome)
    if not any(mask.any() for row in dependence for mask in row):
        raise NotApplicable("no output element depends on the buffers' initial values")
    errors, masks = compare(outcome)
    only_dependent = [[mask & dep for mask, dep in zip(mask_row, dep_row)] for mask_row, dep_row in zip(masks, dependence)]
    wrong = sum(int(m.sum()) for row in only_dependent for m in row)
    if wrong:
        step_errors = [StepError(e.step, e.max_abs_error, e.sqnr_db, int(sum(m.sum() for m in row)))
                       for e, row in zip(errors, only_dependent)]
        first = next(e for e in step_errors if e.mismatches)
        message = (f"{wrong} output element(s) that depend on the registered initial value differ from eager, "
                   f"first at step {first.step}")
        if outcome.case.skip_mutable_buffer:
            raise CheckFailure(message, _evidence(step_errors), "initial_value_ignored")
        raise CheckFailure(message + "; the delegated buffer did not start from its registered value",
                           _evidence(step_errors), UNINITIALISED_DELEGATED_BUFFER)
    return {"dependent_elements": int(sum(m.sum() for row in dependence for m in row))}


def check_meta_llama_partitions(outcome: CaseOutcome) -> dict:
    """The Meta llama path (ConvertBmmToMatmul on) gives the card's expected partitions; the count
    with the pass off is recorded as evidence, not judged."""
    result = check_partitions(outcome)
    without = outcome.artifact.facts.get("partitions_without_convert_bmm", {})
    return {**result, "delegates_without_convert_bmm": len(without.get("delegates", []))}
