"""A card's export and quantization in one dtype, done once and shared by its lowerings for every SoC and mode.

Runs inside the lowering child (harness.pipeline.lower_job). Neither stage depends on the SoC or the buffer
mode (stages.export_facts and stages.quantize take neither; the QnnQuantizer has no per-SoC config), so a cold
run did each four times over. The entry is a folder keyed by content (harness/pipeline/cache.py prepared_key):
program.pt2 (the quantized program, torch.export.save; none for fp16, which lowers the eager model) and
prepared.json (the facts, written last), made under a file lock so workers needing the same card and dtype
wait for the one that makes it.

Why on disk rather than kept in a process that forks the lowerings: the quantized module exists only after
calibration ran tensor ops, and a fork server must not run any (its children would inherit a torch thread
pool without its threads: harness/process/fork_server.py); on disk it is also shared across xdist workers
and, by key, across runs. Every lowering starts from the saved program, the child that made it included, so
a program never depends on which case prepared it (harness/tests/test_prepared.py: the .pte equals that of
a case that quantizes on its own, context signature aside).
"""
from __future__ import annotations

import hashlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock

from harness.files import write_bytes_atomically
from harness.pipeline import stages
from harness.pipeline.card import ModelCard
from harness.pipeline.facts import ExportFacts, FactsError, PreparedFacts, ProgramFacts, QuantizeFacts

PROGRAM = "program.pt2"
FACTS = "prepared.json"


@dataclass
class Prepared:
    facts: PreparedFacts
    module: torch.nn.Module | None  # the quantized program to lower (None: lower the eager model)
    exported: bool  # the export facts were computed here, not read from the entry
    quantized: bool  # likewise the quantization


def obtain(directory: Path | None, card: ModelCard, model: torch.nn.Module, dtype: str, calibration: list[tuple],
           quantizes: bool, stage_done: Callable[[str], None]) -> Prepared:
    """The entry in directory, made now if it is missing or damaged; directory None: this case's own,
    in memory, lowered from the quantized module itself (as every case was before entries were shared)."""
    if directory is None:
        return _compute(None, card, model, dtype, calibration, quantizes, stage_done)
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory) + ".lock"):
        found = _read(directory, quantizes)
        if found is not None:
            stage_done("read_prepared")
            return found
        return _compute(directory, card, model, dtype, calibration, quantizes, stage_done)


def _compute(directory: Path | None, card: ModelCard, model: torch.nn.Module, dtype: str, calibration: list[tuple],
             quantizes: bool, stage_done: Callable[[str], None]) -> Prepared:
    export = ExportFacts(**stages.export_facts(card, model, calibration[0]))
    stage_done("export")
    if not quantizes:
        facts = PreparedFacts(export, None, None)
        if directory is not None:
            facts.write(directory / FACTS)
        return Prepared(facts, None, exported=True, quantized=False)
    converted, quantize_facts = stages.quantize(card, model, dtype, calibration)
    if directory is None:
        stage_done("quantize")
        return Prepared(PreparedFacts(export, QuantizeFacts(**quantize_facts), None), converted, True, True)
    buffer = io.BytesIO()
    torch.export.save(torch.export.export(converted, calibration[0], strict=True), buffer)
    data = buffer.getvalue()
    write_bytes_atomically(directory / PROGRAM, data)
    stage_done("quantize")
    program = ProgramFacts(hashlib.sha256(data).hexdigest(), len(data))
    facts = PreparedFacts(export, QuantizeFacts(**quantize_facts), program)
    facts.write(directory / FACTS)
    return Prepared(facts, _load(data), exported=True, quantized=True)


def _read(directory: Path, quantizes: bool) -> Prepared | None:
    """The entry if it is complete and its program is the one its facts describe; None (said in the
    lowering's log) if it must be made again."""
    if not (directory / FACTS).exists():
        return None
    try:
        facts = PreparedFacts.read(directory / FACTS)
        if not quantizes:
            return Prepared(facts, None, exported=False, quantized=False)
        if facts.program is None or facts.quantize is None:
            raise FactsError("it holds no quantized program")
        data = (directory / PROGRAM).read_bytes()
        if len(data) != facts.program.bytes or hashlib.sha256(data).hexdigest() != facts.program.sha256:
            raise FactsError(f"{PROGRAM} is not the program its facts describe")
    except (FactsError, OSError) as error:
        print(f"qnnsuite: prepared program {directory.name} is damaged ({error}); preparing it again", file=sys.stderr)
        return None
    return Prepared(facts, _load(data), exported=False, quantized=False)


def _load(data: bytes) -> torch.nn.Module:
    # Registers the quantized_decomposed ops the program calls; a fresh Python that only reads the entry has
    # not imported it (measured: "failed to resolve torch.ops.quantized_decomposed.quantize_per_tensor").
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.export.load(io.BytesIO(data)).module()
