"""The six checks, plus the Meta llama partition check, as functions of a case's shared outcome.

Each is declared once with @check (harness/check_registry.py): its name, report column, whether it needs a
device run and the failure signatures it may raise. A check returns the numbers it looked at (for the
report) or raises CheckFailure with one line, its evidence and a signature, so the known-failures manifest
matches the kind of failure, not just the test id: a case that fails differently is a new failure.
Comparisons with eager live in harness/numerics.py and are computed once per case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import numpy as np

from harness import numerics
from harness.check_registry import CheckFailure, InfrastructureError, NotApplicable, NotMeasured, check
from harness.outcome import CaseOutcome, PatternReference
from harness.pipeline import cases, eager, mutbuf
from harness.pipeline.facts import PartitionFacts, QuantizeFacts
from harness.vocabulary import FLOAT_DTYPE, Mode

QNN_BACKEND = "QnnBackend"
# The delegated buffer did not start from its registered value (docs/FINDINGS.md#F1: QnnManager allocates
# it, never copies it in). Exact where the device's heap pattern is known: the device output equals eager
# started from that pattern in the delegated buffers. Loose elsewhere (phones): every mismatch is in an
# output element that depends on the initial value, and the message says "unconfirmed".
UNINITIALISED_DELEGATED_BUFFER = "uninitialised_delegated_buffer"
PARTITION_SIGNATURES = ("partition_count", "buffer_not_outside", "buffer_outside_delegate")


def _require_lowered(outcome: CaseOutcome) -> None:
    if not outcome.artifact.ok:
        error = outcome.artifact.facts.error
        raise CheckFailure(outcome.artifact.failure, {"traceback": error.traceback if error else ""}, "lowering_failed")


def _require_run(outcome: CaseOutcome) -> None:
    _require_lowered(outcome)
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


def _method_steps(outcome: CaseOutcome) -> dict[str, list[int]]:
    """Each method's steps, in plan order (a single-method card: forward at every step)."""
    card = outcome.case.card
    plan = card.step_methods(len(outcome.steps))
    return {
        method: [step for step, name in enumerate(plan) if name == method] for method in card.methods or ("forward",)
    }


def _per_method(outcome: CaseOutcome, judge: Callable[[str], dict]) -> dict:
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


def _method_writes(outcome: CaseOutcome, method: str) -> list[str]:
    """The buffers one method of a multi-method program writes (its exported program's buffers_to_mutate)."""
    export = outcome.artifact.facts.export
    if export is None or method not in export.methods:
        raise NotApplicable(f"the lowering's facts do not say what method {method} writes (lowered by an older suite)")
    return list(export.methods[method])


# 1 ------------------------------------------------------------------------------------------------
@check("export", short="exp", signatures=("buffers_to_mutate_mismatch",))
def check_export(outcome: CaseOutcome) -> dict:
    """The exported program mutates exactly the card's buffers."""
    facts = outcome.artifact.facts.export
    if facts is None:
        _require_lowered(outcome)
        raise CheckFailure("export facts missing although lowering succeeded", signature="lowering_failed")
    found, expected = sorted(facts.buffers_to_mutate), sorted(outcome.case.card.mutated_buffers)
    if found != expected:
        raise CheckFailure(
            f"exported buffers_to_mutate {found} != the card's mutated buffers {expected}",
            asdict(facts),
            "buffers_to_mutate_mismatch",
        )
    return {"buffers_to_mutate": found}


# 2 ------------------------------------------------------------------------------------------------
@check("annotation", short="ann", signatures=("buffer_annotated", "qdq_around_buffer", "buffer_reads_folded"))
def check_annotation(outcome: CaseOutcome) -> dict:
    """The quantizer leaves mutated buffers unannotated, with no q/dq around them and no reads folded; a
    multi-method case: in each method's quantized graph."""
    if outcome.case.dtype == FLOAT_DTYPE:
        raise NotApplicable("fp16 is not quantized: no annotations to check")
    facts = outcome.artifact.facts.quantize
    if facts is None:
        _require_lowered(outcome)
        raise CheckFailure("quantization facts missing although lowering succeeded", signature="lowering_failed")
    if outcome.case.card.multi_method:  # each method's quantized graph (harness/pipeline/stages.py quantize_multi)
        return _per_method(outcome, lambda method: _annotation(_method_quantize_facts(facts, method)))
    return _annotation(facts)


def _method_quantize_facts(facts: QuantizeFacts, method: str) -> QuantizeFacts:
    """One method's entries of a multi-method program's merged quantization facts, which quantize_multi
    prefixes with "METHOD: " (the op of an annotation or q/dq entry, the buffer of a folded read)."""
    prefix = f"{method}: "

    def own(entries: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{**e, "op": e["op"].removeprefix(prefix)} for e in entries if e["op"].startswith(prefix)]

    folded = {k.removeprefix(prefix): v for k, v in facts.folded_buffer_reads.items() if k.startswith(prefix)}
    return QuantizeFacts(own(facts.annotated_buffer_inputs), own(facts.qdq_around_buffers), folded)


def _annotation(facts: QuantizeFacts) -> dict:
    """The annotation rule on one quantized graph's facts."""
    evidence = asdict(facts)
    if facts.annotated_buffer_inputs:
        first = facts.annotated_buffer_inputs[0]
        raise CheckFailure(
            f"mutated buffer {first['buffer']} is annotated for quantization as an input of "
            f"{first['op']} ({len(facts.annotated_buffer_inputs)} annotation(s))",
            evidence,
            "buffer_annotated",
        )
    if facts.qdq_around_buffers:
        first = facts.qdq_around_buffers[0]
        raise CheckFailure(
            f"mutated buffer {first['buffer']} feeds {first['op']} after convert_pt2e", evidence, "qdq_around_buffer"
        )
    if facts.folded_buffer_reads:
        name, counts = next(iter(facts.folded_buffer_reads.items()))
        raise CheckFailure(
            f"convert_pt2e folded reads of mutated buffer {name} into constants "
            f"({counts['before']} reader(s) before, {counts['after']} after): its state is frozen "
            f"at the calibration value",
            evidence,
            "buffer_reads_folded",
        )
    return evidence


# 3 ------------------------------------------------------------------------------------------------
def _partitions(outcome: CaseOutcome) -> dict:
    _require_lowered(outcome)
    facts, card = outcome.artifact.facts.partitions, outcome.case.card
    if not card.multi_method:
        return _partition_rule(facts, card.expected_partitions, card.mutated_buffers, outcome.case.skip_mutable_buffer)
    # A multi-method card's expected_partitions counts the program's delegates, split evenly over its methods.
    expected, remainder = divmod(card.expected_partitions, len(card.methods))
    if remainder:
        raise NotApplicable(
            f"card {card.name}: expected_partitions {card.expected_partitions} does not split evenly over its "
            f"{len(card.methods)} methods: give a multiple of {len(card.methods)}"
        )

    def judge(method: str) -> dict:
        if method not in facts.methods:
            raise NotApplicable("the lowering's facts have no partitions of this method (lowered by an older suite)")
        writes = _method_writes(outcome, method)
        return _partition_rule(facts.methods[method], expected, writes, outcome.case.skip_mutable_buffer)

    return _per_method(outcome, judge)


def _partition_rule(facts: PartitionFacts, expected: int, mutated: tuple[str, ...] | list[str], skip: bool) -> dict:
    """The partition rule on one graph: `expected` QNN delegates, and the buffers it mutates (`mutated`)
    outside them with skip_mutable_buffer, inside them otherwise."""
    delegates = facts.delegates
    backends = sorted({d.backend for d in delegates})
    if len(delegates) != expected or backends != [QNN_BACKEND]:
        raise CheckFailure(
            f"{len(delegates)} delegate(s) {backends}, expected {expected} x "
            f"{QNN_BACKEND}; outside the delegates: {', '.join(facts.ops_outside) or 'nothing'}",
            asdict(facts),
            "partition_count",
        )
    outside = sorted(facts.buffers_outside)
    if skip and outside != sorted(mutated):
        raise CheckFailure(
            f"skip_mutable_buffer=True must keep {sorted(mutated)} outside the delegate "
            f"with its copy; outside are {outside}",
            asdict(facts),
            "buffer_not_outside",
        )
    if not skip and outside:
        raise CheckFailure(
            f"with buffer delegation, {outside} stayed outside the delegate "
            f"(ops outside: {', '.join(facts.ops_outside)})",
            asdict(facts),
            "buffer_outside_delegate",
        )
    return {"delegates": len(delegates), "ops_outside": facts.ops_outside, "buffers_outside": outside}


@check("partitions", short="part", signatures=PARTITION_SIGNATURES)
def check_partitions(outcome: CaseOutcome) -> dict:
    """One QNN delegate (or the card's count), with the buffers inside or outside as the mode says; a
    multi-method case: per method, its share of the card's count and the buffers that method writes."""
    return _partitions(outcome)


# 4 ------------------------------------------------------------------------------------------------
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
    _require_run(outcome)
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
    steps = _method_steps(outcome)
    graphs = sorted({str(r.get("graph")) for r in records})
    if records and not set(graphs) & set(card.methods):
        raise NotMeasured(
            f"the traced graphs {graphs} are none of the program's methods {list(card.methods)}: which method an "
            f"execute belongs to is unknown (executorch's QNN backend names a method's graph after it)"
        )

    def judge(method: str) -> dict:
        writes = _method_writes(outcome, method)
        if not skip and not writes:
            raise NotApplicable("it writes no buffer: no output address to pair with its input")
        own = [r for r in records if r.get("graph") == method]
        return _address_rule(own, len(steps[method]), len(writes), skip)

    return _per_method(outcome, judge)


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


# 5 and 6 --------------------------------------------------------------------------------------------
def _evidence(errors: list[numerics.StepError]) -> dict:
    return {"steps": [e.__dict__ for e in errors]}


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
                _evidence(errors),
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
                _evidence(errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
    raise CheckFailure(line, _evidence(errors), "state_mismatch")


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
    _require_run(outcome)
    if outcome.case.card.multi_method:
        return _state_per_method(outcome)
    comparison = outcome.comparison
    if comparison.mismatched:
        _classify(outcome, comparison, "state differs from eager")
    return _evidence(comparison.errors)


def _state_per_method(outcome: CaseOutcome) -> dict:
    own = _negated(_reads_other_methods(outcome))
    steps = _method_steps(outcome)
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

    return {**_per_method(outcome, judge), **_evidence(whole.errors)}


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


def _reads_other_methods(outcome: CaseOutcome) -> numerics.Outputs:
    """Output elements that read what another method wrote: where eager with each method on its own copy
    of the state (harness/pipeline/eager.py run_plan_isolated) differs from eager on one module at all, not
    beyond the dtype's tolerance (measured: a quantized tolerance took 1-2 elements a decode step that read
    prefill's small writes for decode's own, and state then judged them)."""
    isolated = eager.run_plan_isolated(outcome.case.card, outcome.steps, fresh_each_step=False)
    return [
        [~np.isclose(alone, shared, equal_nan=True) for alone, shared in zip(alone_row, shared_row)]
        for alone_row, shared_row in zip(isolated, outcome.reference)
    ]


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
    _require_run(outcome)
    if not outcome.case.card.multi_method:
        return _initial_rule(outcome, outcome.initial_value_dependence)
    own = numerics.only_where(outcome.initial_value_dependence, _negated(_reads_other_methods(outcome)))
    steps = _method_steps(outcome)
    return _per_method(outcome, lambda method: _initial_rule(outcome, _only_steps(own, steps[method][:1])))


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
            raise CheckFailure(message, _evidence(step_errors), "initial_value_ignored")
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
                _evidence(step_errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
        if unexplained is None or pattern.inconclusive:
            raise CheckFailure(
                message + f"; the delegated buffer did not start from its registered value "
                f"(unconfirmed: {_unconfirmed(pattern)})",
                _evidence(step_errors),
                UNINITIALISED_DELEGATED_BUFFER,
            )
        raise CheckFailure(
            message + f"; not the uninitialised-buffer defect: {unexplained} of them differ from eager "
            f"started from the heap pattern {pattern.description} too",
            _evidence(step_errors),
            "initial_value_ignored",
        )
    return {"dependent_elements": numerics.count(dependence)}


@check("meta_llama_partitions", short="llama", signatures=PARTITION_SIGNATURES, matrix=cases.meta_llama_matrix)
def check_meta_llama_partitions(outcome: CaseOutcome) -> dict:
    """executorch's Meta llama export flow (ConvertBmmToMatmul on, as it ships) gives the card's expected
    partitions; what the flow gives with the pass off is recorded as evidence, not judged."""
    facts = outcome.artifact.facts
    without = facts.partitions_without_convert_bmm
    recorded = {
        "delegates_without_convert_bmm": len(without.delegates) if without else None,
        "without_convert_bmm_error": facts.without_convert_bmm_error,
    }
    try:
        result = _partitions(outcome)
    except CheckFailure as failure:
        off = (
            f"{len(without.delegates)} delegate(s)"
            if without
            else f"no lowering ({facts.without_convert_bmm_error})"
            if facts.without_convert_bmm_error
            else "not recorded"
        )
        raise CheckFailure(
            f"{failure} (with ConvertBmmToMatmul off: {off})", {**failure.evidence, **recorded}, failure.signature
        ) from None
    return {**result, **recorded}


# runner_parity -------------------------------------------------------------------------------------
# The device runners, by their payload command names (harness/device/payload.py; the checks are carried into
# reproduction bundles, which have no device package, so the names are spelled here and a harness test keeps
# them equal): the suite's compiled runner (suite_runner.cpp, a step plan in one process) runs every case;
# upstream's qnn_executor_runner is the reference (on emulated devices executorch's Python pybindings, on a
# phone the user's own build).
COMPILED_RUNNER = "suite_runner"
REFERENCE_RUNNER = "qnn_executor_runner"
# The card the parity check runs on: the first of these the run has (a run of other cards, --models, takes
# its first card). KV caches that read only rows written during the run (two buffers written at the same
# step, else one): a card that reads an uninitialised delegated buffer (docs/FINDINGS.md#F1) gives each
# process its heap's bytes, so two runners could differ by that defect, not by a runner's (a phone's heap has
# no fixed fill).
PARITY_CARDS = ("kv_pair_gather_written", "kv_gather_written")


def _parity_matrix(cards: list, dtypes: tuple[str, ...], socs: list[str]) -> list:
    """The few cases runner_parity runs on: one card, twice a SoC: fp16 with the buffer in the delegate (float,
    bit-equal, the delegate's own state) and the run's first quantized dtype with the buffer outside it (the
    copy and quantize ops then run in each runner's kernel libraries, where two runners may differ); a run
    without one of the two dtypes takes the other. Why so few: the reference is a second device run per case
    that holds the device, on an emulated device a fresh pybindings Python in its jail: measured 3.8-7.0 s
    (2.2-2.8 s CPU) on a quiet machine and 7.1-13.0 s on a busy one, against 0.1-0.3 s for the compiled
    runner. Four a SoC cost 44 s of device time on the busy machine, a tenth of a cold one-SoC run
    (PERFORMANCE.md: about 400 s a SoC); two keep it near a twentieth. On a phone the reference is the
    user's qnn_executor_runner, a process per run like the compiled one."""
    quantized = next((dtype for dtype in dtypes if dtype != FLOAT_DTYPE), None)
    delegated = FLOAT_DTYPE if FLOAT_DTYPE in dtypes else quantized
    wanted = {(delegated, Mode.DELEGATE), (quantized or FLOAT_DTYPE, Mode.SKIP)}
    standard = [case for case in cases.matrix(cards, dtypes, socs) if (case.dtype, case.mode) in wanted]
    present = {case.card.name for case in standard}
    name = next((name for name in PARITY_CARDS if name in present), standard[0].card.name if standard else None)
    return [case for case in standard if case.card.name == name]


def runner_differences(
    ours: list[list[np.ndarray]], theirs: list[list[np.ndarray]], like: list[list[np.ndarray]]
) -> list[dict]:
    """Every (step, output) whose bytes differ between two runs' raw outputs, in plan order: how many
    elements differ and the largest absolute difference, read with eager's dtype (`like`) for the numbers."""
    found = []
    for step, (row, other_row) in enumerate(zip(ours, theirs)):
        for index, (raw, other) in enumerate(zip(row, other_row)):
            if raw.nbytes == other.nbytes and np.array_equal(raw, other):
                continue
            dtype = like[step][index].dtype
            if raw.nbytes != other.nbytes or raw.nbytes % dtype.itemsize:
                found.append(
                    {
                        "step": step,
                        "output": index,
                        "elements": None,
                        "differing": None,
                        "max_abs": None,
                        "bytes": [int(raw.nbytes), int(other.nbytes)],
                    }
                )
                continue
            a, b = raw.view(dtype), other.view(dtype)
            differing = (raw.view(np.uint8).reshape(a.size, -1) != other.view(np.uint8).reshape(b.size, -1)).any(axis=1)
            with np.errstate(invalid="ignore", over="ignore"):
                gaps = np.abs(a[differing].astype(np.float64) - b[differing].astype(np.float64))
            found.append(
                {
                    "step": step,
                    "output": index,
                    "elements": int(a.size),
                    "differing": int(differing.sum()),
                    "max_abs": float(np.max(gaps)) if gaps.size else 0.0,
                    "bytes": [int(raw.nbytes)] * 2,
                }
            )
    return found


@check(
    "runner_parity",
    short="par",
    needs_device=True,
    signatures=("runner_outputs_differ", "reference_runner_failed"),
    matrix=_parity_matrix,
    reference_runner=REFERENCE_RUNNER,
)
def check_runner_parity(outcome: CaseOutcome) -> dict:
    """The same program and inputs through the suite's compiled runner (the case's device run) and through
    the reference runner on a device of the same SoC (emulated: executorch's Python pybindings; a phone: the
    user's qnn_executor_runner) give equal outputs at every step. Tolerance: bit-equal in every dtype, the
    quantized ones too: both runners load the same program and the same QNN libraries and hand the delegate
    the same input bytes, so any difference is a runner defect (a finding, never a tolerance to widen).
    Runs on a few cases only (_parity_matrix): the reference is a fresh Python per run."""
    _require_run(outcome)
    ours = outcome.run
    if ours.runner != COMPILED_RUNNER:
        hint = outcome.device.suite_runner_hint if outcome.device is not None else ""
        fix = hint or "this device's payload has no suite_runner"
        raise NotMeasured(f"this device ran the case through {ours.runner}, not the suite's compiled runner: {fix}")
    other = outcome.reference_run
    if other is None:
        raise NotMeasured(f"no {REFERENCE_RUNNER} run of this case to compare with: run the suite on a device")
    if other.run is None and other.infrastructure:
        raise InfrastructureError(other.error)
    devices = {COMPILED_RUNNER: outcome.device_serial, REFERENCE_RUNNER: other.device_serial}
    if other.run is None:
        raise CheckFailure(
            f"the reference runner {REFERENCE_RUNNER} failed where {COMPILED_RUNNER} ran: {other.error}",
            {"devices": devices},
            "reference_runner_failed",
        )
    differences = runner_differences(ours.outputs, other.run.outputs, outcome.reference)
    evidence = {
        "tolerance": "bit-equal",
        "step_count": len(ours.outputs),  # not "steps": report.json's schema keeps that name for per-step lists
        "devices": devices,
        "reference_run_s": other.seconds,
        "differences": differences[:64],
    }
    if len(other.run.outputs) != len(ours.outputs):
        raise CheckFailure(
            f"{COMPILED_RUNNER} gave {len(ours.outputs)} step(s), {REFERENCE_RUNNER} {len(other.run.outputs)}",
            evidence,
            "runner_outputs_differ",
        )
    if differences:
        first = differences[0]
        what = (
            f"{first['differing']} of {first['elements']} element(s) differ, max abs difference {first['max_abs']:.6g}"
            if first["elements"] is not None
            else f"{first['bytes'][0]} vs {first['bytes'][1]} bytes"
        )
        raise CheckFailure(
            f"step {first['step']} output {first['output']}: {COMPILED_RUNNER} (compiled, on {devices[COMPILED_RUNNER]}) "
            f"and {REFERENCE_RUNNER} (reference, on {devices[REFERENCE_RUNNER]}) differ: {what} "
            f"({len(differences)} differing output(s) in all; tolerance: bit-equal)",
            evidence,
            "runner_outputs_differ",
        )
    return evidence


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
    _require_run(outcome)
    plan = card.step_methods(len(outcome.steps))
    device, dtype, comparison = outcome.device_outputs(), outcome.case.dtype, outcome.comparison
    encodings = _encoding_difference(outcome)
    carried = _quantized_models(outcome).get("carried")
    modelled = numerics.compare(carried, outcome.reference, dtype) if carried is not None else None
    evidence = {
        "plan": plan,
        **_evidence(comparison.errors),
        **({"encoding_difference": encodings} if encodings else {}),
        **({"modelled_steps": [e.__dict__ for e in modelled.errors]} if modelled is not None else {}),
    }
    if not comparison.mismatched:
        return evidence
    crossing = _reads_other_methods(outcome)
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
        numerics.only_where(comparison.masks, _negated(crossing))
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


def _negated(masks: numerics.Outputs) -> numerics.Outputs:
    return [[~mask for mask in row] for row in masks]


from harness import driver_checks  # noqa: E402, F401  (the driver checks, registered after these)
