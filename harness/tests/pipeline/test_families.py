"""The card families (fixtures/families.py): what each family promises beyond the zoo's eager
contract (harness/tests/pipeline/test_zoo_cards.py runs that over them too), and the manifest entries of
their findings (docs/FINDINGS.md#families): each matches the failure the suite measured and not a
neighbouring one. No lowering, no device: eager PyTorch, torch.export and the verdict path."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import harness.checks  # noqa: F401  (registers the checks' signatures, which the manifest is checked against)
from fixtures import families
from harness.check_registry import CheckFailure
from harness.known_failures import matching
from harness.pipeline import eager
from harness.pipeline.card import ModelCard, cards
from harness.pipeline.facts import LoweringError, LoweringFacts
from harness.pipeline.lower import LoweredArtifact
from harness.verdicts import decide
from harness.vocabulary import DTYPES, FLOAT_DTYPE, Case, Mode, Verdict

FAMILY_CARDS = [card for card in cards() if card.module == families.__name__]
STEPS = 4  # the suite's default (harness/options.py DEFAULT_STEPS): the windows fill exactly


def _depends_on_initial_values(card: ModelCard) -> bool:
    steps = card.steps(STEPS)
    reference = eager.run_steps(card, steps)
    return any(bool(np.any(mask)) for row in eager.initial_value_dependence(card, steps, reference) for mask in row)


def test_every_family_is_present_in_fp16_and_narrowed_dtypes_are_known_ones():
    tags = set().union(*(card.tags for card in FAMILY_CARDS))
    assert {"indirect_write", "shift_window", "roll", "cache4d", "index_copy", "index_put", "smart_mask"} <= tags
    assert all(FLOAT_DTYPE in card.dtypes and set(card.dtypes) <= set(DTYPES) for card in FAMILY_CARDS)
    axes = {card.name: card.build().axes for card in FAMILY_CARDS if "cache4d" in card.tags}
    for op in ("index_copy", "index_put"):
        assert sorted(axis for name, found in axes.items() if op in name for axis in found) == [0, 1, 2, 3]


@pytest.mark.parametrize("card", FAMILY_CARDS, ids=lambda card: card.name)
def test_a_family_card_reads_only_state_written_during_the_run(card):
    """So the delegated buffer's missing initial value (F1) cannot hide what the family shows."""
    assert "reads_written_only" in card.tags
    assert not _depends_on_initial_values(card)


def test_reading_only_written_state_is_a_property_that_can_fail():
    """A window card fed an all-ones `valid` reads its registered zeros in early steps: caught."""
    window = next(card for card in FAMILY_CARDS if card.name == "shift_window_cat_slice")

    def unmasked(n: int) -> list[tuple[torch.Tensor, ...]]:
        return [(x, torch.ones_like(valid)) for x, valid in window.steps(n)]

    broken = ModelCard(
        name="shift_window_unmasked", build=window.build, steps=unmasked, mutated_buffers=window.mutated_buffers
    )
    assert _depends_on_initial_values(broken)


def _direct_users_of(card: ModelCard, buffer: str) -> set[str]:
    program = torch.export.export(card.build().eval(), card.steps(1)[0]).run_decompositions({})
    placeholder = next(name for name, target in program.graph_signature.inputs_to_buffers.items() if target == buffer)
    node = next(node for node in program.graph.nodes if node.name == placeholder)
    return {str(user.target) for user in node.users}


def test_the_indirect_write_family_writes_its_buffer_through_a_cat_never_directly():
    """The shape of upstream #21855 / #22172 / #22296 (PR #21979): the buffer's only direct user is a cat;
    a direct in-place write (the zoo's counter) would have the mutation as its user."""
    conv = next(card for card in FAMILY_CARDS if card.name == "conv_state_cat_copy")
    assert _direct_users_of(conv, "conv_state") == {"aten.cat.default"}
    from fixtures import zoo  # noqa: F401  (registers the zoo's cards)

    counter = next(card for card in cards() if card.name == "counter_add")
    assert _direct_users_of(counter, "state") != {"aten.cat.default"}


def test_the_roll_cards_differ_only_in_how_the_last_axis_is_spelled():
    window = torch.rand(1, families.CHANNELS, families.WINDOW)
    positive, negative = families.ShiftWindowRoll(2), families.ShiftWindowRoll(-1)
    for module in (positive, negative):
        module.window.copy_(window)
    x, valid = families._column_steps(1)[0]
    assert torch.equal(positive(x, valid), negative(x, valid))


# --- the manifest entries of the families' findings ------------------------------------------------

SCATTER_ND = (
    "lowering failed: AssertionError: Failed to generate Qnn context binary. (QNN: [ERROR] [Qnn ExecuTorch]: "
    "graph_prepare.cc:211::ERROR:could not create op: q::ScatterNd.tcm)"
)
DECOMPOSE_ROLL = (
    "lowering failed: Exception: An error occurred when running the 'DecomposeRoll' pass after the following "
    "passes: ['DecomposeReciprocal', 'DecomposeAsStrided']"
)
# (test name, the failure measured on 2026-12-03, a neighbouring failure the entry must not explain)
MEASURED = [
    (
        "test_state[cache4d_index_copy_axis3-fp16-delegate_mutbuf-SM8650]",
        CheckFailure(SCATTER_ND, signature="lowering_failed"),
        CheckFailure(SCATTER_ND.replace("ScatterNd", "Concat"), signature="lowering_failed"),
    ),
    (
        "test_partitions[cache4d_index_put_axis3-fp16-skip_mutbuf-SM8650]",
        CheckFailure(SCATTER_ND, signature="lowering_failed"),
        CheckFailure(
            "lowering failed: AssertionError: Failed to generate Qnn context binary.", signature="lowering_failed"
        ),
    ),
    (
        "test_address_sharing[shift_window_roll_negative_dim-fp16-delegate_mutbuf-SM8650]",
        CheckFailure(DECOMPOSE_ROLL, signature="lowering_failed"),
        CheckFailure(DECOMPOSE_ROLL.replace("DecomposeRoll", "DecomposeRemainder"), signature="lowering_failed"),
    ),
    (
        "test_annotation[conv_state_cat_copy-16a4w-skip_mutbuf-SM8650]",
        CheckFailure(
            "mutated buffer conv_state is annotated for quantization as an input of aten.cat.default (2 annotation(s))",
            signature="buffer_annotated",
        ),
        CheckFailure(
            "mutated buffer conv_state feeds quantize_per_tensor after convert_pt2e", signature="qdq_around_buffer"
        ),
    ),
    (
        "test_annotation[shift_window_roll-16a8w-delegate_mutbuf-SM8650]",
        CheckFailure(
            "mutated buffer window is annotated for quantization as an input of aten.slice.Tensor (3 annotation(s))",
            signature="buffer_annotated",
        ),
        CheckFailure(
            "mutated buffer window is annotated for quantization as an input of aten.mul.Tensor (1 annotation(s))",
            signature="buffer_annotated",
        ),
    ),
    (
        "test_state[shift_window_roll-16a8w-skip_mutbuf-SM8650]",
        CheckFailure("state differs from eager: 40 element(s) out of tolerance", signature="state_mismatch"),
        CheckFailure(
            "lowering failed: AssertionError: Failed to generate Qnn context binary.", signature="lowering_failed"
        ),
    ),
    (
        "test_state[smart_mask_attention-8a8w-delegate_mutbuf-SM8650]",
        CheckFailure("state differs from eager: 7 element(s) out of tolerance", signature="state_mismatch"),
        CheckFailure("state matches the heap pattern", signature="uninitialised_delegated_buffer"),
    ),
]


@pytest.mark.parametrize("name, measured, neighbour", MEASURED, ids=[row[0] for row in MEASURED])
def test_a_family_finding_is_expected_exactly(name, measured, neighbour):
    expected = matching(name)
    assert decide(measured, expected, name)[0] is Verdict.XFAILED
    assert decide(neighbour, expected, name)[0] is Verdict.FAILED


@pytest.mark.parametrize(
    "name",
    [
        "test_state[cache4d_index_copy_axes012-fp16-delegate_mutbuf-SM8650]",  # the other axes lower
        "test_state[shift_window_roll-fp16-delegate_mutbuf-SM8650]",  # dims=2 lowers
        "test_state[smart_mask_attention-16a8w-delegate_mutbuf-SM8650]",  # 16-bit is within tolerance
        "test_export[cache4d_index_put_axis3-fp16-skip_mutbuf-SM8650]",  # export passes before lowering fails
    ],
)
def test_family_cases_that_pass_have_no_entry(name):
    assert matching(name) == []


def test_a_lowering_failure_names_the_qnn_error_its_signature_matches_on(tmp_path: Path):
    """executorch says only "Failed to generate Qnn context binary."; the QNN line says which op failed."""
    card = FAMILY_CARDS[0]
    facts = LoweringFacts(error=LoweringError("AssertionError", "Failed to generate Qnn context binary."))
    artifact = partial(LoweredArtifact, Case(card, FLOAT_DTYPE, Mode.SKIP, "SM8650"), tmp_path, facts, "", 1.0)
    qnn = "[ERROR] [Qnn ExecuTorch]: graph_prepare.cc:211::ERROR:could not create op: q::ScatterNd.tcm"
    assert artifact([qnn, "[ERROR] later"]).failure == SCATTER_ND
    assert artifact([]).failure == "lowering failed: AssertionError: Failed to generate Qnn context binary."
