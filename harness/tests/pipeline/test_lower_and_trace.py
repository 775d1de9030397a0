"""Foundation end to end: lower a KV-cache model for SM8650 and run it on the HTP simulator.

Proves the host toolchain works (SDK, interposer bridge, trace): one QnnBackend delegate, no QNN
error line while lowering or running, and a trace that shows the delegated buffer's input and
output bound to one address at every execute.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.paths import REPO_ROOT
from harness.pipeline import card as cards, mutbuf
from harness.pipeline.lower import lower_case
from harness.qnn import qnnlog
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4


@pytest.fixture(scope="module", params=["fp16", "16a8w"])
def lowered(request, toolchain, tmp_path_factory):
    case = Case(cards.find("fixtures.zoo:kv_index_copy_dim1"), request.param, Mode.DELEGATE, "SM8650")
    return lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)


def test_one_qnn_delegate_and_clean_log(lowered):
    assert lowered.ok, lowered.failure
    assert [d.backend for d in lowered.facts.partitions.delegates] == ["QnnBackend"]
    assert lowered.facts.partitions.buffers_outside == [], "with buffer delegation the cache must live in the delegate"
    assert lowered.qnn_errors == []


def test_fresh_process_run_traces_shared_mutbuf_address(lowered, toolchain, tmp_path):
    assert lowered.ok, lowered.failure
    for step, inputs in enumerate(lowered.case.card.steps(STEPS)):
        for index, tensor in enumerate(inputs):
            tensor.numpy().tofile(tmp_path / f"input_{step}_{index}.raw")
    (tmp_path / "inputs.txt").write_text("".join(f"input_{s}_0.raw input_{s}_1.raw\n" for s in range(STEPS)))
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.emulator.host_runner",
            "--model_path",
            str(lowered.pte),
            "--input_list_path",
            "inputs.txt",
            "--output_folder_path",
            "outputs",
        ],
        cwd=tmp_path,
        env=toolchain.child_env(base={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT)}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = completed.stdout + completed.stderr
    assert completed.returncode == 0, log[-2000:]
    assert qnnlog.error_lines(log) == []
    assert len(list((tmp_path / "outputs").glob("output_*_0.raw"))) == STEPS
    records = mutbuf.read_trace(tmp_path / "outputs" / "trace.jsonl")
    assert len(records) == STEPS
    found = mutbuf.bindings(records)
    assert [b.execute for b in found] == list(range(STEPS)), "one cache binding per execute"
    assert all(b.output_name and "cache" in b.input_name for b in found)
    assert all(b.shared for b in found), [(b.input_address, b.output_address) for b in found]
    assert len({b.input_address for b in found}) == 1, "the buffer stays at one address across steps"
    output = np.fromfile(tmp_path / "outputs" / f"output_{STEPS - 1}_0.raw", dtype=np.float32)
    assert output.size == 1 * 8 * 4
