"""A case's shared outcome: what it lowered to, what the device did and eager's reference, read by every check.

The CaseStore (harness/case_store.py) builds one per case; checks (harness/checks/) only read it. The analysis
of the uninitialised-buffer defect (docs/FINDINGS.md#F1) lives here because it is a reading of the outcome.

What the outcome holds of the lowering, the device run and the device is read through the small protocols
below, not the lowering or device layer's classes: a reproduction bundle (harness/repro/) carries this module,
the checks and numerics unchanged and fills a CaseOutcome with its own lowering and simulator run, so a
bundle judges a case by the same code as the suite. Keep this module's imports to numerics, vocabulary and
the pure pipeline modules (eager, mutbuf, facts): a bundle carries exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from harness import numerics
from harness.pipeline import eager, mutbuf
from harness.record import step_stats
from harness.runner import contract
from harness.vocabulary import FLOAT_DTYPE, Case

if TYPE_CHECKING:
    from harness.pipeline.facts import LoweringFacts

# The structural fact of QNN memory registrations (report.json `structure`, harness/report/structure_gate.py).
MEM_REGISTER_CALLS = "mem_register_calls_per_execute"


class Lowered(Protocol):
    """What the checks read of a lowering (harness/pipeline/lower.py's LoweredArtifact, or a bundle's)."""

    facts: LoweringFacts

    @property
    def ok(self) -> bool: ...

    @property
    def failure(self) -> str: ...


class DeviceOutputs(Protocol):
    """What the checks read of a device run (harness/device/execute.py's DeviceRun, or a bundle's)."""

    outputs: list[list[np.ndarray]]  # [step][output index], flat arrays in the runner's byte layout
    trace: Path | None
    heap_pattern: int | None
    runner: str  # which runner measured it: "suite_runner" or "qnn_executor_runner"
    step_times_us: list[int]  # execute wall time per step, in plan order ([] when the runner gives none)
    peak_rss_kb: int | None  # the runner process's peak resident memory (None when it gives none)
    step_rss_kb: list[int]  # that peak after each step, plan order ([] when the runner gives none)
    step_registrations: list[int]  # QNN memory registrations held at each step's execute ([] without a trace)
    io_memory: str | None  # rpcmem or ordinary: the memory the runner gave inputs and unplanned outputs


class DeviceTraits(Protocol):
    """What the checks read of the kind of device that ran a case (harness/device/kinds/' kinds, or a bundle's)."""

    name: str
    has_execute_trace: bool
    heap_pattern: int | None  # None: its fresh heap allocations cannot be made to hold a known byte
    suite_runner_hint: str  # how a device of the kind gets the suite's compiled runner ("" when only a build can)


@dataclass(frozen=True)
class PatternReference:
    """Eager started from the device's heap pattern in every delegated buffer, compared with the device;
    comparison is None (the description says why) when what the buffers started from is not known."""

    comparison: numerics.Comparison | None
    description: str  # e.g. "0x40 (cache = 3.004 as float32)", or why there is none
    # Why a device that differs from this reference may still have the defect ("": it may not). In
    # quantized graphs the delegate reads the buffer through an encoding the suite does not know.
    inconclusive: str = ""


@dataclass(frozen=True)
class TracedBuffer:
    """A delegated buffer's mutbuf tensor as the interposer saw it at an execute."""

    bytes: int
    data_type: int | None = None  # QNN's Qnn_DataType_t
    scale: float | None = None  # scale-offset encoding: real = (stored + offset) x scale
    offset: int | None = None


def _traced_buffers(trace: Path | None) -> dict[str, TracedBuffer]:
    """Delegated buffer name (placeholder form, b_cache) -> its mutbuf tensor, from the trace."""
    found = {}
    for record in mutbuf.read_trace(trace) if trace else []:
        for tensor in record.get("inputs", []):
            match = mutbuf.INPUT.match(tensor["name"])
            if match and "bytes" in tensor:
                found[match.group(2)] = TracedBuffer(
                    int(tensor["bytes"]), tensor.get("data_type"), tensor.get("scale"), tensor.get("offset")
                )
    return found


@dataclass(frozen=True)
class OtherRun:
    """The case's program and inputs run again through another runner of a device of its SoC (runner_parity's
    reference, made by the CaseStore before any check judges the case, or by a bundle's repro.py)."""

    run: DeviceOutputs | None
    error: str | None = None  # why there is no run
    infrastructure: bool = False  # the device or the lab failed, not the runner
    device_serial: str | None = None
    seconds: float | None = None  # the second run's wall time (device wait, push, run, pull): what it cost


@dataclass
class CaseOutcome:
    case: Case
    steps: list[tuple]
    artifact: Lowered
    reference: list[list[np.ndarray]]  # eager outputs [step][index]
    device_serial: str | None = None
    device_kind: str | None = None  # harness.device.kinds name of the device that ran it
    device: DeviceTraits | None = None  # that kind (what it can measure), set with device_kind
    run: DeviceOutputs | None = None
    run_error: str | None = None
    # The run failed because of the device or the lab (lost, no space, push refused), not the program: its
    # checks are infrastructure errors. A runner that crashes, hangs or writes nothing is the program's failure.
    run_error_is_infrastructure: bool = False
    # The run needs what this device lacks (a plan of several methods, no suite_runner there): not measured.
    run_error_is_not_measured: bool = False
    device_log: str = ""  # a failed run's device log tail (ExecuTorch and QNN lines; whole in run_dir/device.log)
    repeat_note: str = ""  # why --perf-repeats' runs stopped short ("": all ran, or none were asked for)
    profile_note: str = ""  # why the case has no --profile-level profile ("": it has one, or none was asked for)
    retries: int = 0  # device runs repeated after a dropped connection
    run_dir: Path | None = None  # where the device run's inputs, outputs and log were put (in the run's work dir)
    timings_s: dict[str, float] = field(default_factory=dict)
    # Step times of the plan's later runs under --perf-repeats (a fresh runner process each: fresh state);
    # only their times are kept, the checks read the first run's outputs.
    repeat_steps_us: list[list[int]] = field(default_factory=list)
    # The reference program's execute after each step of those runs ([] for a run without one): the gate's
    # drift meter, timed in the same runner process as the case (harness/report/perf_gate.py)
    repeat_reference_us: list[list[int]] = field(default_factory=list)
    # The QNN profile of the case's profiled twin (--profile-level; harness/runner/profile.py profile_of).
    profile: dict | None = None
    dependence: list[list[np.ndarray]] | None = None  # see initial_value_dependence (given by the CaseStore)
    # The same program and inputs through the reference runner (runner_parity compares the case's run with it):
    # made for the cases whose checks compare runners, before they judge; None where none was made.
    reference_run: OtherRun | None = None

    @property
    def timing(self) -> dict | None:
        """The run's per-step timing as a case record carries it (report.json `timing`); None without a run.
        first_step_us apart: a runner's first execute includes work the later ones do not (graph set-up)."""
        if self.run is None:
            return None
        steps = [int(micros) for micros in self.run.step_times_us]
        stats = step_stats(steps)
        repeats = [stats["p50_us"], *(step_stats(list(r))["p50_us"] for r in self.repeat_steps_us)]
        return {
            "runner": self.run.runner,
            "steps_us": steps,
            "first_step_us": steps[0] if steps else None,
            "peak_rss_kb": self.run.peak_rss_kb,
            "steps_rss_kb": [int(kb) for kb in self.run.step_rss_kb],
            "steps_registrations": [int(count) for count in self.run.step_registrations],
            **({"io_memory": self.run.io_memory} if self.run.io_memory else {}),
            "device_kind": self.device_kind,  # emulated: simulator times, never compared with a phone's
            **stats,
            "repeats_p50_us": [p50 for p50 in repeats if p50 is not None],
            # each repeat's fastest step after the first: its steady state (warm-up and load only add time)
            "repeats_min_us": [min(run[1:]) for run in (steps, *self.repeat_steps_us) if len(run) > 1],
            **({"profile": self.profile} if self.profile is not None else {}),
            **self._drift_reference_timing(),
        }

    def _drift_reference_timing(self) -> dict:
        """report.json timing's `drift_reference`: per repeat timed beside the reference program, the case's fastest
        step after the first and the reference's fastest execute (their ratio is what the gate compares), and
        the reference's executes as measured; {} when no repeat had one."""
        paired = [
            (run, reference)
            for run, reference in zip(self.repeat_steps_us, self.repeat_reference_us)
            if len(run) > 1 and reference
        ]
        if not paired:
            return {}
        return {
            "drift_reference": {
                "case_min_us": [min(run[1:]) for run, _ in paired],
                "min_us": [min(reference) for _, reference in paired],
                "steps_us": [list(reference) for _, reference in paired],
            }
        }

    @cached_property
    def structure(self) -> dict | None:
        """The case's structural performance facts as its record carries them (report.json `structure`): the
        lowering's (harness/pipeline/structure.py), the .pte's size and, where the device has an execute
        trace with the interposer's registration counts, the most QnnMem_register calls made for one graph
        execute (the first's include those made at load: contract.register_calls_per_execute); None when the
        lowering recorded none (not lowered, or a cache entry of a suite that did not record them). Read once,
        after the run, for every check of the case."""
        facts = self.artifact.facts
        if not isinstance(facts.structure, dict) or "methods" not in facts.structure:
            return None
        found: dict = {**facts.structure, "pte_bytes": facts.program.bytes if facts.program else None}
        if self.run is not None and self.run.trace is not None and self.device and self.device.has_execute_trace:
            calls = contract.register_calls_per_execute(contract.read_trace(self.run.trace))
            if calls:
                found[MEM_REGISTER_CALLS] = max(calls)
        return found

    def device_outputs(self) -> list[list[np.ndarray]]:
        """Device outputs reinterpreted with the reference's dtypes and shapes."""
        assert self.run is not None
        shaped = []
        for step, row in enumerate(self.run.outputs):
            shaped_row = []
            for index, raw in enumerate(row):
                expected = self.reference[step][index]
                if raw.nbytes != expected.nbytes:
                    raise ValueError(
                        f"step {step} output {index}: device wrote {raw.nbytes} bytes, "
                        f"eager has {expected.nbytes} ({expected.dtype}{list(expected.shape)})"
                    )
                shaped_row.append(raw.view(expected.dtype).reshape(expected.shape))
            shaped.append(shaped_row)
        return shaped

    @cached_property
    def comparison(self) -> numerics.Comparison:
        """Device vs eager, computed once for every check that reads it."""
        return numerics.compare(self.device_outputs(), self.reference, self.case.dtype)

    @property
    def delegated_buffers(self) -> tuple[str, ...]:
        """The card's mutated buffers that the delegate holds (none with skip_mutable_buffer)."""
        if self.case.skip_mutable_buffer:
            return ()
        facts = self.artifact.facts.partitions
        outside = set(facts.buffers_outside) if facts else set()
        return tuple(name for name in self.case.card.mutated_buffers if name not in outside)

    @cached_property
    def pattern_reference(self) -> PatternReference:
        """What the device computes if the only fault is that the delegated buffers started uninitialised,
        holding the heap pattern (docs/FINDINGS.md#F1): eager from that start, compared with the device."""
        assert self.run is not None
        if self.run.heap_pattern is None:
            if self.device is not None and self.device.heap_pattern is None:
                return PatternReference(None, f"a {self.device.name}'s heap pattern cannot be set")
            return PatternReference(None, "the runner reported no heap pattern")
        pattern, buffers = self.run.heap_pattern, self.delegated_buffers
        stored = _traced_buffers(self.run.trace)
        initial = eager.pattern_initial(self.case.card, pattern, buffers)
        encoded, decoded_names = (
            [],
            set(),
        )  # buffers the delegate stores in fixed point: the pattern through their encoding
        for name, value in list(initial.items()):
            if not value.is_floating_point():  # e.g. 0x40404040: beyond the float range the delegate computes in
                return PatternReference(
                    None,
                    f"{name} ({str(value.dtype).removeprefix('torch.')}) reads the pattern "
                    f"0x{pattern:02x} as {value.flatten()[0].item():.4g}, beyond what the "
                    f"delegate computes exactly",
                )
            traced = stored.get("b_" + name.replace(".", "_"))
            if traced is None or traced.bytes == value.numel() * value.element_size():
                continue
            decoded_value = numerics.pattern_dequantized(
                pattern, value, traced.bytes, traced.data_type, traced.scale, traced.offset
            )
            if decoded_value is None:
                return PatternReference(
                    None,
                    f"the delegate stores {name} in {traced.bytes} bytes, not as "
                    f"{value.numel()} x {value.dtype}: its encoding is unknown",
                )
            initial[name] = decoded_value
            decoded_names.add(name)
            encoded.append(
                f"{name} stored as {traced.bytes // value.numel()}-byte fixed point, scale "
                f"{traced.scale:.4g} offset {traced.offset}"
            )
        decoded = ", ".join(
            f"{name} = {value.flatten()[0].item():.4g} as {str(value.dtype).removeprefix('torch.')}"
            for name, value in initial.items()
        )
        reference = eager.run_steps(self.case.card, self.steps, initial=initial)
        # Exact where what each delegated buffer reads is known: in a float graph the pattern's bytes; in a
        # quantized one, a buffer stored in fixed point decodes them through the scale and offset the trace
        # recorded. A buffer a quantized graph keeps in float is quantized inside the graph, which can clip.
        unknown = [name for name in buffers if name not in decoded_names]
        inconclusive = (
            ""
            if self.case.dtype == FLOAT_DTYPE or not unknown
            else (
                f"the {self.case.dtype} delegate reads {', '.join(unknown)} through a quantization encoding the trace "
                f"did not show, which can clip the pattern's value"
            )
        )
        described = "; ".join([decoded or "no delegated buffer", *encoded])
        return PatternReference(
            numerics.compare(self.device_outputs(), reference, self.case.dtype),
            f"0x{pattern:02x} ({described})",
            inconclusive,
        )

    @property
    def initial_value_dependence(self) -> numerics.Outputs:
        """Output elements that depend on the buffers' registered initial values (eager only; once per case)."""
        if self.dependence is None:
            self.dependence = eager.initial_value_dependence(self.case.card, self.steps, self.reference)
        return self.dependence
