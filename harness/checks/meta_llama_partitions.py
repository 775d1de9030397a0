"""Partitions of the cards lowered through executorch's Meta llama export flow (ConvertBmmToMatmul on, as
it ships), with what the flow gives with the pass off recorded as evidence."""

from __future__ import annotations

from harness.check_registry import CheckFailure, check
from harness.checks.lowering import PARTITION_SIGNATURES, partition_evidence
from harness.outcome import CaseOutcome
from harness.pipeline import cases


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
        result = partition_evidence(outcome)
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
