"""What a card's lowerings share: its export facts (once per card) and its quantized program in one dtype
(once per card x dtype), made by the first lowering that needs them and read by the others.

Runs inside the lowering child (harness.pipeline.lower_job). Neither stage depends on the SoC or the buffer
mode (stages.export_facts and stages.quantize take neither; the QnnQuantizer has no per-SoC config), and the
export facts not on the dtype either (every dtype lowers the same eager model), so a cold run did the export
sixteen times and each quantization four times over. Each entry is a folder keyed by content
(harness/pipeline/cache.py exported_key and prepared_key): export.json for a card (the union of what its
methods mutate); <method>.pt2 for each of the card's methods (forward.pt2 for a single-method card: the
quantized programs, torch.export.save, each quantized with its own calibration) and prepared.json (their
facts, a multi-method card's encodings of the shared buffers, or the error quantizing failed with, written
last) for a card x dtype. Each is made under a file lock, so workers needing the same entry wait for the one
that makes it. A multi-method card's cases (two buffer modes, with and without share_mutable_buffers, each
SoC) differ only in how the methods are lowered and serialized, yet each case exported and quantized both
methods again before (measured: about 11 s a case, 4-5 times a zoo case's).

Why on disk rather than kept in a process that forks the lowerings: the quantized module exists only after
calibration ran tensor ops, and a fork server must not run any (its children would inherit a torch thread
pool without its threads: harness/process/fork_server.py); on disk it is also shared across xdist workers
and, by key, across runs. Every lowering starts from the saved program, the child that made it included, so
a program never depends on which case prepared it (harness/tests/pipeline/test_prepared.py: the .pte equals that of
a case that quantizes on its own, context signature aside).

Reading the saved program (torch.export.load) starts no thread and costs 0.03-1.7 s (a llama slice), once
per lowering: the lowering server reads it once instead (`preload`, before it forks a lowering of the card
and dtype), and its children take it from there, keyed by the program's sha256, which they check against
the entry's facts as they would the bytes.
"""

from __future__ import annotations

import hashlib
import io
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from filelock import FileLock

from harness.files import write_bytes_atomically
from harness.pipeline import stages
from harness.pipeline.card import ModelCard
from harness.pipeline.facts import (
    ENVIRONMENTAL,
    ExportedFacts,
    ExportFacts,
    FactsError,
    PreparedFacts,
    ProgramFacts,
    QuantizationFailed,
    QuantizeFacts,
    lowering_error,
)
from harness.user_state import (
    KEY_BYTES as KEY_BYTES,  # the key length, read here by the tests
    UnsafeStateDir,
    claim_entry,
    entry_problem,
    seal,
    sealed_by,
    user_key,
)

T = TypeVar("T")
SEAL_SUFFIX = ".hmac"  # <method>.pt2.hmac: HMAC-SHA256 of the program under this user's key: only programs this user made are read
KEY_FILE = "cache-hmac.key"  # in the user's private state folder (harness/user_state.py)
FACTS = "prepared.json"
EXPORT_FACTS = "export.json"
# Programs the lowering server read (preload), by sha256: its forked children each take their own copy.
_PRELOADED: dict[str, torch.nn.Module] = {}


Programs = dict[str, torch.nn.Module]  # by method, in the card's order (forward alone for a single-method card)


@dataclass
class Quantized:
    facts: QuantizeFacts
    module: Programs  # the quantized methods to lower, as stages.lower takes them
    made: bool  # quantized here, not read from the card and dtype's entry
    buffer_encodings: dict[str, dict[str, dict[str, str]]]  # a multi-method card's (stages.buffer_encodings)
    modelled: dict[str, list[list[list[float]]]]  # a multi-method card's (stages.quantized_models)


def _exported(card: ModelCard, model: torch.nn.Module, examples: dict[str, tuple]) -> ExportFacts:
    return ExportFacts(**stages.export_facts(card, model, examples))


def export_facts(
    directory: Path | None,
    card: ModelCard,
    model: torch.nn.Module,
    examples: dict[str, tuple],
    stage_done: Callable[[str], None],
) -> tuple[ExportFacts, bool]:
    """The card's export facts from its entry, computed now (and written) if missing or damaged, and whether
    they were computed here; directory None: this case's own. Asked before quantizing, so a quantization
    that fails leaves the export check its facts. examples: one per method."""
    if directory is None:
        facts = _exported(card, model, examples)
        stage_done("export")
        return facts, True
    with _locked(directory):
        path = directory / EXPORT_FACTS
        if path.exists():
            try:
                found = ExportedFacts.read(path).export
                stage_done("read_exported")
                return found, False
            except FactsError as error:
                print(
                    f"qnnsuite: export facts {directory.name} are damaged ({error}); exporting again", file=sys.stderr
                )
        facts = _exported(card, model, examples)
        ExportedFacts(facts).write(path)
        stage_done("export")
        return facts, True


def quantized(
    directory: Path | None,
    card: ModelCard,
    model: torch.nn.Module,
    dtype: str,
    calibration: list[tuple],
    stage_done: Callable[[str], None],
    writes: dict[str, list[str]] | None = None,
) -> Quantized:
    """The card's quantized program in dtype from its entry, made now if missing or damaged; directory None:
    this case's own, in memory (the quantized module lowered itself, as every case was before entries
    were shared). QuantizationFailed if it failed, now or when the entry was made (a failure of the
    machine is raised as it is and not kept). A multi-method card's entry also keeps the quantized programs
    run on the plan (stages.quantized_models; writes: what each method writes, the export facts' methods)."""
    if directory is None:
        converted, facts, encodings, modelled = _failing_once(
            None, lambda: _quantized_now(card, model, dtype, calibration, writes)
        )
        stage_done("quantize")
        modules = {name: module for name, (module, _) in converted.items()}
        return Quantized(QuantizeFacts(**facts), _program(card, modules), True, encodings, modelled)
    with _locked(directory):
        found = _read_entry(directory, _wanted(card))
        if found is not None:
            stage_done("read_prepared")
            entry, modules = found
            if entry.error is not None:
                raise QuantizationFailed(entry.error, made=False)
            return Quantized(entry.quantize, _program(card, modules), False, entry.buffer_encodings, entry.modelled)
        entry, modules = _failing_once(directory, lambda: _quantize(directory, card, model, dtype, calibration, writes))
        stage_done("quantize")
        return Quantized(entry.quantize, _program(card, modules), True, entry.buffer_encodings, entry.modelled)


def _quantized_now(
    card: ModelCard, model: torch.nn.Module, dtype: str, calibration: list[tuple], writes: dict[str, list[str]] | None
) -> tuple[dict[str, tuple[torch.nn.Module, tuple]], dict, dict[str, dict[str, dict[str, str]]], dict]:
    """The card quantized now: its programs by their file in the entry (<method>.pt2 each), each with its
    example (what it is exported with to be saved); its facts; a multi-method card's buffer encodings and
    quantized programs run on the plan (stages.quantized_models: a lone method has no other to hand state to)."""
    per_method = stages.method_calibration(card, calibration)
    converted, facts, encodings = stages.quantize(card, model, dtype, calibration)
    modelled = stages.quantized_models(card, converted, calibration, writes) if card.multi_method else {}
    files = {_file(method): (module, per_method[method][0]) for method, module in converted.items()}
    return files, facts, encodings, modelled


def _file(method: str) -> str:
    """The entry's file of a method's program. Method names come from the card and from an entry's facts
    (data): only an identifier names a file, so no name reaches outside the entry."""
    if not method.isidentifier():
        raise FactsError(f"method {method!r} is not an identifier: no program file is named after it")
    return f"{method}.pt2"


def _wanted(card: ModelCard) -> frozenset[str]:
    """The files of the card's programs in its entries."""
    return frozenset(_file(method) for method in card.method_names)


def _program(card: ModelCard, modules: dict[str, torch.nn.Module]) -> Programs:
    """The modules by file, as the lowering takes them: by method in the card's order."""
    return {method: modules[_file(method)] for method in card.method_names}


def _files(facts: PreparedFacts) -> dict[str, ProgramFacts]:
    """A complete entry's programs by file."""
    return {_file(method): program for method, program in facts.methods.items()}


def _failing_once(directory: Path | None, quantize: Callable[[], T]) -> T:
    """quantize(), whose failure (the case's, not the machine's) becomes QuantizationFailed and, with a
    directory, the entry: the card and dtype's other cases read it instead of failing again."""
    try:
        return quantize()
    except ENVIRONMENTAL:
        raise
    except Exception as error:
        failed = lowering_error(error, traceback.format_exc())
        if directory is not None:
            PreparedFacts(None, error=failed).write(directory / FACTS)
        raise QuantizationFailed(failed, made=True) from error


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """The entry, this user's own (one another account owns is set aside, never read) and locked."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    claim_entry(Path(f"{directory}.lock"), "cache lock")  # filelock opens its file following links, truncating it
    with FileLock(str(directory) + ".lock"):
        claim_entry(directory, "shared cache entry")
        directory.mkdir(exist_ok=True)
        yield


def _quantize(
    directory: Path,
    card: ModelCard,
    model: torch.nn.Module,
    dtype: str,
    calibration: list[tuple],
    writes: dict[str, list[str]] | None,
) -> tuple[PreparedFacts, dict[str, torch.nn.Module]]:
    converted, quantize_facts, encodings, modelled = _quantized_now(card, model, dtype, calibration, writes)
    programs, modules = {}, {}
    for name, (module, example) in converted.items():
        buffer = io.BytesIO()
        torch.export.save(torch.export.export(module, example, strict=True), buffer)
        data = buffer.getvalue()
        write_bytes_atomically(directory / name, data)
        write_bytes_atomically(directory / _seal_file(name), _seal(data).encode())
        programs[name], modules[name] = ProgramFacts(hashlib.sha256(data).hexdigest(), len(data)), _load(data)
    by_method = {name.removesuffix(".pt2"): program for name, program in programs.items()}
    facts = PreparedFacts(QuantizeFacts(**quantize_facts), by_method, buffer_encodings=encodings, modelled=modelled)
    facts.write(directory / FACTS)
    return facts, modules


def preload(directory: Path) -> None:
    """Read the entry's programs into this process, if it is complete and sound, for the lowerings it will
    fork (the lowering server's preparation of a request: harness/pipeline/lower_job.py); not one another
    account owns (the lowering sets it aside)."""
    if entry_problem(directory):
        return
    try:
        facts = PreparedFacts.read(directory / FACTS)
        if facts.error is None:
            for name, program in _files(facts).items():
                if program.sha256 not in _PRELOADED:
                    _PRELOADED[program.sha256] = _load(_program_bytes(directory, name, program))
    except (FactsError, OSError, UnsafeStateDir):
        return  # not made yet, damaged or not sealed: the child makes it, or says why and makes it again


def _read_entry(directory: Path, wanted: frozenset[str]) -> tuple[PreparedFacts, dict[str, torch.nn.Module]] | None:
    """The entry if it is complete (a failed one has no program), holds the programs wanted (by file: one
    per method of the card) and each is the one its facts describe; None (said in the lowering's log)
    if it must be made again."""
    if not (directory / FACTS).exists():
        return None
    try:
        facts = PreparedFacts.read(directory / FACTS)
        if facts.error is not None:
            return facts, {}
        files = _files(facts)
        if set(files) != wanted:
            raise FactsError(f"it holds {sorted(files)}, the card's programs are {sorted(wanted)}")
        modules = {}
        for name, program in files.items():
            if program.sha256 in _PRELOADED:  # read by the server that forked this child, bytes checked
                modules[name] = _PRELOADED.pop(program.sha256)
            else:
                modules[name] = _load(_program_bytes(directory, name, program))
    except (FactsError, OSError) as error:
        print(f"qnnsuite: prepared program {directory.name} is damaged ({error}); preparing it again", file=sys.stderr)
        return None
    return facts, modules


def _seal_file(name: str) -> str:
    return name + SEAL_SUFFIX


def _program_bytes(directory: Path, name: str, program: ProgramFacts) -> bytes:
    """The entry's program in file `name`, if it is the one its facts describe and this user sealed it (else
    FactsError).

    torch.export.load unpickles: a <method>.pt2 planted with a matching prepared.json would run code in the
    lowering server. The sha256 in the facts only says the files agree; the seal, an HMAC under a key only
    this user can read, says this user's suite wrote them."""
    data = (directory / name).read_bytes()
    if len(data) != program.bytes or hashlib.sha256(data).hexdigest() != program.sha256:
        raise FactsError(f"{name} is not the program its facts describe")
    try:
        mark = (directory / _seal_file(name)).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        mark = ""
    if not sealed_by(data, mark, _key()):
        raise FactsError(f"{name} is not sealed by this user's key (made elsewhere, or planted): not read")
    return data


def _seal(data: bytes) -> str:
    return seal(data, _key())


def _key() -> bytes:
    """This user's key for sealing prepared programs (harness/user_state.py user_key)."""
    return user_key(KEY_FILE)


def _load(data: bytes) -> torch.nn.Module:
    # Registers the quantized_decomposed ops the program calls; a fresh Python that only reads the entry has
    # not imported it (measured: "failed to resolve torch.ops.quantized_decomposed.quantize_per_tensor").
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    return torch.export.load(io.BytesIO(data)).module()
