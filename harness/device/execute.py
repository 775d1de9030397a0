"""Running one lowered case on a device: push the program and inputs, run N steps, pull what came out.

Two runner commands a device's payload may have (harness/device/payload.py RUNNER_COMMANDS):
- `suite_runner`, the suite's compiled runner (harness/runner/suite_runner.cpp): a step plan (per step a
  method and its input files) run in one process, so state crosses steps and methods; one line per execute
  with its wall time, and the process's peak RSS;
- `qnn_executor_runner`, upstream's flags: an input list with one line per step, one method per process
  (--method_index), an average time at most.
Both write outputs/output_{step}_{index}.raw; the interposer's trace (emulated devices) comes back too.
A device without `suite_runner` (a phone without the Android build) runs single-method plans through
`qnn_executor_runner`; a plan of several methods cannot run there (RunnerUnavailable).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.device.device import Device, DeviceError, RunResult, shell_line
from harness.device.payload import RUNNER_NAME, SUITE_RUNNER_NAME, PayloadFile
from harness.device.sync import Oversized
from harness.runner import contract, run as plan_format

RUNNER_TIMEOUT_S = 300
SIGKILL_EXIT = 128 + 9  # how a shell reports a child ended by SIGKILL
RUNNER_EXECUTION = re.compile(r"^runner: .* in ([0-9.]+) ms$", re.MULTILINE)
# An emulated suite_runner that handed the plan to the pybindings runner (a fault switch that must act inside
# the runner's process: harness/emulator/compiled_runner.py) says so: the run was measured by that one.
ROUTED = re.compile(r"\brunner: measured by (qnn_executor_runner)\b")
# The most a pulled file may hold when its size is not known in advance: an output file (without eager's
# sizes) and the interposer's trace (a line per graph execute). A larger one fails the case, unpulled.
OUTPUT_FILE_MAX_BYTES = 256 * 1024 * 1024
TRACE_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Workspace:
    """Where a worker's cases go on a device, and where the run's runner and libraries are."""

    cases: str  # this worker's folder
    payload: str  # shared by the run's workers
    traced: bool = False  # the payload has the trace interposer in front of a phone's libQnnHtp.so
    runners: tuple[str, ...] = (RUNNER_NAME,)  # the runner commands the payload has (payload.RUNNER_COMMANDS)


@dataclass(frozen=True)
class DeviceRunRequest:
    """One device run of a program, decided once (by the case store) and passed whole through the device
    layer's retry (harness/device/retry.py) to run_case: what runs, where its files go, through which runner,
    with which plan, memory and profiling."""

    name: str  # the run's folder on the device (a case id, or a repeat's, the profile's, the reference's)
    program: Path  # the .pte
    steps: list[tuple]  # each step's inputs
    local_dir: Path  # where its inputs, outputs and logs are kept on the host
    output_count: int  # outputs per step
    soc: str = ""  # the SoC of the device it needs (the pool's choice)
    # eager's byte size of each output [step][index]; a larger file fails the case unpulled (None: unknown)
    output_bytes: list[list[int]] | None = None
    methods: list[str] | None = None  # the method of each step (None: the program's method_index every step)
    method_index: int = 0
    runner: str = SUITE_RUNNER_NAME  # the payload command asked for (choose_runner says which one runs)
    # The program was lowered for shared buffers (ModelCard.shared_buffer): the runner gives its inputs and
    # outputs QNN's shared memory where it can (both runners take upstream's --shared_buffer).
    shared_buffer: bool = False
    etdump: bool = False  # the suite's runner also writes its ETDump (the QNN profile), pulled with the outputs
    reloads: tuple[int, ...] = ()  # steps the program is loaded again before (a driver's fresh-load reset)
    # A program the suite's runner times after each step in a Module of its own (the performance gate's drift
    # meter: harness/report/perf_gate.py); None: none. Never given to qnn_executor_runner.
    reference: Path | None = None
    timeout_s: float = RUNNER_TIMEOUT_S


class RunnerFailed(DeviceError):
    """The runner ran but did not produce a full result; its log is in the message, the tail of the device
    log (logcat's ExecuTorch and QNN lines since the run started) in device_log."""

    def __init__(self, message: str, device_log: str = "") -> None:
        super().__init__(message)
        self.device_log = device_log


class RunnerUnavailable(Exception):
    """The plan needs a runner this device's payload does not have (several methods in one process need
    `suite_runner`): the case cannot be measured here, which is neither executorch's failure nor the lab's.
    The message is one line naming the device and the fix."""


@dataclass
class DeviceRun:
    outputs: list[list[np.ndarray]]  # [step][output index], flat arrays in the runner's byte layout
    output_files: list[list[Path]]
    trace: Path | None
    log: str
    timings_s: dict[str, float] = field(default_factory=dict)
    pushed_bytes: int = 0
    heap_pattern: int | None = None  # the byte the runner's fresh allocations held, when it measured one
    runner: str = RUNNER_NAME  # the payload command that ran the plan (and measured what follows)
    step_times_us: list[int] = field(default_factory=list)  # execute wall time per step, plan order; [] if none
    peak_rss_kb: int | None = None  # the runner process's peak resident memory, when it reports it
    step_rss_kb: list[int] = field(default_factory=list)  # that peak after each step, plan order; [] if none
    # QNN memory registrations held at each step's execute, from the trace's counts ([] without a trace)
    step_registrations: list[int] = field(default_factory=list)
    io_memory: str | None = None  # the memory of the program's inputs and unplanned outputs, when it says
    etdump: Path | None = None  # the runner's ETDump, when asked for (etdump=True) and written
    reference_us: list[int] = field(default_factory=list)  # the reference program's execute after each step


def prepare_workspace(device: Device, folder: str, payload: list[PayloadFile]) -> int:
    """Push the runner and libraries into folder (files the device already has are skipped)."""
    transferred = 0
    for item in payload:
        if device.push(item.local, f"{folder}/{item.remote_name}", mode=item.mode):
            transferred += item.local.stat().st_size
    return transferred


def _exit_description(result) -> str:
    if "format error" in result.output.lower():
        return "could not start (exec format error: built for another architecture than this device)"
    if result.exit_code > 128:
        name = {6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV"}.get(result.exit_code - 128, "")
        return f"crashed with signal {result.exit_code - 128} {name}".rstrip() + f" (exit {result.exit_code})"
    return f"exited {result.exit_code}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "nothing"


def _last_words(result: RunResult) -> str:
    """The runner's last line on stderr, where a runner says why it failed (ExecuTorch logs there), else on
    stdout: the combined output's order of the two streams is the order their packets arrived in (measured:
    a corrupt program's "cannot load" arrived before the "heap pattern" line printed ahead of it)."""
    return _last_line(result.stderr if result.stderr.strip() else result.output)


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# The device's own clock, as `logcat -T` reads a time (seconds: toybox date has no portable %N).
DEVICE_TIME_FORMAT = "+%m-%d %H:%M:%S"
DEVICE_TIME = re.compile(r"^\d\d-\d\d \d\d:\d\d:\d\d$", re.MULTILINE)
# What executorch and its QNN backend log under on Android (upstream runtime/platform and
# backends/qualcomm/runtime/Logging.cpp: "[Qnn ExecuTorch]", "[Qnn Executorch]" in older releases).
LOG_TAGS = ("ExecuTorch", "[Qnn ExecuTorch]", "[Qnn Executorch]")
DEVICE_LOG = "device.log"  # beside runner.log in the case's run folder
DEVICE_LOG_TAIL = 20


# Run by the runner's own shell in the case folder, before the runner: what an earlier attempt wrote goes, and
# the device's time is kept for `logcat -T` should the run fail. The folder itself is made by the push (adbd
# creates a SEND's missing folders), so a case costs one shell, not two.
STARTED_NAME = ".run_started"
BEFORE_RUNNER = (
    f"{shell_line(['rm', '-rf', 'outputs'])} && {shell_line(['mkdir', 'outputs'])} && "
    f"{shell_line(['date', DEVICE_TIME_FORMAT])} > {STARTED_NAME}"
)


def run_started(device: Device, remote: str) -> str | None:
    """The device's time when the case's run began, for `logcat -T` (None when it kept none)."""
    found = DEVICE_TIME.search(device.read_text(f"{remote}/{STARTED_NAME}"))
    return found.group(0) + ".000" if found else None


def pull_device_log(device: Device, since: str | None, local_dir: Path) -> str:
    """The ExecuTorch and QNN lines of the device log since `since`, saved as DEVICE_LOG; returns its tail
    (a note instead when the device keeps no such log: a failed run must still report its own failure)."""
    if since is None:
        return "(no device log: the device did not tell its time)"
    filters = [f"{tag}:V" for tag in LOG_TAGS] + ["*:S"]
    try:
        result = device.shell(shell_line(["logcat", "-d", "-v", "threadtime", "-T", since, *filters]), timeout_s=30)
    except DeviceError as error:
        return f"(no device log: {str(error).splitlines()[0]})"
    if result.exit_code != 0:
        return f"(no device log: logcat exited {result.exit_code}: {_last_line(result.output)})"
    (local_dir / DEVICE_LOG).write_text(result.output)
    return _tail(result.output, DEVICE_LOG_TAIL) or "(the device logged nothing under ExecuTorch or QNN tags)"


def _failed(device: Device, remote: str, local_dir: Path, line: str) -> RunnerFailed:
    """The failure, with the device log's tail (since the case's run began) for the record's evidence."""
    try:
        since = run_started(device, remote)
    except DeviceError:
        since = None
    return RunnerFailed(line, device_log=pull_device_log(device, since, local_dir))


def pull_limits(output_count: int, steps: int, output_bytes: list[list[int]] | None) -> dict[str, int]:
    """The files a run's outputs folder may give back, each with its most bytes: eager's size of each output
    (output_bytes[step][index]) where known, and the trace."""
    limits = {
        contract.output_name(step, index): output_bytes[step][index] if output_bytes else OUTPUT_FILE_MAX_BYTES
        for step in range(steps)
        for index in range(output_count)
    }
    return {**limits, contract.TRACE_NAME: TRACE_MAX_BYTES, contract.ETDUMP_NAME: ETDUMP_MAX_BYTES}


ETDUMP_MAX_BYTES = 64 << 20


def choose_runner(
    workspace: Workspace, runner: str, methods: list[str] | None, serial: str, reloads: tuple[int, ...] = ()
) -> str:
    """The payload command that runs this plan: `runner`, or qnn_executor_runner for a single-method plan on
    a device without suite_runner; RunnerUnavailable when the plan has several methods and suite_runner is not
    there (qnn_executor_runner runs one method per process, so state could not cross them), or when the plan
    loads the program again mid-plan (qnn_executor_runner loads it once)."""
    if runner not in (SUITE_RUNNER_NAME, RUNNER_NAME):
        raise ValueError(f"unknown runner {runner!r}: use {SUITE_RUNNER_NAME!r} or {RUNNER_NAME!r}")
    distinct = sorted(set(methods or ()))
    chosen = runner if runner in workspace.runners else RUNNER_NAME
    if chosen == RUNNER_NAME and len(distinct) > 1:
        why = (
            f"this device has no {SUITE_RUNNER_NAME}"
            if runner == SUITE_RUNNER_NAME
            else f"{RUNNER_NAME} runs one method per process"
        )
        raise RunnerUnavailable(
            f"device {serial}: {why}, and the plan runs {len(distinct)} methods ({', '.join(distinct)}) in one "
            f"process: push the suite's runner built for the device (--android-ndk)"
        )
    if chosen == RUNNER_NAME and reloads:
        raise RunnerUnavailable(
            f"device {serial}: {RUNNER_NAME} cannot load the program again mid-plan (the plan reloads before step "
            f"{reloads[0]}): push the suite's runner built for the device (--android-ndk)"
        )
    return chosen


def _runner_command(
    runner: str, workspace: Workspace, request: DeviceRunRequest, input_files: list[list[Path]]
) -> tuple[list[str], Path]:
    """The runner's argv (paths relative to the case folder) and the plan or input list it reads, written
    into the request's local folder (the runner contract's files and flags)."""
    names = [[path.name for path in row] for row in input_files]
    outputs, local_dir = contract.OUTPUTS_DIR, request.local_dir
    if runner == SUITE_RUNNER_NAME:
        # Without methods, the program's method by index (program order, as upstream's --method_index).
        methods = request.methods or [f"{plan_format.METHOD_INDEX_PREFIX}{int(request.method_index)}"] * len(names)
        plan = plan_format.write_plan(list(zip(methods, names)), local_dir / contract.PLAN_NAME, request.reloads)
        etdump = f"{outputs}/{contract.ETDUMP_NAME}" if request.etdump else None
        reference = contract.REFERENCE_MODEL_NAME if request.reference else None
        argv = contract.suite_runner_argv(
            contract.MODEL_NAME, contract.PLAN_NAME, outputs, methods, etdump, request.shared_buffer, reference
        )
        return [f"{workspace.payload}/{SUITE_RUNNER_NAME}", *argv], plan
    input_list = contract.write_input_list(names, local_dir / contract.INPUT_LIST_NAME)
    argv = contract.executor_runner_argv(
        contract.MODEL_NAME, contract.INPUT_LIST_NAME, outputs, request.method_index, request.shared_buffer
    )
    return [f"{workspace.payload}/{RUNNER_NAME}", *argv], input_list


def run_case(device: Device, workspace: Workspace, request: DeviceRunRequest) -> DeviceRun:
    """Push the request's program and inputs, run its plan through the runner it asks for (or the one the
    device has: choose_runner), pull what came out. A failed run raises RunnerFailed (its device log tail
    with it), a plan the device cannot run RunnerUnavailable."""
    if request.methods is not None and len(request.methods) != len(request.steps):
        raise ValueError(f"{len(request.methods)} method(s) for {len(request.steps)} step(s): give one method per step")
    chosen = choose_runner(workspace, request.runner, request.methods, device.serial, request.reloads)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    remote = f"{workspace.cases}/{request.name}"
    input_files = contract.write_inputs(request.steps, request.local_dir / "inputs")
    argv, listing = _runner_command(chosen, workspace, request, input_files)
    files = [(request.program, contract.MODEL_NAME), (listing, listing.name)]
    files += [(path, path.name) for row in input_files for path in row]
    if request.reference and chosen == SUITE_RUNNER_NAME:
        files.append((request.reference, contract.REFERENCE_MODEL_NAME))
    # A folder of this run's: nothing on the device to compare hashes with; all in one sync session (a retry
    # writes over the same names).
    pushed = device.push_files([(path, f"{remote}/{name}") for path, name in files])
    timings["push"] = time.perf_counter() - started
    result = _execute(device, workspace, request, argv, remote, timings)
    started = time.perf_counter()
    run = _collect(device, request, remote, result)
    timings["pull"] = time.perf_counter() - started
    routed = ROUTED.search(result.output)
    run.runner, run.timings_s, run.pushed_bytes = routed.group(1) if routed else chosen, timings, pushed
    return run


def _execute(
    device: Device, workspace: Workspace, request: DeviceRunRequest, argv: list[str], remote: str, timings: dict
) -> RunResult:
    """The runner on the device, in the case folder; a run that did not end well raises RunnerFailed."""
    started = time.perf_counter()
    env = {"ADSP_LIBRARY_PATH": workspace.payload}
    if workspace.traced:  # the interposer appends a line per graph execute; pulled with the outputs
        env[contract.TRACE_VARIABLE] = f"{remote}/{contract.OUTPUTS_DIR}/{contract.TRACE_NAME}"
    timeout_s, local_dir = request.timeout_s, request.local_dir
    result = device.run(
        argv,
        cwd=remote,
        timeout_s=timeout_s,
        env=env,
        prepend={"LD_LIBRARY_PATH": workspace.payload},
        first=BEFORE_RUNNER,
    )
    timings["run"] = time.perf_counter() - started
    measured = plan_format.parse(result.exit_code, result.output, result.stderr)
    executed = RUNNER_EXECUTION.search(result.output)
    if measured.steps:  # the suite's runner times each execute
        timings["runner_exec"] = sum(step.execute_us for step in measured.steps) / 1e6
    elif executed:  # the emulated pybindings runner reports its own execution time, imports excluded
        timings["runner_exec"] = float(executed.group(1)) / 1000
    (local_dir / "runner.log").write_text(result.output)
    where, words, log = f"runner on {device.serial}", _last_words(result), _tail(result.output)
    if result.timed_out(timeout_s):
        line = f"{where} hung and was killed after {timeout_s:.0f} s (last words: {words}); its log:\n{log}"
        raise _failed(device, remote, local_dir, line)
    if result.exit_code == SIGKILL_EXIT:
        line = (
            f"{where} was killed (SIGKILL, exit 137) after {result.duration_s:.1f} s, "
            f"well before its {timeout_s:.0f} s timeout: something else killed it, e.g. Android's "
            f"low-memory killer; check `adb -s {device.serial} logcat -d` and free memory (last words: "
            f"{words}); its log:\n{log}"
        )
        raise _failed(device, remote, local_dir, line)
    if result.exit_code != 0:
        line = f"{where} {_exit_description(result)} (last words: {words}); its log:\n{log}"
        raise _failed(device, remote, local_dir, line)
    return result


def _collect(device: Device, request: DeviceRunRequest, remote: str, result: RunResult) -> DeviceRun:
    """The outputs folder pulled and read (every step's outputs, the trace and the ETDump where written);
    a missing or oversized output raises RunnerFailed."""
    local_dir, count, steps = request.local_dir, request.output_count, len(request.steps)
    outputs_dir = local_dir / contract.OUTPUTS_DIR
    try:
        limits = pull_limits(count, steps, request.output_bytes)
        present = set(device.pull_files(f"{remote}/{contract.OUTPUTS_DIR}", outputs_dir, limits))
    except Oversized as oversized:
        line = f"runner on {device.serial} wrote too much: {oversized} (not pulled); its log:\n{_tail(result.output)}"
        raise _failed(device, remote, local_dir, line) from oversized
    names = [[contract.output_name(step, index) for index in range(count)] for step in range(steps)]
    missing = next(([name for name in row if name not in present] for row in names if not present.issuperset(row)), [])
    if missing:
        line = (
            f"runner on {device.serial} wrote no {', '.join(missing[:3])} "
            f"(expected {count} output(s) x {steps} step(s)); its log:\n{_tail(result.output)}"
        )
        raise _failed(device, remote, local_dir, line)
    files = [[outputs_dir / name for name in row] for row in names]
    measured = plan_format.parse(result.exit_code, result.output, result.stderr)
    trace = outputs_dir / contract.TRACE_NAME if contract.TRACE_NAME in present else None
    return DeviceRun(
        [[np.fromfile(path, dtype=np.uint8) for path in row] for row in files],
        files,
        trace,
        result.output,
        heap_pattern=measured.heap_pattern,
        step_times_us=[step.execute_us for step in measured.steps],
        peak_rss_kb=measured.peak_rss_kb,
        step_rss_kb=measured.step_rss_kb,
        step_registrations=contract.step_registrations(trace, steps, request.methods),
        io_memory=measured.io_memory,
        etdump=outputs_dir / contract.ETDUMP_NAME if contract.ETDUMP_NAME in present else None,
        reference_us=measured.reference_us,
    )
