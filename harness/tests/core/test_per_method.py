"""The existing checks judge a multi-method case per method: partitions, annotation, address_sharing,
state and initial_state each fail a case where ONE method is broken, naming that method, and pass a good one;
a method the rule cannot apply to is recorded as not applicable with its reason, never as a pass.

No QNN here: lowering facts, execute traces and device outputs are constructed (device outputs are eager's
own, run another way, in the runner's byte layout), as in test_cross_method.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fixtures import multi_method  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure, NotApplicable, NotMeasured
from harness.checks import cross_method, device_state, lowering
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import (
    Delegate,
    ExportFacts,
    LoweringFacts,
    PartitionFacts,
    ProgramFacts,
    QuantizeFacts,
)
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import Case, Mode

STEPS = 4
PREFILL_DECODE = "fixtures.multi_method:mm_prefill_decode"
COUNTER = "fixtures.multi_method:mm_counter"


def _partitions(per_method: dict[str, int], outside: dict[str, list[str]] | None = None) -> PartitionFacts:
    outside = outside or {}
    methods = {
        method: PartitionFacts(
            [Delegate(f"lowered_module_{i}", lowering.QNN_BACKEND) for i in range(count)], [], outside.get(method, [])
        )
        for method, count in per_method.items()
    }
    joined = [Delegate(f"{m}.{d.name}", d.backend) for m, f in methods.items() for d in f.delegates]
    return PartitionFacts(joined, [], sorted({b for f in methods.values() for b in f.buffers_outside}), methods)


def _facts(card_ref: str, **fields) -> LoweringFacts:
    card = cards.find(card_ref)
    writes = (
        {"advance": ["count"], "read": []} if card.name == "mm_counter" else dict.fromkeys(card.methods, ["kv_cache"])
    )
    defaults = {
        "program": ProgramFacts("0" * 64, 1),
        "methods": list(card.methods),
        "export": ExportFacts(sorted(card.mutated_buffers), sorted(card.mutated_buffers), writes),
        "partitions": _partitions(dict.fromkeys(card.methods, 1)),
    }
    return LoweringFacts(**{**defaults, **fields})


def _outcome(
    tmp: Path,
    card_ref: str = PREFILL_DECODE,
    device: list[list[np.ndarray]] | None = None,
    facts: LoweringFacts | None = None,
    mode: Mode = Mode.DELEGATE,
    dtype: str = "fp16",
    trace: Path | None = None,
) -> CaseOutcome:
    card = cards.find(card_ref)
    case = Case(card, dtype, mode, "SM8650")
    steps = card.steps(STEPS)
    reference = eager.run_steps(card, steps)
    device = [list(row) for row in reference] if device is None else device
    artifact = LoweredArtifact(case, tmp, facts or _facts(card_ref), "", 0.0)
    (tmp / "model.pte").write_bytes(b"x")  # artifact.ok needs the file; nothing reads it
    raw = [[np.ascontiguousarray(array).view(np.uint8).reshape(-1) for array in row] for row in device]
    return CaseOutcome(
        case,
        steps,
        artifact,
        reference,
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=DeviceRun(raw, [], trace, ""),
    )


def _failure(check, outcome: CaseOutcome) -> CheckFailure:
    with pytest.raises(CheckFailure) as failure:
        check(outcome)
    return failure.value


# partitions -----------------------------------------------------------------------------------------------
def test_partitions_fail_naming_the_method_with_the_wrong_count(tmp_path):
    outcome = _outcome(tmp_path, facts=_facts(PREFILL_DECODE, partitions=_partitions({"prefill": 1, "decode": 2})))
    failure = _failure(lowering.check_partitions, outcome)
    assert failure.signature == "partition_count"
    assert str(failure).startswith("method decode: 2 delegate(s)") and "expected 1 x" in str(failure)
    assert failure.evidence["method"] == "decode"


def test_partitions_pass_one_delegate_per_method_and_judge_each(tmp_path):
    result = lowering.check_partitions(_outcome(tmp_path))
    assert set(result["methods"]) == {"prefill", "decode"} and not result["not_applicable"]


def test_partitions_in_skip_mode_fail_the_method_whose_written_buffer_went_inside(tmp_path):
    partitions = _partitions({"prefill": 1, "decode": 1}, {"prefill": ["kv_cache"]})
    outcome = _outcome(tmp_path, facts=_facts(PREFILL_DECODE, partitions=partitions), mode=Mode.SKIP)
    failure = _failure(lowering.check_partitions, outcome)
    assert failure.signature == "buffer_not_outside" and str(failure).startswith("method decode:")
    both = _partitions({"prefill": 1, "decode": 1}, {"prefill": ["kv_cache"], "decode": ["kv_cache"]})
    lowering.check_partitions(_outcome(tmp_path, facts=_facts(PREFILL_DECODE, partitions=both), mode=Mode.SKIP))


def test_partitions_without_per_method_facts_are_not_a_pass(tmp_path):
    joined = PartitionFacts(
        [Delegate("prefill.x", lowering.QNN_BACKEND), Delegate("decode.x", lowering.QNN_BACKEND)], [], []
    )
    with pytest.raises(NotApplicable, match="method prefill: .*older suite"):
        lowering.check_partitions(_outcome(tmp_path, facts=_facts(PREFILL_DECODE, partitions=joined)))


# annotation -----------------------------------------------------------------------------------------------
def test_annotation_fails_naming_the_method_whose_graph_annotates_the_buffer(tmp_path):
    quantize = QuantizeFacts([{"op": "decode: aten.mul.Tensor", "buffer": "kv_cache"}], [], {})
    outcome = _outcome(tmp_path, facts=_facts(PREFILL_DECODE, quantize=quantize), dtype="16a8w")
    failure = _failure(lowering.check_annotation, outcome)
    assert failure.signature == "buffer_annotated"
    assert str(failure).startswith("method decode: mutated buffer kv_cache is annotated") and "aten.mul.Tensor" in str(
        failure
    )
    folded = QuantizeFacts([], [], {"prefill: kv_cache": {"before": 2, "after": 1}})
    failure = _failure(
        lowering.check_annotation, _outcome(tmp_path, facts=_facts(PREFILL_DECODE, quantize=folded), dtype="16a8w")
    )
    assert failure.signature == "buffer_reads_folded" and str(failure).startswith("method prefill: ")


def test_annotation_passes_clean_methods(tmp_path):
    outcome = _outcome(tmp_path, facts=_facts(PREFILL_DECODE, quantize=QuantizeFacts([], [], {})), dtype="16a8w")
    assert set(lowering.check_annotation(outcome)["methods"]) == {"prefill", "decode"}


# address_sharing ------------------------------------------------------------------------------------------
def _execute(graph: str, seq: int, mutbuf: tuple[str, str] | None) -> dict:
    inputs = [{"name": "input_1_x@0", "addr": "0x900"}]
    outputs = [{"name": "output_aten_mul_tensor@0", "addr": "0x980"}]
    if mutbuf:
        inputs.insert(0, {"name": "input_0_mutbuf_0_b_cache@0", "addr": mutbuf[0]})
        outputs.insert(0, {"name": "output_mutbuf_0_aten_add_tensor@0", "addr": mutbuf[1]})
    return {"event": "execute", "seq": seq, "graph": graph, "inputs": inputs, "outputs": outputs, "status": 0}


def _trace(tmp: Path, executes: list[dict]) -> Path:
    path = tmp / "trace.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in executes))
    return path


def test_address_sharing_fails_naming_the_method_whose_addresses_split(tmp_path):
    # prefill and decode each with their own address (F15's shape) is not this check's defect; decode's
    # input and output of one buffer at two addresses is
    good = [("prefill", ("0x10", "0x10")), ("decode", ("0x20", "0x20")), ("decode", ("0x20", "0x20"))]
    bad = [*good, ("decode", ("0x20", "0x28"))]
    trace = _trace(tmp_path, [_execute(g, i, m) for i, (g, m) in enumerate(bad)])
    failure = _failure(device_state.check_address_sharing, _outcome(tmp_path, trace=trace))
    assert failure.signature == "split_address" and str(failure).startswith("method decode: execute 2:")
    trace = _trace(tmp_path, [_execute(g, i, m) for i, (g, m) in enumerate([*good, ("decode", ("0x20", "0x20"))])])
    result = device_state.check_address_sharing(_outcome(tmp_path, trace=trace))
    assert result["methods"]["prefill"]["executes"] == 1 and result["methods"]["decode"]["executes"] == 3


def test_address_sharing_counts_each_methods_own_executes(tmp_path):
    """decode ran its three steps but prefill's graph never executed: prefill misses its executes."""
    trace = _trace(tmp_path, [_execute("decode", i, ("0x20", "0x20")) for i in range(4)])
    failure = _failure(device_state.check_address_sharing, _outcome(tmp_path, trace=trace))
    assert failure.signature == "missing_executes" and str(failure).startswith("method prefill: 0 graph execute(s)")


def test_a_method_that_writes_no_buffer_is_not_applicable_not_passed(tmp_path):
    """mm_counter's read only reads the counter: no output address to pair; advance is judged."""
    plan = [("advance", ("0x10", "0x10")), ("read", None), ("advance", ("0x10", "0x10")), ("read", None)]
    trace = _trace(tmp_path, [_execute(g, i, m) for i, (g, m) in enumerate(plan)])
    result = device_state.check_address_sharing(_outcome(tmp_path, COUNTER, trace=trace))
    assert list(result["methods"]) == ["advance"] and "writes no buffer" in result["not_applicable"]["read"]
    plan[2] = ("advance", ("0x10", "0x18"))
    trace = _trace(tmp_path, [_execute(g, i, m) for i, (g, m) in enumerate(plan)])
    failure = _failure(device_state.check_address_sharing, _outcome(tmp_path, COUNTER, trace=trace))
    assert str(failure).startswith("method advance: execute 1:")


def test_skip_mode_fails_the_method_with_a_mutbuf_tensor(tmp_path):
    trace = _trace(
        tmp_path, [_execute("prefill", 0, None), *(_execute("decode", i, ("0x1", "0x1")) for i in (1, 2, 3))]
    )
    failure = _failure(device_state.check_address_sharing, _outcome(tmp_path, trace=trace, mode=Mode.SKIP))
    assert failure.signature == "mutbuf_in_skip_mode" and str(failure).startswith("method decode:")


# state ----------------------------------------------------------------------------------------------------
def test_state_fails_naming_the_method_whose_own_state_is_wrong(tmp_path):
    """decode's elements that read only its own writes and the registered zeros (columns 4-7: positions
    prefill never wrote) are wrong at its last step; what it reads of prefill's writes is right."""
    card = cards.find(PREFILL_DECODE)
    reference = eager.run_steps(card, card.steps(STEPS))
    device = [[np.array(array) for array in row] for row in reference]
    device[3][0][..., 4:] += np.float32(3.0)
    failure = _failure(device_state.check_state, _outcome(tmp_path, device=device, mode=Mode.SKIP))
    assert failure.signature == "state_mismatch"
    assert str(failure).startswith("method decode: state differs from eager:") and "first at step 3" in str(failure)
    # nothing decode read of prefill's writes is wrong: not cross_method_state's defect (one verdict)
    crossed = cross_method.check_cross_method_state(_outcome(tmp_path, device=device, mode=Mode.SKIP))
    assert crossed["within_method_mismatches"] == 32
    result = device_state.check_state(_outcome(tmp_path))
    assert set(result["methods"]) == {"prefill", "decode"} and len(result["steps"]) == STEPS


def test_state_leaves_state_lost_between_methods_to_cross_method_state(tmp_path):
    """Each method on its own copy of the state (F15's shape): every element that differs reads what another
    method wrote, which cross_method_state names; state has nothing of its own to say (one verdict)."""
    card = cards.find(PREFILL_DECODE)
    isolated = eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=False)
    outcome = _outcome(tmp_path, device=[list(row) for row in isolated], mode=Mode.SKIP)
    assert _failure(cross_method.check_cross_method_state, outcome).signature == "state_per_method"
    device_state.check_state(outcome)


def test_state_of_a_method_whose_every_element_reads_another_methods_writes_is_not_applicable(tmp_path):
    result = device_state.check_state(_outcome(tmp_path, COUNTER))
    assert list(result["methods"]) == ["advance"] and "cross_method_state" in result["not_applicable"]["read"]


# initial_state --------------------------------------------------------------------------------------------
def test_initial_state_fails_naming_the_first_method_when_the_plans_first_step_ignores_the_registered_value(
    tmp_path,
):
    card = cards.find(PREFILL_DECODE)
    reference = eager.run_steps(card, card.steps(STEPS))
    device = [[np.array(array) for array in row] for row in reference]
    device[0][0][..., 4:] += np.float32(1.5)  # prefill's scores over positions it did not write: registered zeros
    failure = _failure(device_state.check_initial_state, _outcome(tmp_path, device=device, mode=Mode.SKIP))
    assert failure.signature == "initial_value_ignored"
    assert str(failure).startswith("method prefill: ") and "first at step 0" in str(failure)
    result = device_state.check_initial_state(_outcome(tmp_path, mode=Mode.SKIP))
    assert set(result["methods"]) == {"prefill", "decode"}


def test_initial_state_judges_each_methods_first_step_only(tmp_path):
    """decode's first step (step 1) reading registered zeros wrong fails naming decode; the same error at a
    later decode step is not this check's (state judges it)."""
    card = cards.find(PREFILL_DECODE)
    reference = eager.run_steps(card, card.steps(STEPS))
    first = [[np.array(array) for array in row] for row in reference]
    first[1][0][..., 6:] += np.float32(1.5)
    failure = _failure(device_state.check_initial_state, _outcome(tmp_path, device=first, mode=Mode.SKIP))
    assert str(failure).startswith("method decode: ") and "first at step 1" in str(failure)
    later = [[np.array(array) for array in row] for row in reference]
    later[3][0][..., 7:] += np.float32(1.5)
    device_state.check_initial_state(_outcome(tmp_path, device=later, mode=Mode.SKIP))


def test_initial_state_of_a_method_reading_only_another_methods_writes_is_not_applicable(tmp_path):
    result = device_state.check_initial_state(_outcome(tmp_path, COUNTER, mode=Mode.SKIP))
    assert list(result["methods"]) == ["advance"] and "read" in result["not_applicable"]


def test_state_leaves_every_element_that_reads_another_methods_write_to_cross_method_state_in_quantized_dtypes(
    tmp_path,
):
    """decode reading garbage wherever it reads prefill's writes (the measured delegate-mode shape) in 16a8w:
    an element whose value prefill's write changes only within the quantized tolerance still reads it (a
    crossing mask taken within the tolerance gave state 1-2 such elements a step to fail on)."""
    card = cards.find(PREFILL_DECODE)
    steps = card.steps(STEPS)
    reference, isolated = eager.run_steps(card, steps), eager.run_plan_isolated(card, steps, fresh_each_step=False)
    device = []
    for want, alone in zip(reference, isolated):
        reads_prefill = ~np.isclose(want[0], alone[0])
        device.append([np.where(reads_prefill, np.float32(131008.0), want[0]).astype(np.float32)])
    outcome = _outcome(tmp_path, device=device, mode=Mode.SKIP, dtype="16a8w")
    device_state.check_state(outcome)
    assert _failure(cross_method.check_cross_method_state, outcome).signature == "state_not_shared"


def test_address_sharing_whose_trace_names_no_method_is_not_measured(tmp_path):
    """Graphs named otherwise than the methods: which method an execute belongs to is unknown, not a failure
    of every method's executes; one graph named after a method is enough to judge."""
    trace = _trace(tmp_path, [_execute("graph_0", i, ("0x20", "0x20")) for i in range(4)])
    with pytest.raises(NotMeasured, match=r"traced graphs \['graph_0'\] are none of the program's methods"):
        device_state.check_address_sharing(_outcome(tmp_path, trace=trace))
    trace = _trace(
        tmp_path, [_execute("prefill", 0, ("0x20", "0x20")), *(_execute("graph_0", i, None) for i in (1, 2, 3))]
    )
    assert _failure(device_state.check_address_sharing, _outcome(tmp_path, trace=trace)).signature == "missing_executes"
