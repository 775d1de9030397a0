"""Running one lowered case on a device: push the program and inputs, run N steps, pull what came out.

Follows the runner contract of DESIGN.md: an input list with one line per step, outputs named
outputs/output_{step}_{index}.raw; the interposer's trace (emulated devices) comes back too.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.device.device import Device, DeviceError, RunResult, shell_line
from harness.device.payload import RUNNER_NAME, PayloadFile
from harness.device.sync import Oversized

RUNNER_TIMEOUT_S = 300
TRACE_VARIABLE = "QNNSUITE_TRACE"  # read by the interposer (harness/qnn/interposer.c)
TRACE_NAME = "trace.jsonl"
SIGKILL_EXIT = 128 + 9  # how a shell reports a child ended by SIGKILL
RUNNER_EXECUTION = re.compile(r"^runner: .* in ([0-9.]+) ms$", re.MULTILINE)
# The emulated runner measures what its fresh heap allocations hold; Qualcomm's runner says nothing. Not
# anchored: stderr is merged write by write, and QNN's logger writes its "[INFO] [Qnn ExecuTorch]: "
# prefix apart from its message, so the line can follow one (measured).
HEAP_PATTERN = re.compile(r"runner: heap pattern 0x([0-9a-f]{2})\b")
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


class RunnerFailed(DeviceError):
    """The runner ran but did not produce a full result; its log is in the message, the tail of the device
    log (logcat's ExecuTorch and QNN lines since the run started) in device_log."""

    def __init__(self, message: str, device_log: str = "") -> None:
        super().__init__(message)
        self.device_log = device_log


@dataclass
class DeviceRun:
    outputs: list[list[np.ndarray]]  # [step][output index], flat arrays in the runner's byte layout
    output_files: list[list[Path]]
    trace: Path | None
    log: str
    timings_s: dict[str, float] = field(default_factory=dict)
    pushed_bytes: int = 0
    heap_pattern: int | None = None  # the byte the runner's fresh allocations held, when it measured one


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
    return {**limits, TRACE_NAME: TRACE_MAX_BYTES}


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
) -> DeviceRun:
    """output_bytes: eager's byte size of each output [step][index]; a larger file fails the case unpulled."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    remote = f"{workspace.cases}/{case_dir_name}"
    input_files = write_inputs(steps, local_dir / "inputs")
    input_list = local_dir / "input_list.txt"
    input_list.write_text("".join(" ".join(path.name for path in row) + "\n" for row in input_files))
    files = [pte, input_list, *(path for row in input_files for path in row)]
    # A folder of this run's: nothing on the device to compare hashes with; all in one sync session (a retry
    # writes over the same names).
    pushed = device.push_files([(path, f"{remote}/{'model.pte' if path == pte else path.name}") for path in files])
    timings["push"] = time.perf_counter() - started

    started = time.perf_counter()
    env = {"ADSP_LIBRARY_PATH": workspace.payload}
    if workspace.traced:  # the interposer appends a line per graph execute; pulled with the outputs
        env[TRACE_VARIABLE] = f"{remote}/outputs/{TRACE_NAME}"
    result = device.run(
        [
            f"{workspace.payload}/{RUNNER_NAME}",
            "--model_path",
            "model.pte",
            "--input_list_path",
            "input_list.txt",
            "--output_folder_path",
            "outputs",
            "--method_index",
            str(int(method_index)),
        ],
        cwd=remote,
        timeout_s=timeout_s,
        env=env,
        prepend={"LD_LIBRARY_PATH": workspace.payload},
        first=BEFORE_RUNNER,
    )
    timings["run"] = time.perf_counter() - started
    executed = RUNNER_EXECUTION.search(result.output)
    if executed:  # the emulated runner reports its own execution time, imports excluded
        timings["runner_exec"] = float(executed.group(1)) / 1000
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
        outputs, files, trace, result.output, timings, pushed, int(pattern.group(1), 16) if pattern else None
    )
