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
from harness.runner import run as plan_format

RUNNER_TIMEOUT_S = 300
TRACE_VARIABLE = "QNNSUITE_TRACE"  # read by the interposer (harness/qnn/interposer.c)
TRACE_NAME = "trace.jsonl"
SIGKILL_EXIT = 128 + 9  # how a shell reports a child ended by SIGKILL
RUNNER_EXECUTION = re.compile(r"^runner: .* in ([0-9.]+) ms$", re.MULTILINE)
# The emulated runner measures what its fresh heap allocations hold; Qualcomm's runner says nothing. Not
# anchored: stderr is merged write by write, and QNN's logger writes its "[INFO] [Qnn ExecuTorch]: "
# prefix apart from its message, so the line can follow one (measured).
HEAP_PATTERN = re.compile(r"runner: heap pattern 0x([0-9a-f]{2})\b")
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
    io_memory: str | None = None  # the memory of the program's inputs and unplanned outputs, when it says
    etdump: Path | None = None  # the runner's ETDump, when asked for (etdump=True) and written


def prepare_workspace(device: Device, folder: str, payload: list[PayloadFile]) -> int:
    """Push the runner and libraries into folder (files the device already has are skipped)."""
    transferred = 0
    for item in payload:
        if device.push(item.local, f"{folder}/{item.remote_name}", mode=item.mode):
            transferred += item.local.stat().st_size
    return transferred


def write_inputs(steps: list[tuple], directory: Path) -> list[list[Path]]:
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for step, inputs in enumerate(steps):
        row = []
        for index, tensor in enumerate(inputs):
            path = directory / f"input_{step}_{index}.raw"
            np.ascontiguousarray(tensor.detach().numpy() if hasattr(tensor, "detach") else tensor).tofile(path)
            row.append(path)
        files.append(row)
    return files


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
        f"output_{step}_{index}.raw": output_bytes[step][index] if output_bytes else OUTPUT_FILE_MAX_BYTES
        for step in range(steps)
        for index in range(output_count)
    }
    return {**limits, TRACE_NAME: TRACE_MAX_BYTES, ETDUMP_NAME: ETDUMP_MAX_BYTES}


ETDUMP_NAME = "profile.etdp"  # suite_runner's --etdump_path, in the outputs folder (the QNN profile)
ETDUMP_MAX_BYTES = 64 << 20
PLAN_NAME = "plan.txt"  # suite_runner's step plan, beside the inputs in the case folder
INPUT_LIST_NAME = "input_list.txt"  # qnn_executor_runner's


def choose_runner(workspace: Workspace, runner: str, methods: list[str] | None, serial: str) -> str:
    """The payload command that runs this plan: `runner`, or qnn_executor_runner for a single-method plan on
    a device without suite_runner; RunnerUnavailable when the plan has several methods and suite_runner is not
    there (qnn_executor_runner runs one method per process, so state could not cross them)."""
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
    return chosen


def _runner_command(
    runner: str,
    workspace: Workspace,
    local_dir: Path,
    input_files: list[list[Path]],
    methods: list[str] | None,
    method_index: int,
) -> tuple[list[str], Path]:
    """The runner's argv (paths relative to the case folder) and the plan or input list it reads."""
    if runner == SUITE_RUNNER_NAME:
        # Without methods, the program's method by index (program order, as upstream's --method_index).
        names = methods or [f"{plan_format.METHOD_INDEX_PREFIX}{int(method_index)}"] * len(input_files)
        plan = plan_format.write_plan(
            [(name, [path.name for path in row]) for name, row in zip(names, input_files)], local_dir / PLAN_NAME
        )
        argv = ["--model_path", "model.pte", "--plan_path", PLAN_NAME, "--output_folder_path", "outputs"]
        argv.extend(plan_format.plan_options(names))
        return [f"{workspace.payload}/{SUITE_RUNNER_NAME}", *argv], plan
    input_list = local_dir / INPUT_LIST_NAME
    input_list.write_text("".join(" ".join(path.name for path in row) + "\n" for row in input_files))
    argv = ["--model_path", "model.pte", "--input_list_path", INPUT_LIST_NAME, "--output_folder_path", "outputs"]
    return [f"{workspace.payload}/{RUNNER_NAME}", *argv, "--method_index", str(int(method_index))], input_list


def run_case(
    device: Device,
    workspace: Workspace,
    case_dir_name: str,
    pte: Path,
    steps: list[tuple],
    local_dir: Path,
    output_count: int,
    timeout_s: float = RUNNER_TIMEOUT_S,
    method_index: int = 0,
    output_bytes: list[list[int]] | None = None,
    methods: list[str] | None = None,
    runner: str = SUITE_RUNNER_NAME,
    etdump: bool = False,
    shared_buffer: bool = False,
) -> DeviceRun:
    """etdump: the suite's runner also writes its ETDump (the QNN profile of a profiled program), pulled with
    the outputs; output_bytes: eager's byte size of each output [step][index]; a larger file fails the case unpulled.
    methods: the method of each step (None: the program's method at method_index, every step); runner: the
    payload command to run the plan with (see the module's docstring; choose_runner says which one runs);
    shared_buffer: the program was lowered for shared buffers (ModelCard.shared_buffer), so the runner gives its
    inputs and outputs QNN's shared memory where it can (both runners take upstream's --shared_buffer)."""
    if methods is not None and len(methods) != len(steps):
        raise ValueError(f"{len(methods)} method(s) for {len(steps)} step(s): give one method per step")
    chosen = choose_runner(workspace, runner, methods, device.serial)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    remote = f"{workspace.cases}/{case_dir_name}"
    input_files = write_inputs(steps, local_dir / "inputs")
    argv, plan = _runner_command(chosen, workspace, local_dir, input_files, methods, method_index)
    if etdump and chosen == SUITE_RUNNER_NAME:
        argv += ["--etdump_path", f"outputs/{ETDUMP_NAME}"]
    if shared_buffer:
        argv.append("--shared_buffer")
    files = [pte, plan, *(path for row in input_files for path in row)]
    # A folder of this run's: nothing on the device to compare hashes with; all in one sync session (a retry
    # writes over the same names).
    pushed = device.push_files([(path, f"{remote}/{'model.pte' if path == pte else path.name}") for path in files])
    timings["push"] = time.perf_counter() - started

    started = time.perf_counter()
    env = {"ADSP_LIBRARY_PATH": workspace.payload}
    if workspace.traced:  # the interposer appends a line per graph execute; pulled with the outputs
        env[TRACE_VARIABLE] = f"{remote}/outputs/{TRACE_NAME}"
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
    routed = ROUTED.search(result.output)
    if routed:
        chosen = routed.group(1)
    (local_dir / "runner.log").write_text(result.output)
    if result.timed_out(timeout_s):
        raise _failed(
            device,
            remote,
            local_dir,
            f"runner on {device.serial} hung and was killed after {timeout_s:.0f} s "
            f"(last words: {_last_words(result)}); its log:\n{_tail(result.output)}",
        )
    if result.exit_code == SIGKILL_EXIT:
        raise _failed(
            device,
            remote,
            local_dir,
            f"runner on {device.serial} was killed (SIGKILL, exit 137) after {result.duration_s:.1f} s, "
            f"well before its {timeout_s:.0f} s timeout: something else killed it, e.g. Android's "
            f"low-memory killer; check `adb -s {device.serial} logcat -d` and free memory (last words: "
            f"{_last_words(result)}); its log:\n{_tail(result.output)}",
        )
    if result.exit_code != 0:
        raise _failed(
            device,
            remote,
            local_dir,
            f"runner on {device.serial} {_exit_description(result)} (last words: "
            f"{_last_words(result)}); its log:\n{_tail(result.output)}",
        )

    started = time.perf_counter()
    try:
        present = set(
            device.pull_files(
                f"{remote}/outputs", local_dir / "outputs", pull_limits(output_count, len(steps), output_bytes)
            )
        )
    except Oversized as oversized:
        raise _failed(
            device,
            remote,
            local_dir,
            f"runner on {device.serial} wrote too much: {oversized} (not pulled); its log:\n{_tail(result.output)}",
        ) from oversized
    outputs, files = [], []
    for step in range(len(steps)):
        names = [f"output_{step}_{index}.raw" for index in range(output_count)]
        missing = [name for name in names if name not in present]
        if missing:
            raise _failed(
                device,
                remote,
                local_dir,
                f"runner on {device.serial} wrote no {', '.join(missing[:3])} "
                f"(expected {output_count} output(s) x {len(steps)} step(s)); its log:\n{_tail(result.output)}",
            )
        row = [local_dir / "outputs" / name for name in names]
        files.append(row)
        outputs.append([np.fromfile(path, dtype=np.uint8) for path in row])
    trace = local_dir / "outputs" / TRACE_NAME if TRACE_NAME in present else None
    timings["pull"] = time.perf_counter() - started
    pattern = HEAP_PATTERN.search(result.output)
    return DeviceRun(
        outputs,
        files,
        trace,
        result.output,
        timings,
        pushed,
        int(pattern.group(1), 16) if pattern else None,
        runner=chosen,
        step_times_us=[step.execute_us for step in measured.steps],
        peak_rss_kb=measured.peak_rss_kb,
        io_memory=measured.io_memory,
        etdump=local_dir / "outputs" / ETDUMP_NAME if ETDUMP_NAME in present else None,
    )
