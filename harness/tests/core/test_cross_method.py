"""cross_method_state (harness/checks/cross_method.py) on constructed device outputs: it passes a device that carries state
across methods and fails, each with its own signature, one that reloads the program every step, one whose
methods each keep a copy of the state, one whose reading method used garbage state and one that is simply
wrong. Quantized: outputs first, so a device that equals the methods' CPU quantize/dequantize programs with
the state carried is explained by their encodings (F18), and one that differs from them (per-method caches)
fails as what it is, naming the steps and both errors; explanations that give identical outputs are all named.

No QNN here: the device outputs are eager's own, run another way (harness/pipeline/eager.py), in the
runner's byte layout; a quantized case's modelled programs are eager's runs recorded as the lowering records
the quantized ones (LoweringFacts.modelled). The end-to-end twin (a real lowering on the HTP simulator, the
compiled runner in one process and one process per step) is harness/tests/pipeline/test_multi_method.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures import (
    multi_method,  # noqa: F401  (registers the cards)
    zoo,  # noqa: F401
)
from harness import known_failures, numerics
from harness.check_registry import CheckFailure, NotApplicable
from harness.checks import cross_method
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import ExportFacts, LoweringFacts, ProgramFacts
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import Case, Mode, ModelCard

STEPS = 4
CARD = "fixtures.multi_method:mm_prefill_decode"


def _outcome(
    device: list[list[np.ndarray]] | None,
    card_ref: str = CARD,
    facts: LoweringFacts | None = None,
    tmp: Path | None = None,
    dtype: str = "fp16",
    mode: Mode = Mode.DELEGATE,
) -> CaseOutcome:
    card = cards.find(card_ref)
    case = Case(card, dtype, mode, "SM8650")
    steps = card.steps(STEPS)
    directory = tmp or Path(".")
    facts = facts or LoweringFacts(program=ProgramFacts("0" * 64, 1), methods=list(card.methods))
    artifact = LoweredArtifact(case, directory, facts, "", 0.0)
    (directory / "model.pte").write_bytes(b"x")  # artifact.ok needs the file; nothing reads it
    run = None
    if device is not None:
        raw = [[np.ascontiguousarray(array).view(np.uint8).reshape(-1) for array in row] for row in device]
        run = DeviceRun(raw, [], None, "")
    return CaseOutcome(
        case,
        steps,
        artifact,
        eager.run_steps(card, steps),
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=run,
    )


def _signature(outcome: CaseOutcome) -> str:
    with pytest.raises(CheckFailure) as failure:
        cross_method.check_cross_method_state(outcome)
    return failure.value.signature


def test_passes_where_decode_reads_what_prefill_wrote(tmp_path):
    card = cards.find(CARD)
    outcome = _outcome([list(row) for row in eager.run_steps(card, card.steps(STEPS))], tmp=tmp_path)
    assert cross_method.check_cross_method_state(outcome)["plan"] == ["prefill", "decode", "decode", "decode"]


def test_a_program_reloaded_every_step_fails_with_reset(tmp_path):
    card = cards.find(CARD)
    fresh = eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=True)
    assert _signature(_outcome([list(row) for row in fresh], tmp=tmp_path)) == "state_reset_between_steps"


def test_methods_each_with_their_own_copy_fail_with_per_method(tmp_path):
    card = cards.find("fixtures.multi_method:mm_counter")  # advance, read, advance, read: copies differ from fresh
    isolated = eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=False)
    fresh = eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=True)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(isolated, fresh)), "the two broken runs must differ"
    outcome = _outcome([list(row) for row in isolated], "fixtures.multi_method:mm_counter", tmp=tmp_path)
    assert _signature(outcome) == "state_per_method"


def test_garbage_only_where_decode_reads_prefill_fails_with_not_shared(tmp_path):
    """The measured delegate-mode shape: decode's own cache holds what no method wrote (never initialised)."""
    card = cards.find(CARD)
    steps = card.steps(STEPS)
    reference, isolated = eager.run_steps(card, steps), eager.run_plan_isolated(card, steps, fresh_each_step=False)
    device = []
    for want, alone in zip(reference, isolated):
        reads_prefill = ~np.isclose(want[0], alone[0])
        device.append([np.where(reads_prefill, np.float32(131008.0), want[0]).astype(np.float32)])
    assert _signature(_outcome(device, tmp=tmp_path)) == "state_not_shared"


def test_wrong_everywhere_is_a_plain_mismatch(tmp_path):
    card = cards.find(CARD)
    device = [[row[0] + np.float32(5.0)] for row in eager.run_steps(card, card.steps(STEPS))]
    assert _signature(_outcome(device, tmp=tmp_path)) == "cross_method_mismatch"


PREFILL = "scale=1.5259e-09 zero_point=0 range=[0,65535] int32"  # as measured (docs/FINDINGS.md#F18)
DECODE = "scale=2.95644e-05 zero_point=0 range=[0,65535] int32"
DIFFERING = {"prefill": {"kv_cache": {"read": PREFILL}}, "decode": {"kv_cache": {"read": DECODE}}}


def _rows(outputs) -> list[list[np.ndarray]]:
    return [[np.array(array) for array in row] for row in outputs]


def _recorded(outputs) -> list[list[list[float]]]:
    return [[array.astype(np.float64).reshape(-1).tolist() for array in row] for row in outputs]


def _quantized_facts(modelled: dict, encodings: dict | None = None) -> LoweringFacts:
    """A quantized lowering's facts: what each method writes, its encodings and its modelled programs."""
    card = cards.find(CARD)
    return LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=list(card.methods),
        export=ExportFacts(["kv_cache"], ["kv_cache"], dict.fromkeys(card.methods, ["kv_cache"])),
        buffer_encodings=DIFFERING if encodings is None else encodings,
        modelled={how: _recorded(outputs) for how, outputs in modelled.items()},
    )


def _models(reads_prefill_off_by: float = 0.0) -> dict:
    """Stand-ins for the quantized programs run on the plan: eager's models, the carried one off by
    `reads_prefill_off_by` where decode reads what prefill wrote (two encodings of one cache)."""
    card = cards.find(CARD)
    steps = card.steps(STEPS)
    reference, isolated = eager.run_steps(card, steps), eager.run_plan_isolated(card, steps, fresh_each_step=False)
    carried = _rows(reference)
    for row, alone in zip(carried, isolated):
        reads_prefill = ~np.isclose(row[0], alone[0])
        row[0] = np.where(reads_prefill, row[0] + np.float32(reads_prefill_off_by), row[0]).astype(np.float32)
    return {
        "carried": carried,
        "per_method": isolated,
        "reset": eager.run_plan_isolated(card, steps, fresh_each_step=True),
        "constant_read": carried,
    }


def test_a_quantized_runtime_keeping_per_method_caches_fails_naming_steps_and_values(tmp_path):
    """The regression F18 used to hide: the encodings differ (as measured), but the device is not what the
    methods' quantized programs compute with the state carried; it is what they compute with a cache per
    method. It fails as state_per_method, naming the steps and both errors, which F18's former entry
    (buffer_encoding_mismatch on every quantized case of this card) does not explain."""
    models = _models()
    outcome = _outcome(models["per_method"], facts=_quantized_facts(models), tmp=tmp_path, dtype="16a8w")
    with pytest.raises(CheckFailure) as raised:
        cross_method.check_cross_method_state(outcome)
    failure = raised.value
    assert failure.signature == "state_per_method"
    device = numerics.compare(outcome.device_outputs(), outcome.reference, "16a8w").errors
    message = str(failure)
    assert "at steps 1 (decode), 2 (decode), 3 (decode)" in message
    assert ", ".join(f"{device[step].max_abs_error:.4g}" for step in (1, 2, 3)) in message
    assert "the 16a8w CPU quantize/dequantize programs with the state carried across methods by 0, 0, 0" in message
    assert "each method on its own copy of the state" in message
    f18 = known_failures.KnownFailure(
        "test_cross_method_state[mm_prefill_decode-*a8w-*]", "buffer_encoding_mismatch", ""
    )
    assert not f18.explains(failure), "the entry that explained every quantized case of this card before"


def test_a_quantized_device_equal_to_its_programs_with_the_state_carried_is_their_encodings(tmp_path):
    """State shared right, methods calibrated apart: decode misreads prefill's writes by the encodings'
    difference, exactly as the CPU programs do. That is F18's buffer_encoding_mismatch (both encodings and
    both errors named), never state_not_shared; with one encoding it is the programs' quantization_error."""
    models = _models(reads_prefill_off_by=0.5)
    outcome = _outcome(models["carried"], facts=_quantized_facts(models), tmp=tmp_path, dtype="16a8w")
    with pytest.raises(CheckFailure) as raised:
        cross_method.check_cross_method_state(outcome)
    assert raised.value.signature == "buffer_encoding_mismatch"
    assert PREFILL in str(raised.value) and DECODE in str(raised.value)
    assert "the device equals them: the state crossed methods" in str(raised.value)
    same = {method: {"kv_cache": {"read": DECODE}} for method in ("prefill", "decode")}
    outcome = _outcome(models["carried"], facts=_quantized_facts(models, same), tmp=tmp_path, dtype="16a8w")
    assert _signature(outcome) == "quantization_error"
    without_models = _outcome(models["carried"], facts=_quantized_facts({}, same), tmp=tmp_path, dtype="16a8w")
    assert _signature(without_models) == "state_not_shared", "what the check said before it modelled the programs"


def test_quantized_methods_with_two_encodings_pass_where_the_outputs_do(tmp_path):
    """Outputs first: two encodings that change no output beyond the tolerance are evidence, not a failure."""
    card = cards.find(CARD)
    models = _models()
    outcome = _outcome(
        _rows(eager.run_steps(card, card.steps(STEPS))), facts=_quantized_facts(models), tmp=tmp_path, dtype="16a8w"
    )
    evidence = cross_method.check_cross_method_state(outcome)
    assert PREFILL in evidence["encoding_difference"] and len(evidence["modelled_steps"]) == STEPS


def test_explanations_with_identical_outputs_are_all_named_with_what_separates_them(tmp_path):
    """The encoder/decoder card from its zero state: decode reading the encoder's cache as constant zeros,
    every step reset and decode on its own copy all give zeros; the check names the three and says a non-zero
    initial state separates the reset from the others (eager's models differ from it)."""
    ref = "fixtures.multi_method:mm_encoder_decoder"
    card = cards.find(ref)
    steps = card.steps(STEPS)
    reset = eager.run_plan_isolated(card, steps, fresh_each_step=True)
    facts = LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=list(card.methods),
        export=ExportFacts(
            ["cross_cache", "self_state"],
            ["cross_cache", "self_state"],
            {"encode": ["cross_cache"], "decode": ["self_state"]},
        ),
    )
    with pytest.raises(CheckFailure) as raised:
        cross_method.check_cross_method_state(_outcome(_rows(reset), ref, facts, tmp_path, mode=Mode.SKIP))
    failure = raised.value
    message = str(failure)
    assert failure.signature == "state_reset_between_steps", "the first of LOST_STATE's order"
    assert failure.evidence["explanations"] == [
        "state_reset_between_steps",
        "state_per_method",
        "state_read_as_constant",
    ]
    for words in ("every step started from the registered values", "each method on its own copy", "as constants"):
        assert words in message
    assert "A non-zero initial state separates state_reset_between_steps from state_per_method" in message


def test_one_explanation_is_named_alone(tmp_path):
    card = cards.find(CARD)
    fresh = eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=True)
    with pytest.raises(CheckFailure) as raised:
        cross_method.check_cross_method_state(_outcome(_rows(fresh), tmp=tmp_path, mode=Mode.SKIP))
    assert raised.value.evidence["explanations"] == ["state_reset_between_steps"]
    assert "alike" not in str(raised.value)


def test_quantized_methods_agreeing_on_the_encoding_pass(tmp_path):
    card = cards.find(CARD)
    same = "scale=2.19348e-05 zero_point=0 range=[0,65535] int32"
    facts = LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=list(card.methods),
        # read differs from write within a method: not this check's question (it compares methods)
        buffer_encodings={
            "prefill": {"kv_cache": {"write": same, "read": "scale=1 zero_point=0 range=[0,65535] int32"}},
            "decode": {"kv_cache": {"write": same}},
        },
    )
    outcome = _outcome([list(row) for row in eager.run_steps(card, card.steps(STEPS))], facts=facts, tmp=tmp_path)
    assert "encoding_difference" not in cross_method.check_cross_method_state(outcome)


def test_single_method_cases_are_not_applicable(tmp_path):
    """(The other checks judge multi-method cases per method: harness/tests/core/test_per_method.py.)"""
    with pytest.raises(NotApplicable):
        cross_method.check_cross_method_state(_outcome(None, "fixtures.zoo:counter_add", tmp=tmp_path))


class _TotalAndLast(torch.nn.Module):
    """`add` writes both buffers; `carry` adds `last` (which only `add` writes) into `total`."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(1, 4))
        self.register_buffer("last", torch.zeros(1, 4))

    def add(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        self.last.mul_(0.0).add_(x)
        return self.total * 1.0

    def carry(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(self.last)
        return self.total + x * 0.0


TOTAL_AND_LAST = ModelCard(
    name="total_and_last",
    build=_TotalAndLast,
    steps=lambda n: [(torch.full((1, 4), float(step + 1)),) for step in range(n)],
    mutated_buffers=("total", "last"),
    module=__name__,
    methods=("add", "carry"),
    plan=lambda n: ["add" if step % 2 == 0 else "carry" for step in range(n)],
)


def test_a_method_reading_a_buffer_it_never_writes_as_a_constant_is_named_so(tmp_path):
    """Only the constant read explains it (carry shares `total` with add but reads `last` as registered): its
    own signature, no other explanation named; a device that carried everything passes."""
    steps = TOTAL_AND_LAST.steps(STEPS)
    writes = {"add": ["last", "total"], "carry": ["total"]}
    constant = eager.run_plan_isolated(TOTAL_AND_LAST, steps, False, model="constant_read", writes=writes)
    facts = LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=["add", "carry"],
        export=ExportFacts(["last", "total"], ["last", "total"], writes),
    )
    case = Case(TOTAL_AND_LAST, "fp16", Mode.SKIP, "SM8650")
    (tmp_path / "model.pte").write_bytes(b"x")

    def outcome(device) -> CaseOutcome:
        raw = [[np.ascontiguousarray(array).view(np.uint8).reshape(-1) for array in row] for row in device]
        return CaseOutcome(
            case,
            steps,
            LoweredArtifact(case, tmp_path, facts, "", 0.0),
            eager.run_steps(TOTAL_AND_LAST, steps),
            run=DeviceRun(raw, [], None, ""),
        )

    with pytest.raises(CheckFailure) as raised:
        cross_method.check_cross_method_state(outcome(_rows(constant)))
    assert raised.value.signature == "state_read_as_constant"
    assert raised.value.evidence["explanations"] == ["state_read_as_constant"]
    cross_method.check_cross_method_state(outcome(_rows(eager.run_steps(TOTAL_AND_LAST, steps))))
