"""runner_parity's own logic, on runs given to it (no device): bit-equal passes, a one-element change or a
one-ulp change is caught with the step, output, size of the difference and both runners named; a reference
runner that fails, a device without the compiled runner and a bundle without a second runner each get their
own verdict; the check's matrix covers both buffer modes and a quantized dtype in a few cases."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.check_registry import CheckFailure, InfrastructureError, NotMeasured, get
from harness.checks import runner_parity
from harness.device import kinds
from harness.outcome import CaseOutcome, OtherRun
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import LoweringFacts
from harness.pipeline.lower import LoweredArtifact
from harness.vocabulary import DTYPES, MATRIX_MODES, Case, Mode

STEPS = 4
PROGRAM: dict[str, Path] = {}  # the folder of this test's model.pte (the fixture below)


@pytest.fixture(autouse=True)
def program(tmp_path, monkeypatch):
    """A folder with a model.pte, so the outcomes count as lowered (the check never reads the program)."""
    (tmp_path / "model.pte").write_bytes(b"")
    monkeypatch.setitem(PROGRAM, "folder", tmp_path)


@dataclass
class Run:
    """A device run as the checks read it (harness/outcome.py DeviceOutputs)."""

    outputs: list[list[np.ndarray]]
    runner: str = runner_parity.COMPILED_RUNNER
    trace: Path | None = None
    heap_pattern: int | None = None
    step_times_us: list[int] = field(default_factory=list)
    peak_rss_kb: int | None = None


def _raw(rows: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    return [[np.ascontiguousarray(array).view(np.uint8).ravel().copy() for array in row] for row in rows]


def _outcome(
    reference_run=None, runner: str = runner_parity.COMPILED_RUNNER, card: str = "kv_gather_written"
) -> CaseOutcome:
    """A case whose device run equals eager, and whose reference runner gives reference_run (default: the same)."""
    found = cards.find(f"fixtures.zoo:{card}")
    case = Case(found, "fp16", Mode.DELEGATE, "SM8650")
    steps = found.steps(STEPS)
    reference = eager.run_steps(found, steps)
    artifact = LoweredArtifact(case, PROGRAM["folder"], LoweringFacts(), "", 0.0)
    outcome = CaseOutcome(
        case, steps, artifact, reference, device_serial="emu-1", device_kind="emulated", device=kinds.of("emulated")
    )
    outcome.run = Run(_raw(reference), runner)
    outcome.reference_run = (
        reference_run
        if reference_run is not None
        else OtherRun(Run(_raw(reference), runner_parity.REFERENCE_RUNNER), device_serial="emu-1")
    )
    return outcome


def _changed(outcome: CaseOutcome, step: int, element: int, value=None, ulp: bool = False) -> OtherRun:
    rows = [[array.copy() for array in row] for row in outcome.reference]
    target = rows[step][0].reshape(-1)
    if ulp:
        target[element] = np.nextafter(target[element], np.inf, dtype=target.dtype)
    else:
        target[element] = value
    return OtherRun(Run(_raw(rows), runner_parity.REFERENCE_RUNNER), device_serial="emu-1")


def test_equal_outputs_pass():
    evidence = runner_parity.check_runner_parity(_outcome())
    assert evidence["tolerance"] == "bit-equal" and evidence["differences"] == [] and evidence["step_count"] == STEPS


def test_a_changed_element_names_step_output_difference_and_both_runners():
    healthy = _outcome()
    broken = _outcome(_changed(healthy, step=2, element=3, value=healthy.reference[2][0].reshape(-1)[3] + 0.5))
    with pytest.raises(CheckFailure) as failure:
        runner_parity.check_runner_parity(broken)
    message = str(failure.value)
    assert failure.value.signature == "runner_outputs_differ"
    assert message.startswith("step 2 output 0: suite_runner (compiled, on emu-1) and qnn_executor_runner (reference")
    assert "1 of 8 element(s) differ, max abs difference 0.5" in message and "tolerance: bit-equal" in message
    assert failure.value.evidence["differences"][0]["step"] == 2


def test_one_ulp_is_a_difference_too():
    healthy = _outcome()
    with pytest.raises(CheckFailure, match=r"step 0 output 0: .* 1 of 8 element\(s\) differ"):
        runner_parity.check_runner_parity(_outcome(_changed(healthy, step=0, element=0, ulp=True)))


def test_a_nan_against_a_number_is_a_difference():
    healthy = _outcome()
    with pytest.raises(CheckFailure, match=r"step 1 output 0: .* max abs difference nan"):
        runner_parity.check_runner_parity(_outcome(_changed(healthy, step=1, element=0, value=np.nan)))


def test_a_failed_reference_runner_is_its_own_signature():
    failed = OtherRun(None, "runner on emu-1 exited 1 (last words: boom)", device_serial="emu-1")
    with pytest.raises(
        CheckFailure, match=r"reference runner qnn_executor_runner failed where suite_runner ran: .*boom"
    ) as failure:
        runner_parity.check_runner_parity(_outcome(failed))
    assert failure.value.signature == "reference_runner_failed"


def test_a_lost_device_during_the_reference_run_is_infrastructure():
    with pytest.raises(InfrastructureError, match="device emu-1 lost"):
        runner_parity.check_runner_parity(_outcome(OtherRun(None, "device emu-1 lost", infrastructure=True)))


def test_a_device_without_the_compiled_runner_is_not_measured():
    outcome = _outcome(runner=runner_parity.REFERENCE_RUNNER)
    with pytest.raises(
        NotMeasured, match=r"through qnn_executor_runner, .*: this device's payload has no suite_runner"
    ):
        runner_parity.check_runner_parity(outcome)
    outcome.device = kinds.of("phone")
    with pytest.raises(
        NotMeasured,
        match=r"through qnn_executor_runner, not the suite's compiled runner: .*--android-ndk PATH and --executorch-android-build DIR",
    ):
        runner_parity.check_runner_parity(outcome)


def test_no_reference_run_is_not_measured():
    outcome = _outcome()
    outcome.reference_run = None
    with pytest.raises(NotMeasured, match="no qnn_executor_runner run of this case to compare with"):
        runner_parity.check_runner_parity(outcome)


def test_the_check_reads_the_outcome_only():
    """A pure function of the outcome: judging it twice gives the same evidence and runs nothing (the
    reference run is made by the case store before any check judges the case)."""
    outcome = _outcome()
    assert runner_parity.check_runner_parity(outcome) == runner_parity.check_runner_parity(outcome)
    assert not any(callable(value) for value in vars(outcome).values()), "the outcome holds no callback"


def test_the_signatures_are_declared():
    spec = get("runner_parity")
    assert spec.needs_device and spec.declares("runner_outputs_differ") and spec.declares("reference_runner_failed")
    assert spec.reference_runner == runner_parity.REFERENCE_RUNNER, (
        "its cases are run through the reference runner first"
    )


def test_the_matrix_is_small_and_covers_both_modes_and_a_quantized_dtype():
    every = cards.cards()
    chosen = runner_parity._parity_matrix(every, DTYPES, ["SM8650", "SM8750"])
    assert {case.card.name for case in chosen} == {runner_parity.PARITY_CARDS[0]}
    assert {(case.dtype, case.mode) for case in chosen} == {("fp16", Mode.DELEGATE), ("16a8w", Mode.SKIP)}
    assert len(chosen) == 2 * 2  # (dtype, mode) pairs x SoCs
    assert {(case.dtype, case.mode) for case in runner_parity._parity_matrix(every, ("fp16",), ["SM8650"])} == {
        ("fp16", mode) for mode in MATRIX_MODES
    }
    assert {(case.dtype, case.mode) for case in runner_parity._parity_matrix(every, ("8a8w",), ["SM8650"])} == {
        ("8a8w", mode) for mode in MATRIX_MODES
    }
    fallback = [card for card in every if card.name != runner_parity.PARITY_CARDS[0]]
    assert {case.card.name for case in runner_parity._parity_matrix(fallback, DTYPES, ["SM8650"])} == {
        runner_parity.PARITY_CARDS[1]
    }
    own = [card for card in every if card.name == "ring_buffer"]
    assert {case.card.name for case in runner_parity._parity_matrix(own, DTYPES, ["SM8650"])} == {"ring_buffer"}
