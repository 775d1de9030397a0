"""What lowering made of a card, judged from the lowering's facts alone (no device run): export (the
exported program mutates exactly the card's buffers), annotation (the quantizer leaves mutated buffers
unannotated) and partitions (one QNN delegate, buffers inside or outside as the mode says)."""

from __future__ import annotations

from dataclasses import asdict

from harness.check_registry import CheckFailure, NotApplicable, check
from harness.checks.common import (
    method_writes,
    per_method,
    require_lowered,
)
from harness.outcome import CaseOutcome
from harness.pipeline.facts import PartitionFacts, QuantizeFacts
from harness.vocabulary import FLOAT_DTYPE

QNN_BACKEND = "QnnBackend"
PARTITION_SIGNATURES = ("partition_count", "buffer_not_outside", "buffer_outside_delegate")


@check("export", short="exp", signatures=("buffers_to_mutate_mismatch",))
def check_export(outcome: CaseOutcome) -> dict:
    """The exported program mutates exactly the card's buffers."""
    facts = outcome.artifact.facts.export
    if facts is None:
        require_lowered(outcome)
        raise CheckFailure("export facts missing although lowering succeeded", signature="lowering_failed")
    found, expected = sorted(facts.buffers_to_mutate), sorted(outcome.case.card.mutated_buffers)
    if found != expected:
        raise CheckFailure(
            f"exported buffers_to_mutate {found} != the card's mutated buffers {expected}",
            asdict(facts),
            "buffers_to_mutate_mismatch",
        )
    return {"buffers_to_mutate": found}


@check("annotation", short="ann", signatures=("buffer_annotated", "qdq_around_buffer", "buffer_reads_folded"))
def check_annotation(outcome: CaseOutcome) -> dict:
    """The quantizer leaves mutated buffers unannotated, with no q/dq around them and no reads folded; a
    multi-method case: in each method's quantized graph."""
    if outcome.case.dtype == FLOAT_DTYPE:
        raise NotApplicable("fp16 is not quantized: no annotations to check")
    facts = outcome.artifact.facts.quantize
    if facts is None:
        require_lowered(outcome)
        raise CheckFailure("quantization facts missing although lowering succeeded", signature="lowering_failed")
    if outcome.case.card.multi_method:  # each method's quantized graph (harness/pipeline/stages.py quantize)
        return per_method(outcome, lambda method: _annotation(_method_quantize_facts(facts, method)))
    return _annotation(facts)


def _method_quantize_facts(facts: QuantizeFacts, method: str) -> QuantizeFacts:
    """One method's entries of a multi-method program's merged quantization facts, which stages.quantize
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


def partition_evidence(outcome: CaseOutcome) -> dict:
    require_lowered(outcome)
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
        writes = method_writes(outcome, method)
        return _partition_rule(facts.methods[method], expected, writes, outcome.case.skip_mutable_buffer)

    return per_method(outcome, judge)


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
    return partition_evidence(outcome)
