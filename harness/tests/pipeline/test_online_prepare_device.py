"""Online prepare on a real device run (docs/FINDINGS.md#F19, bridged): an online-prepared program lowered by
the suite and run by the suite's compiled runner on an emulated device loads, composes its graph on the device
and keeps its state from step to step (eager's outputs), and its mutable buffer's input and output share one
address at every execute (upstream #16423); the same run's trace is what address_sharing reads."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures import online_prepare  # noqa: F401  (registers the cards)
from harness.device.execute import DeviceRunRequest, run_case
from harness.pipeline import card as cards, mutbuf
from harness.pipeline.lower import lower_case
from harness.tests.emulator import test_suite_runner_device as emulated
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
CARD = "fixtures.online_prepare:online_prepare_kv_write"
# The emulated device's fixtures (one SM8650 and its payload).
fleet, device, workspace = emulated.fleet, emulated.device, emulated.workspace


def test_an_online_prepared_program_runs_and_shares_its_buffers_address(toolchain, device, workspace, tmp_path):
    if not toolchain.probe.bridge_compose_graphs:
        pytest.skip(f"no composeGraphs bridge here ({toolchain.probe.compose_probe})")
    import torch

    case = Case(cards.find(CARD), "fp16", Mode.DELEGATE, "SM8650")
    steps = case.card.steps(emulated.STEPS)
    eager = case.card.build()
    with torch.no_grad():
        expected = [eager(*step).numpy() for step in steps]
    program = lower_case(case, toolchain, tmp_path / "lowered", emulated.STEPS)
    assert program.ok, program.failure
    run = run_case(
        device, workspace, DeviceRunRequest("online", program.pte, steps, tmp_path / "online", output_count=1)
    )
    for step, (row, want) in enumerate(zip(run.outputs, expected, strict=True)):
        got = row[0].view(np.float32).reshape(want.shape)
        assert np.allclose(got, want, atol=1e-2), f"step {step}: {got} != {want}"
    found = mutbuf.bindings(mutbuf.read_trace(run.trace))
    assert {binding.execute for binding in found} == set(range(emulated.STEPS)), found
    assert all(binding.shared for binding in found), [b for b in found if not b.shared]
