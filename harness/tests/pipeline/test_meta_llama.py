"""executorch's Meta llama export flow as it ships (export_llama_lib with QNN options, a params file and
random weights): one QNN partition with ConvertBmmToMatmul on, which is what the seed restored it for.

The flow lowers the tiny llama a second time with the pass made a no-op; a quantized case judged on
that lowering must fail with both partition counts in its message (the check can fail), and the
flow must not need the deprecated legacy export.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures import llama  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure
from harness.checks import meta_llama_partitions
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, meta_llama
from harness.pipeline.lower import lower_case
from harness.vocabulary import Case, Mode

CARD = "fixtures.llama:meta_llama_1layer"


def test_the_flow_has_and_needs_no_legacy_export(tmp_path):
    from executorch.examples.models.llama import export_llama_lib

    options = {action.dest for action in export_llama_lib.build_args_parser()._actions}
    assert "use_legacy_export" not in options
    assert meta_llama.config(1, "16a4w", "SM8650", tmp_path).backend.qnn.enabled


@pytest.fixture(scope="module")
def lowered_16a4w(toolchain, tmp_path_factory) -> CaseOutcome:
    card = cards.find(CARD)
    case = Case(card, "16a4w", Mode.META_LLAMA, "SM8650")
    artifact = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), 4)
    assert artifact.ok, artifact.failure
    return CaseOutcome(case, card.steps(4), artifact, reference=[])


def test_one_partition_with_the_pass_and_the_count_without_it_recorded(lowered_16a4w):
    result = meta_llama_partitions.check_meta_llama_partitions(lowered_16a4w)
    assert result["delegates"] == 1
    assert result["delegates_without_convert_bmm"] > 1, "the pass is what keeps the quantized llama in one partition"
    assert result["buffers_outside"] == sorted(meta_llama.mutated_buffers(1)), "the flow keeps the KV caches outside"


def test_with_the_pass_disabled_the_quantized_case_fails_with_the_counts(lowered_16a4w):
    facts = lowered_16a4w.artifact.facts
    without = facts.partitions_without_convert_bmm
    disabled = replace(
        lowered_16a4w, artifact=replace(lowered_16a4w.artifact, facts=replace(facts, partitions=without))
    )
    count = len(without.delegates)
    with pytest.raises(
        CheckFailure,
        match=rf"^{count} delegate\(s\) .*expected 1 x QnnBackend.*"
        rf"with ConvertBmmToMatmul off: {count} delegate\(s\)",
    ) as failure:
        meta_llama_partitions.check_meta_llama_partitions(disabled)
    assert failure.value.signature == "partition_count"
