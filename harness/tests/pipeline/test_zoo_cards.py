"""The zoo's own contract, checked in eager PyTorch and torch.export only (no QNN, no lowering).

A card whose declared buffers differ from what export mutates, whose state never changes, or whose
output ignores its state would make every conformance check built on it meaningless; these tests
catch that before anything is lowered.
"""

from __future__ import annotations

import pytest
import torch

from fixtures import families, llama, zoo
from harness.pipeline.card import ModelCard, cards, find

STEPS = 3
MODULES = (zoo.__name__, llama.__name__, families.__name__)
REQUIRED_TAGS = {"kv", "counter", "nonzero_init", "reads_written_only", "two_buffers", "llama"}
ZOO_CARDS = [card for card in cards() if card.module in MODULES]


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer.detach().clone() for name, buffer in model.named_buffers()}


def _run(card: ModelCard, lose_updates: bool) -> list[torch.Tensor]:
    """Eager outputs per step; with lose_updates the mutated buffers are reset before every step."""
    model = card.build().eval()
    initial = _snapshot(model)
    buffers = dict(model.named_buffers())
    outputs = []
    with torch.no_grad():
        for inputs in card.steps(STEPS):
            if lose_updates:
                for name in card.mutated_buffers:
                    buffers[name].copy_(initial[name])
            outputs.append(model(*inputs).clone())
    return outputs


def test_zoo_has_enough_cards_and_the_required_tags():
    plain = [card for card in ZOO_CARDS if "llama" not in card.tags]
    assert len(plain) >= 12, [card.name for card in plain]
    assert REQUIRED_TAGS <= set().union(*(card.tags for card in ZOO_CARDS))
    assert any({"two_buffers", "reads_written_only"} <= card.tags for card in ZOO_CARDS)
    assert all(find(card.reference) is card and card.expected_partitions >= 1 for card in ZOO_CARDS), (
        "a lowering child finds cards again by module:name"
    )


@pytest.mark.parametrize("card", ZOO_CARDS, ids=lambda card: card.name)
def test_declared_buffers_are_exactly_the_exported_mutations(card):
    program = torch.export.export(card.build().eval(), card.steps(1)[0]).run_decompositions({})
    assert set(program.graph_signature.buffers_to_mutate.values()) == set(card.mutated_buffers)


@pytest.mark.parametrize("card", ZOO_CARDS, ids=lambda card: card.name)
def test_state_changes_every_step_and_only_in_declared_buffers(card):
    model = card.build().eval()
    assert set(card.mutated_buffers) <= dict(model.named_buffers()).keys()
    before = _snapshot(model)
    changed_ever: set[str] = set()
    with torch.no_grad():
        for step, inputs in enumerate(card.steps(STEPS)):
            model(*inputs)
            after = _snapshot(model)
            changed = {name for name in after if not torch.equal(after[name], before[name])}
            assert changed, f"step {step} changed no buffer"
            assert changed <= set(card.mutated_buffers), f"undeclared buffers changed: {changed}"
            changed_ever |= changed
            before = after
    assert changed_ever == set(card.mutated_buffers)


@pytest.mark.parametrize("card", ZOO_CARDS, ids=lambda card: card.name)
def test_steps_are_deterministic_and_a_lost_update_is_visible(card):
    assert all(
        torch.equal(a, b) for first, second in zip(card.steps(STEPS), card.steps(STEPS)) for a, b in zip(first, second)
    )
    kept, lost = _run(card, lose_updates=False), _run(card, lose_updates=True)
    assert not all(torch.equal(a, b) for a, b in zip(kept, lost)), "the output ignores state carried between steps"
