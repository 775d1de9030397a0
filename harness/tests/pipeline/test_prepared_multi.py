"""A multi-method card's cases share its export facts and each dtype's quantized methods (harness/pipeline/prepared.py),
and the program a case lowers from the shared entry is the one it lowers on its own.

Real lowerings (HTP simulator) of the prefill/decode card, whose two methods are quantized with their own
calibrations: the case that makes the entry, a case of another mode and share_mutable_buffers that reads it,
and the same case lowering alone (exported and quantized in memory, as every multi-method case was before)
must give the same program bytes (the QNN context signature, a time stamp, aside) and the same facts, the
methods' buffer encodings included. Without QNN: an entry whose programs are not the card's methods, or that
names a method no file may be named after, is not read.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import torch

from fixtures import multi_method  # noqa: F401  (registers the cards)
from harness.pipeline import card as cards, prepared
from harness.pipeline.facts import FactsError, LoweringFacts, PreparedFacts, ProgramFacts, QuantizeFacts
from harness.pipeline.lower import lower_case
from harness.tests.pipeline.test_lower_server import _comparable, _without_signatures
from harness.vocabulary import Case, Mode

STEPS = 4
CARD = cards.find("fixtures.multi_method:mm_prefill_decode")


def _facts(facts: LoweringFacts) -> LoweringFacts:
    """What the checks read: the facts less times, the program's hash and which case computed the stages."""
    return dataclasses.replace(_comparable(facts), exported=False, quantized=False)


@pytest.mark.qnn
@pytest.mark.parametrize("dtype", ["16a8w", "fp16"])
def test_a_case_lowered_from_the_shared_entry_is_the_case_lowered_alone(toolchain, tmp_path, dtype):
    maker = Case(CARD, dtype, Mode.SKIP, "SM8650")
    reader = Case(CARD, dtype, Mode.DELEGATE, "SM8650", share_mutable_buffers=True)
    shared = tmp_path / "prepared"
    made = lower_case(maker, toolchain, tmp_path / "maker", STEPS, shared_root=shared)
    read = lower_case(reader, toolchain, tmp_path / "reader", STEPS, shared_root=shared)
    alone = lower_case(reader, toolchain, tmp_path / "alone", STEPS)
    for artifact in (made, read, alone):
        assert artifact.ok, (artifact.case.id, artifact.failure, artifact.log[-2000:])
    quantized = dtype != "fp16"
    assert (made.facts.exported, made.facts.quantized) == (True, quantized), "the first case makes the entries"
    assert (read.facts.exported, read.facts.quantized) == (False, False), "the next one reads them"
    assert "read_exported" in read.facts.timings_s and ("read_prepared" in read.facts.timings_s) == quantized
    assert (alone.facts.exported, alone.facts.quantized) == (True, quantized)
    assert _without_signatures(read.pte.read_bytes()) == _without_signatures(alone.pte.read_bytes()), (
        "one program, whether its methods were quantized by this case or read from the card's entry"
    )
    assert _facts(read.facts) == _facts(alone.facts)
    assert set(read.facts.methods) == {"prefill", "decode"}
    if quantized:
        assert read.facts.buffer_encodings == made.facts.buffer_encodings == alone.facts.buffer_encodings
        assert set(read.facts.buffer_encodings) == {"prefill", "decode"}, "each method's encodings reach the check"


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _entry(folder: Path, methods: dict[str, str]) -> Path:
    """A sound, sealed entry whose facts name `methods` (name -> file the program is written to)."""
    folder.mkdir(parents=True)
    programs = {}
    for method, file in methods.items():
        program = torch.export.export(_Double(), (torch.ones(2),))
        path = folder / file
        torch.export.save(program, path)
        data = path.read_bytes()
        (folder / (file + prepared.SEAL_SUFFIX)).write_text(prepared._seal(data))
        programs[method] = ProgramFacts(hashlib.sha256(data).hexdigest(), len(data))
    PreparedFacts(QuantizeFacts([], [], {}), programs).write(folder / prepared.FACTS)
    return folder


def test_an_entry_of_the_cards_methods_is_read_and_preloaded_whole(tmp_path):
    """Every method's program is read, by the lowering server (preload) and taken from there by its child."""
    entry = _entry(tmp_path / "entry", {"prefill": "prefill.pt2", "decode": "decode.pt2"})
    prepared._PRELOADED.clear()
    prepared.preload(entry)
    assert len(prepared._PRELOADED) == 2, "both methods' programs"
    found = prepared._read_entry(entry, prepared._wanted(CARD))
    assert found is not None and not prepared._PRELOADED
    _, modules = found
    program = prepared._program(CARD, modules)
    assert list(program) == ["prefill", "decode"], "in the card's method order"
    assert torch.equal(program["decode"](torch.ones(2)), torch.full((2,), 2.0))


def test_an_entry_of_other_programs_is_made_again(tmp_path, capfd):
    """An entry holding other methods than the card's (or a single-method card's forward) is not lowered from."""
    entry = _entry(tmp_path / "entry", {"prefill": "prefill.pt2"})
    assert prepared._read_entry(entry, prepared._wanted(CARD)) is None
    assert prepared._read_entry(entry, frozenset({"forward.pt2"})) is None, "a single-method card's is forward.pt2"
    err = capfd.readouterr().err
    assert (
        "qnnsuite: prepared program entry is damaged (it holds ['prefill.pt2'], the card's programs are "
        "['decode.pt2', 'prefill.pt2']); preparing it again"
    ) in err


def test_a_method_name_that_is_not_an_identifier_names_no_file(tmp_path, capfd):
    """Facts are data: a method named like a path is refused before any file is opened after it."""
    entry = _entry(tmp_path / "entry", {"prefill": "prefill.pt2", "decode": "decode.pt2"})
    facts = PreparedFacts.read(entry / prepared.FACTS)
    planted = {"../decode": facts.methods["decode"], "prefill": facts.methods["prefill"]}
    dataclasses.replace(facts, methods=planted).write(entry / prepared.FACTS)
    assert prepared._read_entry(entry, prepared._wanted(CARD)) is None
    assert "method '../decode' is not an identifier: no program file is named after it" in capfd.readouterr().err
    with pytest.raises(FactsError):
        prepared._file("a/b")


def test_prepared_facts_hold_a_program_per_method(tmp_path):
    """A sound entry names at least one method's program; one that names none (nor an error) is not an entry."""
    program = ProgramFacts("0" * 64, 1)
    PreparedFacts(QuantizeFacts([], [], {})).write(tmp_path / "neither")
    with pytest.raises(FactsError):
        PreparedFacts.read(tmp_path / "neither")
    PreparedFacts(QuantizeFacts([], [], {}), {"prefill": program}).write(tmp_path / "methods")
    assert PreparedFacts.read(tmp_path / "methods").methods == {"prefill": program}
