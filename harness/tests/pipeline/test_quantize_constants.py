"""Quantization resets the card's state around calibration and nothing else: QnnQuantizer's prepare rewrites a
constant buffer's infinities in place (a decoder's additive causal mask: -inf becomes the quantizer's range),
and a constant given its -inf back is observed as -inf, an infinite scale QNN refuses at lowering ("Output def
has a bad scale": every quantized llama slice once failed so)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.pipeline import stages
from harness.vocabulary import ModelCard

ROWS = 4


class MaskedCache(torch.nn.Module):
    """A cache written one row per step and read through an additive causal mask (0 up to the position, -inf
    after it), as the llama slices read theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(ROWS, ROWS))
        self.register_buffer("mask", torch.triu(torch.full((ROWS, ROWS), float("-inf")), diagonal=1))

    def forward(self, position: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(0, position, value)
        return (self.cache.sum(dim=1) + self.mask[position][0]).softmax(dim=0)


def _steps(n: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.tensor([step % ROWS]), torch.rand(1, ROWS, generator=generator)) for step in range(n)]


MASKED = ModelCard("masked_cache", MaskedCache, _steps, ("cache",), dtypes=("16a8w",))


def _scales(converted: torch.fx.GraphModule) -> list[float]:
    return [
        float(node.args[1])
        for node in converted.graph.nodes
        if node.op == "call_function" and "quantize_per_tensor" in str(node.target)
    ]


@pytest.mark.qnn
def test_a_constant_the_quantizer_rewrote_keeps_its_finite_encoding(toolchain):
    """The mask's encoding is finite (broken: every buffer restored after prepare gives it an infinite scale);
    the state still starts the device from its registered zeros, and the eager model keeps its mask."""
    model = MaskedCache()
    converted, _, _ = stages.quantize(MASKED, model, "16a8w", MASKED.steps(ROWS))
    scales = _scales(converted["forward"])
    assert scales and all(math.isfinite(scale) for scale in scales), scales
    assert dict(converted["forward"].named_buffers())["cache"].count_nonzero() == 0
    assert model.cache.count_nonzero() == 0


@pytest.mark.qnn
def test_the_broken_reset_is_what_the_test_catches(toolchain, monkeypatch):
    """Every buffer reset after prepare (the defect) gives an infinite scale, so the test above can fail."""
    original = stages._prepare

    def prepare_then_reset_every_buffer(card, module, dtype, example):
        initial = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
        prepared, before = original(card, module, dtype, example)
        stages._restore_buffers(prepared, initial)
        return prepared, before

    monkeypatch.setattr(stages, "_prepare", prepare_then_reset_every_buffer)
    converted, _, _ = stages.quantize(MASKED, MaskedCache(), "16a8w", MASKED.steps(ROWS))
    assert any(math.isinf(scale) for scale in _scales(converted["forward"]))
