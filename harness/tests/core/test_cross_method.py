"""cross_method_state (harness/checks.py) on constructed device outputs: it passes a device that carries state
across methods and fails, each with its own signature, one that reloads the program every step, one whose
methods each keep a copy of the state, one whose reading method used garbage state and one that is simply
wrong; a quantized program whose methods disagree on a shared buffer's encoding fails naming both encodings.

No QNN here: the device outputs are eager's own, run another way (harness/pipeline/eager.py), in the
runner's byte layout. The end-to-end twin (a real lowering on the HTP simulator, the compiled runner in one
process and one process per step) is harness/tests/pipeline/test_multi_method.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import (
    multi_method,  # noqa: F401  (registers the cards)
    zoo,  # noqa: F401
)
from harness import checks
from harness.check_registry import CheckFailure, NotApplicable
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import LoweringFacts, ProgramFacts
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import Case, Mode

STEPS = 4
CARD = "fixtures.multi_method:mm_prefill_decode"


def _outcome(
    device: list[list[np.ndarray]] | None,
    card_ref: str = CARD,
    facts: LoweringFacts | None = None,
    tmp: Path | None = None,
) -> CaseOutcome:
    card = cards.find(card_ref)
    case = Case(card, "fp16", Mode.DELEGATE, "SM8650")
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
        checks.check_cross_method_state(outcome)
    return failure.value.signature


def test_passes_where_decode_reads_what_prefill_wrote(tmp_path):
    card = cards.find(CARD)
    outcome = _outcome([list(row) for row in eager.run_steps(card, card.steps(STEPS))], tmp=tmp_path)
    assert checks.check_cross_method_state(outcome)["plan"] == ["prefill", "decode", "decode", "decode"]


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


def test_quantized_methods_disagreeing_on_the_shared_encoding_fail_naming_both(tmp_path):
    card = cards.find(CARD)
    prefill = "scale=2.19348e-05 zero_point=0 range=[0,65535] int32"
    decode = "scale=1.43053e-05 zero_point=0 range=[0,65535] int32"
    facts = LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=list(card.methods),
        buffer_encodings={"prefill": {"kv_cache": {"write": prefill}}, "decode": {"kv_cache": {"write": decode}}},
    )
    with pytest.raises(CheckFailure) as failure:
        checks.check_cross_method_state(_outcome(None, facts=facts, tmp=tmp_path))
    assert failure.value.signature == "buffer_encoding_mismatch"
    assert prefill in str(failure.value) and decode in str(failure.value)


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
    checks.check_cross_method_state(outcome)


def test_single_method_cases_are_not_applicable(tmp_path):
    """(The other checks judge multi-method cases per method: harness/tests/core/test_per_method.py.)"""
    with pytest.raises(NotApplicable):
        checks.check_cross_method_state(_outcome(None, "fixtures.zoo:counter_add", tmp=tmp_path))
