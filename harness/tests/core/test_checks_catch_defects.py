"""Every check fails on a deliberately broken input (a check that cannot fail is a defect).

Broken inputs: a card that misdeclares its buffer; a quantizer that annotates a buffer input; a
lowering split into 2 partitions; a trace whose mutbuf pair has two addresses; a runner that reloads
the program every step; a buffer whose registered value is ignored (executorch's own defect). Each
also has its healthy twin that passes, so the failure is the defect's doing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure, NotMeasured
from harness.checks import common, device_state, lowering
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager, stages
from harness.pipeline.facts import ExportFacts, LoweringFacts, QuantizeFacts
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.runner.contract import write_inputs
from harness.tests import broken_cards
from harness.vocabulary import Case, Mode

STEPS = 4


def _outcome(case: Case, facts: LoweringFacts, steps: list[tuple], directory: Path = Path(".")) -> CaseOutcome:
    artifact = LoweredArtifact(case, directory, facts, "", 0.0)
    return CaseOutcome(
        case, steps, artifact, eager.run_steps(case.card, steps), device_kind="emulated", device=kinds.of("emulated")
    )


def _lowered(toolchain, tmp_path_factory, card_name: str, skip: bool) -> CaseOutcome:
    card = cards.find(card_name)
    case = Case(card, "fp16", Mode.SKIP if skip else Mode.DELEGATE, "SM8650")
    artifact = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)
    steps = card.steps(STEPS)
    return CaseOutcome(case, steps, artifact, eager.run_steps(card, steps))


def _run_on_simulator(outcome: CaseOutcome, toolchain, directory: Path, faults: dict | None = None) -> CaseOutcome:
    """The emulated device's runner, invoked directly: same files and flags as on a device."""
    assert outcome.artifact.ok, outcome.artifact.failure
    rows = write_inputs(outcome.steps, directory)
    (directory / "inputs.txt").write_text("".join(" ".join(p.name for p in row) + "\n" for row in rows))
    env = toolchain.child_env()
    if faults:
        (directory / "faults.json").write_text(json.dumps(faults))
        env["EMULATED_FAULTS_FILE"] = str(directory / "faults.json")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.emulator.host_runner",
            "--model_path",
            str(outcome.artifact.pte),
            "--input_list_path",
            "inputs.txt",
            "--output_folder_path",
            "outputs",
        ],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    count = len(outcome.reference[0])
    files = [[directory / "outputs" / f"output_{s}_{i}.raw" for i in range(count)] for s in range(len(outcome.steps))]
    outputs = [[np.fromfile(path, dtype=np.uint8) for path in row] for row in files]
    return CaseOutcome(
        outcome.case,
        outcome.steps,
        outcome.artifact,
        outcome.reference,
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=DeviceRun(outputs, files, directory / "outputs" / "trace.jsonl", completed.stdout),
    )


# 1 export -------------------------------------------------------------------------------------------
def test_export_check_catches_a_misdeclared_buffer():
    for card, should_pass in ((broken_cards.MISDECLARED, False), (cards.find("fixtures.zoo:counter_add"), True)):
        steps = card.steps(1)
        facts = LoweringFacts(
            export=ExportFacts(**stages.export_facts(card, eager.build_model(card), {"forward": steps[0]}))
        )
        outcome = _outcome(Case(card, "fp16", Mode.DELEGATE, "SM8650"), facts, steps)
        if should_pass:
            lowering.check_export(outcome)
        else:
            with pytest.raises(CheckFailure, match=r"buffers_to_mutate \['actual'\] != .*\['declared'\]"):
                lowering.check_export(outcome)


# 2 annotation ---------------------------------------------------------------------------------------
def _annotation_facts(quantizer, card) -> LoweringFacts:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    steps = card.steps(1)
    graph_module = torch.export.export(eager.build_model(card), steps[0]).module()
    prepared = prepare_pt2e(graph_module, quantizer)
    return LoweringFacts(quantize=QuantizeFacts(stages.annotated_buffer_inputs(prepared, card.mutated_buffers), [], {}))


def test_annotation_check_catches_a_quantizer_that_annotates_the_buffer(toolchain, monkeypatch):
    monkeypatch.setenv("QNN_SDK_ROOT", str(toolchain.overlay_root))  # else QnnQuantizer tries to download an SDK
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype

    class BufferAnnotatingQuantizer(QnnQuantizer):
        def annotate(self, model):
            model = super().annotate(model)
            for node in model.graph.nodes:
                annotation = node.meta.get("quantization_annotation")
                buffers = [a for a in node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
                if annotation is not None and buffers and annotation.input_qspec_map:
                    annotation.input_qspec_map[buffers[0]] = next(iter(annotation.input_qspec_map.values()))
            return model

    card = cards.find("fixtures.zoo:kv_index_copy_dim1")
    case = Case(card, "16a8w", Mode.DELEGATE, "SM8650")
    for quantizer_class, should_pass in ((QnnQuantizer, True), (BufferAnnotatingQuantizer, False)):
        quantizer = quantizer_class()
        quantizer.set_default_quant_config(QuantDtype.use_16a8w)
        outcome = _outcome(case, _annotation_facts(quantizer, card), card.steps(1))
        if should_pass:
            lowering.check_annotation(outcome)
        else:
            with pytest.raises(CheckFailure, match="mutated buffer cache is annotated for quantization"):
                lowering.check_annotation(outcome)


# 3 partitions ----------------------------------------------------------------------------------------
def test_partition_check_catches_a_split_lowering(toolchain, tmp_path_factory):
    outcome = _lowered(toolchain, tmp_path_factory, "harness.tests.broken_cards:split_by_unsupported_op", skip=True)
    assert outcome.artifact.ok, outcome.artifact.failure
    with pytest.raises(CheckFailure, match=r"^2 delegate\(s\) \['QnnBackend'\], expected 1 .*aten.cumprod"):
        lowering.check_partitions(outcome)


# 4 address sharing -----------------------------------------------------------------------------------
def _trace_outcome(tmp_path: Path, addresses: list[tuple[str, str]]) -> CaseOutcome:
    card = cards.find("fixtures.zoo:kv_index_copy_dim1")
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "event": "execute",
                    "graph": "forward",
                    "inputs": [{"name": "input_0_mutbuf_0_b_cache@0", "mem": "raw", "addr": a, "bytes": 128}],
                    "outputs": [
                        {"name": "output_mutbuf_0_aten_index_put_default@0", "mem": "raw", "addr": b, "bytes": 128}
                    ],
                }
            )
            + "\n"
            for a, b in addresses
        )
    )
    steps = card.steps(len(addresses))
    (tmp_path / "model.pte").write_bytes(b"")  # the trace is what this check reads
    outcome = _outcome(Case(card, "fp16", Mode.DELEGATE, "SM8650"), LoweringFacts(), steps, tmp_path)
    outcome.run = DeviceRun([], [], trace, "")
    return outcome


def test_address_check_catches_a_pair_on_two_addresses(tmp_path):
    device_state.check_address_sharing(_trace_outcome(tmp_path, [("0x10", "0x10")] * 3))
    with pytest.raises(CheckFailure, match=r"execute 1: input_0_mutbuf_0_b_cache@0 at 0x10 but .* at 0x20"):
        device_state.check_address_sharing(
            _trace_outcome(tmp_path, [("0x10", "0x10"), ("0x10", "0x20"), ("0x10", "0x10")])
        )
    with pytest.raises(CheckFailure, match="changed address between executes"):
        device_state.check_address_sharing(
            _trace_outcome(tmp_path, [("0x10", "0x10"), ("0x30", "0x30"), ("0x30", "0x30")])
        )


def test_address_check_on_a_phone_is_not_measured_without_a_trace_and_checked_with_one(tmp_path):
    """A phone without the interposer cannot measure it (NotMeasured, never a pass or a plain skip); with the
    interposer pushed (--android-ndk) its trace is judged like any other."""
    outcome = _trace_outcome(tmp_path, [("0x10", "0x20")] * 3)
    outcome.device_kind, outcome.device = "phone", kinds.of("phone")
    with pytest.raises(CheckFailure, match="at 0x10 but"):
        device_state.check_address_sharing(outcome)
    outcome.run = DeviceRun([], [], None, "")
    with pytest.raises(NotMeasured, match=r"no execute trace from a phone: .* pass --android-ndk PATH"):
        device_state.check_address_sharing(outcome)


# 5 state and 6 initial state (real lowerings, real runs) --------------------------------------------
@pytest.fixture(scope="module")
def kv_outside(toolchain, tmp_path_factory):
    return _lowered(toolchain, tmp_path_factory, "fixtures.zoo:kv_gather_written", skip=True)


def test_state_check_catches_a_runner_that_reloads_every_step(kv_outside, toolchain, tmp_path):
    healthy = _run_on_simulator(kv_outside, toolchain, tmp_path / "healthy")
    device_state.check_state(healthy)
    broken = _run_on_simulator(kv_outside, toolchain, tmp_path / "broken", faults={"runner_reload_each_line": True})
    with pytest.raises(CheckFailure, match="state differs from eager") as failure:
        device_state.check_state(broken)
    assert failure.value.signature == "state_mismatch", (
        "state lost between steps is not the uninitialised-buffer signature"
    )
    assert failure.value.evidence["steps"][0]["mismatches"] == 0, "step 0 is right; the loss shows from step 1 on"


def test_initial_state_check_catches_an_ignored_registered_value(toolchain, tmp_path_factory, tmp_path):
    """kv_arange_init starts from arange: with the buffer outside the delegate executorch honours it;
    delegated, QnnManager never copies it in, so the check must fail with that signature."""
    outside = _lowered(toolchain, tmp_path_factory, "fixtures.zoo:kv_arange_init", skip=True)
    device_state.check_initial_state(_run_on_simulator(outside, toolchain, tmp_path / "outside"))
    delegated = _lowered(toolchain, tmp_path_factory, "fixtures.zoo:kv_arange_init", skip=False)
    with pytest.raises(CheckFailure, match="did not start from its registered value") as failure:
        device_state.check_initial_state(_run_on_simulator(delegated, toolchain, tmp_path / "delegated"))
    assert failure.value.signature == common.UNINITIALISED_DELEGATED_BUFFER
