"""Multi-method cards from the card contract to a real lowering run by the compiled runner.

Without QNN: every multi-method card's plan runs each declared method, its eager plan on one module differs
from each method on its own copy (so state really crosses methods: a check built on it can fail), and its
methods together mutate exactly the declared buffers.

With QNN (the HTP simulator, the suite's compiled runner harness/runner/suite_runner.cpp): the prefill/decode
card lowered with skip_mutable_buffer=True passes cross_method_state when the plan runs in one process, and
fails with state_reset_between_steps when every step runs in a process of its own (what the emulated fault
switch runner_reload_each_line does on a device); quantized with each method's own calibration, its methods
disagree on the cache's encoding and the check names both encodings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixtures import multi_method
from harness.check_registry import CheckFailure
from harness.checks import cross_method
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager, stages
from harness.pipeline.lower import lower_case
from harness.runner import build as runner_build, run as runner_run
from harness.vocabulary import Case, Mode, ModelCard

STEPS = 4
SOC = "SM8650"
MULTI = [card for card in cards.cards() if card.module == multi_method.__name__]


def test_there_are_the_three_shapes():
    assert {card.name for card in MULTI} == {"mm_prefill_decode", "mm_encoder_decoder", "mm_counter"}


@pytest.mark.parametrize("card", MULTI, ids=lambda card: card.name)
def test_plan_runs_every_method_and_state_crosses_them(card: ModelCard):
    steps = card.steps(STEPS)
    assert set(card.step_methods(STEPS)) == set(card.methods)
    one_module = eager.run_steps(card, steps)
    own_copies = eager.run_plan_isolated(card, steps, fresh_each_step=False)
    assert any(not np.allclose(a, b) for row_a, row_b in zip(one_module, own_copies) for a, b in zip(row_a, row_b)), (
        "the plan's outputs must depend on what another method wrote"
    )


@pytest.mark.parametrize("card", MULTI, ids=lambda card: card.name)
def test_methods_together_mutate_exactly_the_declared_buffers(card: ModelCard):
    per_method = stages.method_calibration(card, card.steps(STEPS))
    examples = {method: rows[0] for method, rows in per_method.items()}
    facts = stages.export_facts(card, eager.build_model(card), examples)
    assert facts["buffers_to_mutate"] == sorted(card.mutated_buffers)


def test_a_plan_naming_an_undeclared_method_is_one_line():
    card = cards.find("fixtures.multi_method:mm_counter")
    broken = ModelCard(**{**card.__dict__, "name": "mm_broken", "plan": lambda n: ["advance", "peek"][:n]})
    with pytest.raises(ValueError, match=r"undeclared method\(s\) \['peek'\]"):
        broken.step_methods(2)


# --- on the HTP simulator ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner_binary() -> Path:
    try:
        return runner_build.build()
    except runner_build.RunnerBuildError as error:
        pytest.fail(str(error), pytrace=False)


def _lowered(toolchain, folder: Path, dtype: str, mode: Mode) -> CaseOutcome:
    card = cards.find("fixtures.multi_method:mm_prefill_decode")
    case = Case(card, dtype, mode, SOC)
    artifact = lower_case(case, toolchain, folder / case.id, STEPS)
    assert artifact.ok, artifact.failure
    steps = card.steps(STEPS)
    return CaseOutcome(case, steps, artifact, eager.run_steps(card, steps))


def _run(outcome: CaseOutcome, toolchain, binary: Path, folder: Path, one_process: bool) -> CaseOutcome:
    """The plan through the compiled runner: in one process (as a device runs it), or one process per step
    (the program loaded afresh before every step, as with the emulated device's runner_reload_each_line)."""
    methods = outcome.case.card.step_methods(len(outcome.steps))
    rows = []
    for step, inputs in enumerate(outcome.steps):
        names = []
        for index, tensor in enumerate(inputs):
            tensor.numpy().tofile(folder / f"input_{step}_{index}.raw")
            names.append(Path(f"input_{step}_{index}.raw"))
        rows.append((methods[step], names))
    env = runner_run.runner_env(toolchain)
    batches = [list(range(len(rows)))] if one_process else [[step] for step in range(len(rows))]
    outputs = []
    for batch in batches:
        plan = runner_run.write_plan([rows[step] for step in batch], folder / f"plan_{batch[0]}.txt")
        out = folder / f"out_{batch[0]}"
        ran = runner_run.run_plan(binary, outcome.artifact.pte, plan, out, env, ("--share_memory_arenas",))
        assert ran.exit_code == 0, ran.stderr[-2000:]
        outputs += [
            [np.fromfile(out / f"output_{k}_{i}.raw", dtype=np.uint8) for i in range(len(outcome.reference[0]))]
            for k in range(len(batch))
        ]
    outcome.run = DeviceRun(outputs, [], None, "", runner="suite_runner")
    return outcome


@pytest.mark.qnn
def test_prefill_state_reaches_decode_in_one_process_and_not_across_reloads(toolchain, runner_binary, tmp_path):
    (tmp_path / "one").mkdir()
    one = _run(_lowered(toolchain, tmp_path, "fp16", Mode.SKIP), toolchain, runner_binary, tmp_path / "one", True)
    evidence = cross_method.check_cross_method_state(one)
    assert evidence["plan"] == ["prefill", "decode", "decode", "decode"]
    reload_dir = tmp_path / "reload"
    reload_dir.mkdir()
    again = _run(_lowered(toolchain, tmp_path, "fp16", Mode.SKIP), toolchain, runner_binary, reload_dir, False)
    with pytest.raises(CheckFailure) as failure:
        cross_method.check_cross_method_state(again)
    assert failure.value.signature == "state_reset_between_steps", str(failure.value)


@pytest.mark.qnn
def test_separately_quantized_methods_disagree_on_the_cache_encoding_which_the_outputs_weigh(
    toolchain, runner_binary, tmp_path
):
    """The methods' two encodings of the cache are recorded, and the lowering records their CPU quantize/dequantize
    programs run on the plan; on the device (one process, the cache outside the delegate) the outputs are within
    the tolerance of eager, as those programs' are, so the difference is the check's evidence, not a failure."""
    outcome = _lowered(toolchain, tmp_path, "16a8w", Mode.SKIP)
    encodings = outcome.artifact.facts.buffer_encodings
    prefill, decode = encodings["prefill"]["kv_cache"]["write"], encodings["decode"]["kv_cache"]["write"]
    assert prefill != decode, "separate quantization should give the cache two scales"
    assert set(outcome.artifact.facts.modelled) == {"carried", "reset", "per_method", "constant_read"}
    (tmp_path / "one").mkdir()
    evidence = cross_method.check_cross_method_state(_run(outcome, toolchain, runner_binary, tmp_path / "one", True))
    kind = "read" if " reads it as " in evidence["encoding_difference"] else "write"
    assert all(
        encodings[method]["kv_cache"][kind] in evidence["encoding_difference"] for method in ("prefill", "decode")
    )
    assert max(step["max_abs_error"] for step in evidence["modelled_steps"]) < 0.01
