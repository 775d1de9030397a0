"""Drivers: one card's token/position stream driven the ways users drive it, each a plan of (method, inputs).

A card declares its stream and the width of each method (vocabulary.Drive); a driver turns that into the
steps of one plan, run in one runner process on the device and on ONE eager module, so the state crosses
steps, methods, turns and resets as the user means it to. Drivers the eager reference says are equivalent
(a chunked prefill and single steps over the same tokens) are run in the same plan: after the driver's own
steps the program is loaded again and the same (turn, position) stream is fed one position a step (the
plan's "twin"), so the check compares them on the device without a second run. A card that exposes its
buffers (Drive.read_back) has them read back at the end of every conversation: before a reset or reload, and
at the end of the plan.

What each driver means is in docs/DRIVERS.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from harness.pipeline import eager
from harness.vocabulary import RELOAD, REWIND, Case, Drive, DriveChunk, ModelCard

LONG_STEPS = 256  # the long driver's default horizon: past the wrap of every ring the suite's cards declare
EQUIVALENT_TWIN = ("chunked", "prefill_decode", "second_prefill", "reset")  # drivers run with a single-step twin


@dataclass(frozen=True)
class DrivenPlan:
    """A driver's steps: the chunk each step consumes, the steps the program is loaded again before, where
    the single-step twin starts (None: the driver has none) and the card's read-back method ("": none)."""

    driver: str
    chunks: tuple[DriveChunk, ...]
    reloads: tuple[int, ...] = ()
    twin_from: int | None = None
    read_back: str = ""

    @property
    def methods(self) -> list[str]:
        return [chunk.method for chunk in self.chunks]

    def inputs(self, drive: Drive) -> list[tuple]:
        return [drive.feed(chunk) for chunk in self.chunks]

    @property
    def read_backs(self) -> list[int]:
        """The steps that read the buffers back (none when the card exposes no read-back)."""
        return [index for index, chunk in enumerate(self.chunks) if self.read_back and chunk.method == self.read_back]

    @property
    def own(self) -> range:
        """The driver's own steps (the twin's come after them)."""
        return range(len(self.chunks) if self.twin_from is None else self.twin_from)


# Drives declared for cards registered elsewhere (by reference), so an existing card is driven without a change
# to its module: its lowering, keyed by its module's source, stays the one its standard cases share.
_DECLARED: dict[str, Drive] = {}


def declare(reference: str, drive: Drive) -> None:
    """Drive the card `module:name` (registered by its own module) as `drive` says, in the driver matrix."""
    _DECLARED[reference] = drive


def driven(card: ModelCard) -> ModelCard | None:
    """The card with its drive (its own, or one declared for it), None when it is not driven."""
    if card.drive is not None:
        return card
    declared = _DECLARED.get(card.reference)
    return replace(card, drive=declared) if declared is not None else None


def decode_method(drive: Drive) -> str:
    """The card's width-1 method (ValueError when it has none: every driver needs it)."""
    for method, width in drive.widths:
        if width == 1:
            return method
    raise ValueError(f"a driven card needs a method of width 1, not only {dict(drive.widths)}: declare one in widths=")


def prefill_method(drive: Drive) -> str | None:
    """The card's widest method when it is wider than one position (None: single steps only)."""
    method, width = max(drive.widths, key=lambda pair: pair[1])
    return method if width > 1 else None


def available(drive: Drive) -> tuple[str, ...]:
    """The drivers the card's declaration allows, among those it asks for."""
    needs_prefill = {"chunked", "prefill_decode", "second_prefill"}
    return tuple(
        driver
        for driver in drive.drivers
        if not (driver in needs_prefill and prefill_method(drive) is None)
        and not (driver == "adapter_switch" and drive.adapters < 2)
    )


def _run(drive: Drive, method: str, start: int, count: int, turn: int = 0, adapter: int = 0) -> list[DriveChunk]:
    """count positions from start, fed in chunks of method's width (a last chunk that does not fit: ValueError)."""
    width = drive.width(method)
    if count % width:
        raise ValueError(f"{count} positions do not split into chunks of {width} ({method}): make prompt= a multiple")
    return [
        DriveChunk(method, tuple(range(begin, begin + width)), turn, adapter)
        for begin in range(start, start + count, width)
    ]


def _singles(drive: Drive, chunks: list[DriveChunk]) -> list[DriveChunk]:
    """The same (turn, position) stream one position a step (the twin of a driver)."""
    step = decode_method(drive)
    return [
        DriveChunk(step, (position,), chunk.turn, chunk.adapter) for chunk in chunks for position in chunk.positions
    ]


def _read_back(drive: Drive, turn: int) -> list[DriveChunk]:
    """The end of a conversation: the card's buffers read back (nothing when it exposes no read-back)."""
    return [DriveChunk(drive.read_back, (), turn)] if drive.read_back else []


def _conversation(drive: Drive, start: int, turn: int) -> list[DriveChunk]:
    wide = prefill_method(drive) or decode_method(drive)
    return _run(drive, wide, start, drive.prompt, turn) + _run(
        drive, decode_method(drive), start + drive.prompt, drive.decode, turn
    )


def _reset(drive: Drive) -> tuple[list[DriveChunk], list[int]]:
    """Two conversations with the card's reset between them, each read back at its end: (chunks, the steps
    reloaded before)."""
    first = _conversation(drive, 0, 0) + _read_back(drive, 0)
    second = _conversation(drive, 0, 1) + _read_back(drive, 1)
    if drive.reset == RELOAD:
        return first + second, [len(first)]
    if drive.reset == REWIND:
        return first + second, []
    return [*first, DriveChunk(drive.reset, (), 1), *second], []


def plan(drive: Drive, driver: str, horizon: int = LONG_STEPS) -> DrivenPlan:
    """The driver's plan for the card's declaration (ValueError for a driver it does not allow)."""
    if driver not in available(drive):
        raise ValueError(f"driver {driver!r} does not apply to this card: it allows {', '.join(available(drive))}")
    step, prompt, decode = decode_method(drive), drive.prompt, drive.decode
    reloads: list[int] = []
    if driver == "single":
        own = _run(drive, step, 0, prompt + decode)
    elif driver == "chunked":
        own = _run(drive, prefill_method(drive) or step, 0, prompt)
    elif driver == "prefill_decode":
        own = _conversation(drive, 0, 0)
    elif driver == "second_prefill":  # a conversation, then a turn: prefill at a position > 0, decode on
        wide, turn_at = prefill_method(drive) or step, prompt + decode
        width = drive.width(wide)
        own = (
            _conversation(drive, 0, 0)
            + _run(drive, wide, turn_at, width, 1)
            + _run(drive, step, turn_at + width, decode, 1)
        )
    elif driver == "reset":
        own, reloads = _reset(drive)
    elif driver == "adapter_switch":
        switch = (prompt + decode) // 2
        own = _run(drive, step, 0, switch) + _run(drive, step, switch, prompt + decode - switch, 0, 1)
    else:  # long
        own = _run(drive, step, 0, max(horizon, LONG_STEPS))
    if driver != "reset":  # a reset's conversations are read back at their ends already
        own += _read_back(drive, own[-1].turn)
    if driver not in EQUIVALENT_TWIN:
        return DrivenPlan(driver, tuple(own), tuple(reloads), read_back=drive.read_back)
    twin = _singles(drive, [chunk for chunk in own if chunk.positions and (driver != "reset" or chunk.turn == 1)])
    twin += _read_back(drive, twin[-1].turn)
    return DrivenPlan(driver, tuple(own + twin), (*reloads, len(own)), len(own), drive.read_back)


def of_case(case: Case, horizon: int = LONG_STEPS) -> DrivenPlan:
    drive = case.card.drive
    if drive is None or not case.driver:
        raise ValueError(f"case {case.id} is not a driven case")
    return plan(drive, case.driver, horizon)


def of_run(case: Case, step_count: int) -> DrivenPlan:
    """The case's plan that a run of step_count steps drove (a run's record, a bundle's case.json): the long
    driver's horizon is its steps less its read-backs, which do not depend on the horizon."""
    read_backs = len(of_case(case).read_backs) if case.driver == "long" else 0
    return of_case(case, step_count - read_backs)


_EAGER: dict[tuple, eager.Outputs] = {}


@dataclass(frozen=True)
class Runtime:
    """How a runtime carries the state along a plan, for eager to compute: the user's intent when every field
    is left alone (one module, a fresh one at each reload); else a way to lose it, which the driver check
    names when the device equals it. fresh_at: steps the state is lost before; ignore: reloads not made (no
    reset); per_method: each method on its own copy of the state (docs/FINDINGS.md#F15); pattern: the byte the
    named buffers start from instead of their registered values (uninitialised: docs/FINDINGS.md#F1);
    constant_reads: methods that read the buffers as the constants of their registered values whatever the
    others wrote (a method that only reads a buffer: docs/FINDINGS.md#F16)."""

    fresh_at: tuple[int, ...] = ()
    ignore: tuple[int, ...] = ()
    per_method: bool = False
    pattern: int | None = None
    buffers: tuple[str, ...] = ()
    constant_reads: tuple[str, ...] = ()


def run_eager(card: ModelCard, driven: DrivenPlan, runtime: Runtime = Runtime()) -> eager.Outputs:
    """The plan's outputs as `runtime` computes them on eager modules (the intent: ONE module, a reload a fresh
    one), read-only and kept per process."""
    key = (card, driven, runtime)
    if key not in _EAGER:
        drive = card.drive
        assert drive is not None
        starts = (set(driven.reloads) - set(runtime.ignore)) | set(runtime.fresh_at)
        initial = eager.pattern_initial(card, runtime.pattern, runtime.buffers) if runtime.pattern is not None else {}
        modules: dict[str, torch.nn.Module] = {}
        outputs = []
        with torch.no_grad():
            for index, (chunk, inputs) in enumerate(zip(driven.chunks, driven.inputs(drive))):
                if index in starts:
                    modules.clear()
                owner = chunk.method if runtime.per_method else ""
                if owner not in modules:
                    modules[owner] = _fresh(card, initial)
                module = _fresh(card, {}) if chunk.method in runtime.constant_reads else modules[owner]
                result = getattr(module, chunk.method)(*inputs)
                flat = [result] if isinstance(result, torch.Tensor) else list(result)
                outputs.append([tensor.detach().clone().numpy() for tensor in flat])
        _EAGER[key] = eager.read_only(outputs)
    return _EAGER[key]


def _fresh(card: ModelCard, initial: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = eager.build_model(card)
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in initial.items():
            buffers[name].copy_(value)
    return model


def rows_by_position(driven: DrivenPlan, outputs: eager.Outputs, steps: range) -> dict[tuple[int, int], list]:
    """Each (turn, position)'s rows of the given steps' outputs (axis 1 of every output holds a chunk's
    positions, as vocabulary.Drive says), for comparing drivers of different widths."""
    rows: dict[tuple[int, int], list] = {}
    for index in steps:
        chunk = driven.chunks[index]
        for row, position in enumerate(chunk.positions):
            rows[(chunk.turn, position)] = [np.asarray(output)[:, row] for output in outputs[index]]
    return rows
