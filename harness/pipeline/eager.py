"""The eager PyTorch reference: the same module the lowering child builds, run step by step."""
from __future__ import annotations

import numpy as np
import torch

from harness.pipeline.card import ModelCard


def build_model(card: ModelCard) -> torch.nn.Module:
    """Seeded so the lowering child and the reference get identical weights; inference only (a
    parameter that requires grad breaks executorch's passes that replay in-place buffer copies)."""
    torch.manual_seed(0)
    return card.build().eval().requires_grad_(False)


def _flat_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    flat = []
    for item in result:
        flat.extend(_flat_outputs(item))
    return flat


def run_steps(card: ModelCard, steps: list[tuple], initial: dict[str, torch.Tensor] | None = None) -> list[list[np.ndarray]]:
    """Outputs per step; `initial` overrides registered buffer values (used to find which output
    elements depend on a buffer's initial value)."""
    model = build_model(card)
    if initial:
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for name, value in initial.items():
                buffers[name].copy_(value)
    with torch.no_grad():
        return [[t.detach().clone().numpy() for t in _flat_outputs(model(*inputs))] for inputs in steps]
