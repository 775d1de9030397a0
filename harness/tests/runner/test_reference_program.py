"""suite_runner's reference program (--reference_model_path): the performance gate's drift meter, timed after
each step in the same process, must leave the case alone: same outputs, byte for byte, as a run without it,
and a reference that cannot load is one line, not a silent run without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.runner import run as runner_run
from harness.tests.runner.test_compiled_runner import SOC, STEPS, _raw_inputs, runner_binary  # noqa: F401

pytestmark = pytest.mark.qnn


@pytest.fixture(scope="module")
def lowered(toolchain, tmp_path_factory) -> dict[str, Path]:
    """counter_add fp16 delegated (a buffer the delegate keeps: state a stray execute would change) and the
    health check's one-op program, both lowered for the SoC."""
    from fixtures import zoo  # noqa: F401  (registers the cards)
    from harness.health import health_case
    from harness.pipeline import card as cards, health_card
    from harness.pipeline.lower import lower_case
    from harness.vocabulary import Case, Mode

    folder = tmp_path_factory.mktemp("reference")
    case = Case(cards.find("fixtures.zoo:counter_add"), "fp16", Mode.DELEGATE, SOC)
    program = lower_case(case, toolchain, folder / "case", STEPS)
    reference = lower_case(health_case(SOC), toolchain, folder / "reference", health_card.STEPS)
    assert program.ok and reference.ok, program.failure or reference.failure
    files = _raw_inputs(case.card.steps(STEPS), folder / "inputs")
    plan = runner_run.write_plan([("forward", row) for row in files], folder / "plan.txt")
    return {"program": program.pte, "reference": reference.pte, "plan": plan}


def test_reference_leaves_the_cases_outputs_as_they_were(runner_binary, lowered, toolchain, tmp_path):  # noqa: F811
    from harness.device.kinds import EmulatedKind

    env = EmulatedKind.heap_environment(runner_run.runner_env(toolchain))
    alone = runner_run.run_plan(runner_binary, lowered["program"], lowered["plan"], tmp_path / "alone", env)
    beside = runner_run.run_plan(
        runner_binary, lowered["program"], lowered["plan"], tmp_path / "beside", env, reference=lowered["reference"]
    )
    for ran in (alone, beside):
        assert ran.exit_code == 0, (ran.stdout + ran.stderr)[-3000:]
    assert alone.reference_us == [] and len(beside.reference_us) == STEPS
    assert all(micros > 0 for micros in beside.reference_us)
    assert len(beside.steps) == STEPS, "the reference's lines must not read as the case's steps"
    outputs = sorted(path.name for path in (tmp_path / "alone").glob("output_*.raw"))
    assert outputs and outputs == sorted(path.name for path in (tmp_path / "beside").glob("output_*.raw"))
    for name in outputs:  # the counter's state at every step: a reference that touched it would differ here
        assert (tmp_path / "beside" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name


def test_a_reference_that_cannot_load_is_one_line(runner_binary, lowered, toolchain, tmp_path):  # noqa: F811
    broken = tmp_path / "broken.pte"
    broken.write_bytes(b"not a program")
    env = runner_run.runner_env(toolchain)
    ran = runner_run.run_plan(
        runner_binary, lowered["program"], lowered["plan"], tmp_path / "out", env, reference=broken
    )
    assert ran.exit_code == 4 and ran.error_line is not None and "reference program" in ran.error_line
    assert not ran.steps, "no step runs without the reference it was asked to time against"
