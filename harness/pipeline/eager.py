"""The eager PyTorch reference: the same module the lowering child builds, run step by step.

Results are kept per process: a card's eager outputs are the same for each of its dtypes, modes and SoCs
(16 cases of the default matrix), and building a model (a llama flow's imports and source transforms) was a
fifth of a warm run's work when each case did it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import numpy as np
import torch

from harness.pipeline.card import ModelCard

Outputs = list[list[np.ndarray]]  # [step][output index]
_OUTPUTS: dict[tuple[ModelCard, str, str], Outputs] = {}
_BUFFERS: dict[ModelCard, dict[str, torch.Tensor]] = {}


def build_model(card: ModelCard) -> torch.nn.Module:
    """Seeded so the lowering child and the reference get identical weights; inference only (a
    parameter that requires grad breaks executorch's passes that replay in-place buffer copies)."""
    torch.manual_seed(0)
    return card.build().eval().requires_grad_(False)


def registered_buffers(card: ModelCard) -> dict[str, torch.Tensor]:
    """The card's buffers as its model registers them (copies: the caller may change them)."""
    if card not in _BUFFERS:
        _BUFFERS[card] = {name: value.detach().clone() for name, value in build_model(card).named_buffers()}
    return {name: value.clone() for name, value in _BUFFERS[card].items()}


def _flat_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    flat = []
    for item in result:
        flat.extend(_flat_outputs(item))
    return flat


def _digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The tensors by name, dtype, shape and bytes: what a memoised eager run is keyed by."""
    digest = hashlib.sha256()
    for name, tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            digest.update(f"{name}\0{tensor!r}\0".encode())
            continue
        value = tensor.detach().contiguous().cpu()
        digest.update(f"{name}\0{value.dtype}\0{tuple(value.shape)}\0".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_steps(card: ModelCard, steps: list[tuple], initial: dict[str, torch.Tensor] | None = None) -> Outputs:
    """Outputs per step, read-only (they are shared: computed once per card, steps and initial values in
    a process); `initial` overrides registered buffer values (used to find which output elements depend
    on a buffer's initial value)."""
    key = (
        card,
        _digest((f"{step}.{index}", tensor) for step, row in enumerate(steps) for index, tensor in enumerate(row)),
        _digest(sorted((initial or {}).items())),
    )
    if key not in _OUTPUTS:
        model = build_model(card)
        if initial:
            buffers = dict(model.named_buffers())
            with torch.no_grad():
                for name, value in initial.items():
                    buffers[name].copy_(value)
        methods = card.step_methods(len(steps))
        with torch.no_grad():
            outputs = [
                [t.detach().clone().numpy() for t in _flat_outputs(_call(model, method, inputs))]
                for method, inputs in zip(methods, steps)
            ]
        _OUTPUTS[key] = read_only(outputs)
    return _OUTPUTS[key]


def _call(model: torch.nn.Module, method: str, inputs: tuple):
    """One step: forward through the module's call (hooks included), another method by name."""
    return model(*inputs) if method == "forward" else getattr(model, method)(*inputs)


# How a runtime may carry a multi-method program's state between steps: "carried" is the user's intent (what
# one method writes, the next reads), the others are ways to lose it. Each is computed by the same body
# (run_plan_as), on eager's module or on the quantized CPU programs (harness/pipeline/prepared.py), and the
# cross_method_state check names the ones the device equals.
STATE_MODELS = ("carried", "reset", "per_method", "constant_read")
STATE_MODEL_WORDS = {
    "carried": "the state carried across methods",
    "reset": "every step started from the registered values (no state survived a step)",
    "per_method": "each method on its own copy of the state",
    "constant_read": "each method reading the buffers it does not write as constants (their registered values)",
}


def run_plan_as(
    fresh: Callable[[str], torch.nn.Module],
    call: Callable[[torch.nn.Module, str, tuple], object],
    plan: list[str],
    steps: list[tuple],
    model: str,
    buffers: tuple[str, ...],
    writes: dict[str, list[str]] | None = None,
    initial: dict[str, torch.Tensor] | None = None,
) -> Outputs:
    """The plan's outputs as a runtime of the named STATE_MODELS kind computes them. fresh(method): a module
    that runs `method` (call(module, method, inputs) runs it), with its registered state; `initial` overrides
    buffers in every fresh module; `writes`: the buffers each method writes (constant_read needs it; the
    others take it, when given, as which buffers a step hands on). Not a reference of correctness except
    "carried": the others name how state was lost."""
    if model not in STATE_MODELS:
        raise ValueError(f"unknown state model {model!r}: one of {STATE_MODELS}")
    if model == "constant_read" and writes is None:
        raise ValueError("constant_read needs each method's writes")
    modules: dict[str, torch.nn.Module] = {}
    state: dict[str, torch.Tensor] = {}
    outputs = []
    with torch.no_grad():
        for method, inputs in zip(plan, steps):
            if model == "reset" or method not in modules:
                modules[method] = fresh(method)
                _load(modules[method], initial or {})
            module = modules[method]
            written = set(buffers) if writes is None else set(writes.get(method, ())) & set(buffers)
            if model == "carried":
                _load(module, state)
            elif model == "constant_read":  # the buffers it does not write keep the fresh module's values
                _load(module, {name: value for name, value in state.items() if name in written})
            outputs.append([t.detach().clone().numpy() for t in _flat_outputs(call(module, method, inputs))])
            if model in ("carried", "constant_read"):
                own = dict(module.named_buffers())
                state.update({name: own[name].detach().clone() for name in written if name in own})
    return read_only(outputs)


def _load(module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
    own = dict(module.named_buffers())
    for name, value in values.items():
        if name in own:
            own[name].copy_(value)


def run_plan_isolated(
    card: ModelCard,
    steps: list[tuple],
    fresh_each_step: bool,
    initial: dict[str, torch.Tensor] | None = None,
    model: str | None = None,
    writes: dict[str, list[str]] | None = None,
) -> Outputs:
    """Eager as a runtime that does NOT carry state across methods would compute it: each method on its own
    copy of the registered buffers (fresh_each_step=False: every method's state persists only within that
    method), or every step starting from the registered values (True: the program reloaded before each
    step); `model` names another of STATE_MODELS instead (constant_read with each method's `writes`).
    `initial` overrides registered buffer values in every copy (a delegated copy that started from the
    heap's bytes). Not a reference of correctness: the cross_method_state check compares a device that differs
    from eager with these, to name how the state was lost."""
    chosen = model or ("reset" if fresh_each_step else "per_method")
    return run_plan_as(
        lambda method: build_model(card),
        _call,
        card.step_methods(len(steps)),
        steps,
        chosen,
        card.mutated_buffers,
        writes,
        initial,
    )


def initial_value_dependence(card: ModelCard, steps: list[tuple], reference: Outputs) -> Outputs:
    """Which output elements depend on the buffers' registered initial values: eager run again with
    other initial values; elements that differ depend on them. (Here, not in harness/numerics.py: it is
    eager running, and numerics stays a module of arrays that imports nothing of the suite.)"""
    other = run_steps(card, steps, initial=perturbed_initial(card))
    return [[~np.isclose(a, b, equal_nan=True) for a, b in zip(row_a, row_b)] for row_a, row_b in zip(reference, other)]


def perturbed_initial(card: ModelCard) -> dict[str, torch.Tensor]:
    """The card's mutated buffers started elsewhere than their registered values (non-zero, different in every
    element): what tells apart an output that depends on the initial state, or two ways of losing state that
    give the same outputs from the registered one."""
    buffers = registered_buffers(card)
    perturbed = {}
    for name in card.mutated_buffers:
        value = buffers[name]
        if value.is_floating_point():
            perturbed[name] = value + torch.linspace(1.5, 9.5, value.numel()).reshape(value.shape).to(value.dtype)
        else:
            perturbed[name] = value + 7
    return perturbed


def pattern_initial(card: ModelCard, pattern: int, buffers: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Each named buffer as it reads when its memory holds nothing but the byte `pattern`: the bytes
    decoded in the buffer's own dtype (what a delegated buffer that was never initialised holds)."""
    registered = registered_buffers(card)
    initial = {}
    for name in buffers:
        value = registered[name]
        raw = torch.full((value.numel() * value.element_size(),), pattern, dtype=torch.uint8)
        initial[name] = raw.view(value.dtype).reshape(value.shape)
    return initial


def read_only(outputs: Outputs) -> Outputs:
    """The same arrays, made read-only: results shared by a card's cases, which none may change."""
    for array in (array for row in outputs for array in row):
        array.setflags(write=False)
    return outputs
