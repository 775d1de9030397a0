"""runner_parity: the suite's compiled runner and the reference runner give bit-equal outputs for one case
(the reference run is made by the case store before judging)."""

from __future__ import annotations

import numpy as np

from harness.check_registry import CheckFailure, InfrastructureError, NotMeasured, check
from harness.checks.common import (
    require_run,
)
from harness.outcome import CaseOutcome
from harness.pipeline import cases
from harness.vocabulary import FLOAT_DTYPE, Mode

# The device runners, by their payload command names (harness/device/payload.py; the checks are carried into
# reproduction bundles, which have no device package, so the names are spelled here and a harness test keeps
# them equal): the suite's compiled runner (suite_runner.cpp, a step plan in one process) runs every case;
# upstream's qnn_executor_runner is the reference (on emulated devices executorch's Python pybindings, on a
# phone the user's own build).
COMPILED_RUNNER = "suite_runner"
REFERENCE_RUNNER = "qnn_executor_runner"
# The card the parity check runs on: the first of these the run has (a run of other cards, --models, takes
# its first card). KV caches that read only rows written during the run (two buffers written at the same
# step, else one): a card that reads an uninitialised delegated buffer (docs/FINDINGS.md#F1) gives each
# process its heap's bytes, so two runners could differ by that defect, not by a runner's (a phone's heap has
# no fixed fill).
PARITY_CARDS = ("kv_pair_gather_written", "kv_gather_written")


def _parity_matrix(cards: list, dtypes: tuple[str, ...], socs: list[str]) -> list:
    """The few cases runner_parity runs on: one card, twice a SoC: fp16 with the buffer in the delegate (float,
    bit-equal, the delegate's own state) and the run's first quantized dtype with the buffer outside it (the
    copy and quantize ops then run in each runner's kernel libraries, where two runners may differ); a run
    without one of the two dtypes takes the other. Why so few: the reference is a second device run per case
    that holds the device, on an emulated device a fresh pybindings Python in its jail: measured 3.8-7.0 s
    (2.2-2.8 s CPU) on a quiet machine and 7.1-13.0 s on a busy one, against 0.1-0.3 s for the compiled
    runner. Four a SoC cost 44 s of device time on the busy machine, a tenth of a cold one-SoC run
    (PERFORMANCE.md: about 400 s a SoC); two keep it near a twentieth. On a phone the reference is the
    user's qnn_executor_runner, a process per run like the compiled one."""
    quantized = next((dtype for dtype in dtypes if dtype != FLOAT_DTYPE), None)
    delegated = FLOAT_DTYPE if FLOAT_DTYPE in dtypes else quantized
    wanted = {(delegated, Mode.DELEGATE), (quantized or FLOAT_DTYPE, Mode.SKIP)}
    standard = [case for case in cases.matrix(cards, dtypes, socs) if (case.dtype, case.mode) in wanted]
    present = {case.card.name for case in standard}
    name = next((name for name in PARITY_CARDS if name in present), standard[0].card.name if standard else None)
    return [case for case in standard if case.card.name == name]


def runner_differences(
    ours: list[list[np.ndarray]], theirs: list[list[np.ndarray]], like: list[list[np.ndarray]]
) -> list[dict]:
    """Every (step, output) whose bytes differ between two runs' raw outputs, in plan order: how many
    elements differ and the largest absolute difference, read with eager's dtype (`like`) for the numbers."""
    found = []
    for step, (row, other_row) in enumerate(zip(ours, theirs)):
        for index, (raw, other) in enumerate(zip(row, other_row)):
            if raw.nbytes == other.nbytes and np.array_equal(raw, other):
                continue
            dtype = like[step][index].dtype
            if raw.nbytes != other.nbytes or raw.nbytes % dtype.itemsize:
                found.append(
                    {
                        "step": step,
                        "output": index,
                        "elements": None,
                        "differing": None,
                        "max_abs": None,
                        "bytes": [int(raw.nbytes), int(other.nbytes)],
                    }
                )
                continue
            a, b = raw.view(dtype), other.view(dtype)
            differing = (raw.view(np.uint8).reshape(a.size, -1) != other.view(np.uint8).reshape(b.size, -1)).any(axis=1)
            with np.errstate(invalid="ignore", over="ignore"):
                gaps = np.abs(a[differing].astype(np.float64) - b[differing].astype(np.float64))
            found.append(
                {
                    "step": step,
                    "output": index,
                    "elements": int(a.size),
                    "differing": int(differing.sum()),
                    "max_abs": float(np.max(gaps)) if gaps.size else 0.0,
                    "bytes": [int(raw.nbytes)] * 2,
                }
            )
    return found


@check(
    "runner_parity",
    short="par",
    needs_device=True,
    signatures=("runner_outputs_differ", "reference_runner_failed"),
    matrix=_parity_matrix,
    reference_runner=REFERENCE_RUNNER,
)
def check_runner_parity(outcome: CaseOutcome) -> dict:
    """The same program and inputs through the suite's compiled runner (the case's device run) and through
    the reference runner on a device of the same SoC (emulated: executorch's Python pybindings; a phone: the
    user's qnn_executor_runner) give equal outputs at every step. Tolerance: bit-equal in every dtype, the
    quantized ones too: both runners load the same program and the same QNN libraries and hand the delegate
    the same input bytes, so any difference is a runner defect (a finding, never a tolerance to widen).
    Runs on a few cases only (_parity_matrix): the reference is a fresh Python per run."""
    require_run(outcome)
    ours = outcome.run
    if ours.runner != COMPILED_RUNNER:
        hint = outcome.device.suite_runner_hint if outcome.device is not None else ""
        fix = hint or "this device's payload has no suite_runner"
        raise NotMeasured(f"this device ran the case through {ours.runner}, not the suite's compiled runner: {fix}")
    other = outcome.reference_run
    if other is None:
        raise NotMeasured(f"no {REFERENCE_RUNNER} run of this case to compare with: run the suite on a device")
    if other.run is None and other.infrastructure:
        raise InfrastructureError(other.error)
    devices = {COMPILED_RUNNER: outcome.device_serial, REFERENCE_RUNNER: other.device_serial}
    if other.run is None:
        raise CheckFailure(
            f"the reference runner {REFERENCE_RUNNER} failed where {COMPILED_RUNNER} ran: {other.error}",
            {"devices": devices},
            "reference_runner_failed",
        )
    differences = runner_differences(ours.outputs, other.run.outputs, outcome.reference)
    evidence = {
        "tolerance": "bit-equal",
        "step_count": len(ours.outputs),  # not "steps": report.json's schema keeps that name for per-step lists
        "devices": devices,
        "reference_run_s": other.seconds,
        "differences": differences[:64],
    }
    if len(other.run.outputs) != len(ours.outputs):
        raise CheckFailure(
            f"{COMPILED_RUNNER} gave {len(ours.outputs)} step(s), {REFERENCE_RUNNER} {len(other.run.outputs)}",
            evidence,
            "runner_outputs_differ",
        )
    if differences:
        first = differences[0]
        what = (
            f"{first['differing']} of {first['elements']} element(s) differ, max abs difference {first['max_abs']:.6g}"
            if first["elements"] is not None
            else f"{first['bytes'][0]} vs {first['bytes'][1]} bytes"
        )
        raise CheckFailure(
            f"step {first['step']} output {first['output']}: {COMPILED_RUNNER} (compiled, on {devices[COMPILED_RUNNER]}) "
            f"and {REFERENCE_RUNNER} (reference, on {devices[REFERENCE_RUNNER]}) differ: {what} "
            f"({len(differences)} differing output(s) in all; tolerance: bit-equal)",
            evidence,
            "runner_outputs_differ",
        )
    return evidence
