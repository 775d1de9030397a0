"""Shared buffers (docs/FINDINGS.md#F20): the card option reaches the memory plan
(graph inputs and outputs unplanned, so the application supplies them) and the lowering key, and on an
emulated device the suite's runner runs such a program with memory it supplies, says which memory, and
gives eager's outputs; a plain program keeps planned I/O. (The option reaching the compiler spec is
test_online_prepare's test of both options.)"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from fixtures import shared_buffer
from harness.device.execute import DeviceRunRequest, run_case
from harness.pipeline import cache, card as cards, stages
from harness.pipeline.lower import lower_case
from harness.tests.emulator import test_suite_runner_device as emulated
from harness.vocabulary import DEFAULT_CARD_MODULES, Case, Mode

CARDS = [card for card in cards.cards() if card.module == shared_buffer.__name__]
KV = "fixtures.shared_buffer:shared_buffer_kv_write"
# The emulated device's fixtures (one SM8650, its payload, a plain program of the zoo).
fleet, device, workspace, lowered = emulated.fleet, emulated.device, emulated.workspace, emulated.lowered


def test_the_family_is_in_the_default_matrix_and_only_it_asks_for_shared_buffers():
    assert shared_buffer.__name__ in DEFAULT_CARD_MODULES
    assert {card.name for card in CARDS} == {"shared_buffer_counter", "shared_buffer_kv_write"}
    assert all(card.shared_buffer and not card.online_prepare for card in CARDS)
    assert not any(card.shared_buffer for card in cards.cards() if card.module != shared_buffer.__name__)


@pytest.mark.parametrize("shared", [False, True])
def test_memory_plan_leaves_io_unplanned_only_for_a_shared_buffer_card(shared):
    card = dataclasses.replace(cards.find(KV), shared_buffer=shared)
    for planning in (stages.backend_config(card).memory_planning_pass, stages.memory_planning(card, True)):
        assert (planning.alloc_graph_input, planning.alloc_graph_output) == (not shared, not shared)
    assert stages.backend_config(card, True).memory_planning_pass.share_mutable_buffers is True
    assert stages.backend_config(card).memory_planning_pass.share_mutable_buffers is False


@pytest.mark.qnn
def test_a_shared_buffer_program_has_a_lowering_key_of_its_own(toolchain):
    card = cards.find(KV)
    shared = Case(card, "fp16", Mode.DELEGATE, "SM8650")
    plain = Case(dataclasses.replace(card, shared_buffer=False), "fp16", Mode.DELEGATE, "SM8650")
    assert cache.key(shared, 4, toolchain) != cache.key(plain, 4, toolchain)


def _planned(pte, toolchain) -> list[bool]:
    """Whether each input and output of the program's forward is memory-planned, as executorch reads it."""
    code = (
        "import json, sys; from executorch.runtime import Runtime\n"
        "meta = Runtime.get().load_program(sys.argv[1]).metadata('forward')\n"
        "print(json.dumps([meta.input_tensor_meta(i).is_memory_planned() for i in range(meta.num_inputs())]"
        " + [meta.output_tensor_meta(i).is_memory_planned() for i in range(meta.num_outputs())]))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(pte)],
        env=toolchain.child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.qnn
def test_a_plain_program_keeps_its_io_planned(toolchain, lowered):
    """The twin: a card without the option (the emulated device's kv_gather_written) plans all its I/O."""
    assert set(_planned(lowered.pte, toolchain)) == {True}


@pytest.mark.qnn
@pytest.mark.parametrize("mode", [Mode.DELEGATE, Mode.SKIP])
def test_the_runner_supplies_the_io_of_a_shared_buffer_program(mode, toolchain, device, workspace, tmp_path):
    """A shared-buffer program leaves its I/O unplanned and runs on the emulated device through the suite's
    runner, with --shared_buffer, to eager's outputs (two per step), in ordinary memory (the host has no
    rpcmem, F20), which the run says. Without the runner's supplied outputs QNN fails the execute ("clientBuf
    is null", measured)."""
    import torch

    case = Case(cards.find(KV), "fp16", mode, "SM8650")
    steps = case.card.steps(emulated.STEPS)
    eager = case.card.build()
    with torch.no_grad():
        expected = [[tensor.numpy() for tensor in eager(*step)] for step in steps]
    program = lower_case(case, toolchain, tmp_path / "lowered", emulated.STEPS)
    assert program.ok, program.failure
    assert set(_planned(program.pte, toolchain)) == {False}
    run = run_case(
        device, workspace, DeviceRunRequest("shared", program.pte, steps, tmp_path / "run", 2, shared_buffer=True)
    )
    assert run.io_memory == "ordinary"
    for step, (row, want) in enumerate(zip(run.outputs, expected, strict=True)):
        for index, (raw, reference) in enumerate(zip(row, want, strict=True)):
            got = raw.view(np.float32).reshape(reference.shape)
            assert np.allclose(got, reference, atol=1e-2), f"step {step} output {index}: {got} != {reference}"
