"""Running a step plan through the compiled runner (suite_runner.cpp) on the HTP simulator, and reading what
it reports.

The plan format, the output names and the exit codes are defined in suite_runner.cpp's header; this module
writes that format and names the codes for messages. The environment is the toolchain's (the overlay SDK,
LD_LIBRARY_PATH and the device-config bridge of harness/qnn/toolchain.py), so the runner loads the same QNN
libraries, behind the same interposer, as every other process of the suite that runs QNN.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.runner import contract
from harness.runner.contract import PLAN_HEADER

# suite_runner.cpp's exit codes (its header and its `constexpr int` line); test_compiled_runner checks that
# the two agree.
EXIT_CODES = {
    2: "usage",
    3: "bad plan",
    4: "bad program",
    5: "unknown method",
    6: "bad input file",
    7: "input mismatch",
    8: "load failed",
    9: "execute failed",
    10: "output failed",
    11: "bad option",
}
ERROR_PREFIX = "suite_runner: error: "
RUN_TIMEOUT_S = 300
# A step's method: its name, or "@N", the program's Nth method in program order (upstream's --method_index).
METHOD_INDEX_PREFIX = "@"
METHOD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|@[0-9]{1,4}")
# Not anchored at the line's start: where stdout and stderr reach one stream (a device shell's combined
# output), QNN's logger writes its "[INFO] [Qnn ExecuTorch]: " prefix apart from its message, so a line of
# the runner's can follow one (as host_runner's heap pattern line, harness/device/execute.py).
# The process's peak RSS once the step returned ends the line (suite_runner.cpp's header); a runner built
# before it gave none.
STEP_LINE = re.compile(r"\bstep (\d+) method (\S+) execute_us (\d+)(?: peak_rss_kb (\d+))?$", re.MULTILINE)
LOAD_LINE = re.compile(r"\brunner: load method (\S+) load_us (\d+)$", re.MULTILINE)
PEAK_LINE = re.compile(r"\brunner: peak_rss_kb (\d+)$", re.MULTILINE)
# The reference program's timed execute after each step (--reference_model_path; suite_runner.cpp's header).
REFERENCE_LINE = re.compile(r"\brunner: reference after step (\d+) execute_us (\d+)$", re.MULTILINE)
# Which memory the runner gave a program's inputs and unplanned outputs: rpcmem (QNN's shared allocator, with
# --shared_buffer where executorch loads it) or ordinary (suite_runner.cpp's header says when).
IO_MEMORY_LINE = re.compile(r"\brunner: io memory (rpcmem|ordinary)$", re.MULTILINE)
# The emulated runners measure what their fresh heap allocations hold (harness/emulator/host_runner.py);
# Qualcomm's runner says nothing. Not anchored, as STEP_LINE: QNN's logger prefix can come first.
HEAP_LINE = re.compile(r"runner: heap pattern 0x([0-9a-f]{2})\b")


class Toolchain(Protocol):
    """What runner_env needs of harness/qnn/toolchain.py's Toolchain (not imported: a repro bundle carries this
    module to write its plan, and no toolchain)."""

    def child_env(self, trace: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]: ...


class PlanError(ValueError):
    """A step plan the runner would refuse; one line naming the step and the fix."""


@dataclass(frozen=True)
class StepTime:
    step: int
    method: str
    execute_us: int
    peak_rss_kb: int | None = None  # the process's peak RSS after the step (None: the runner did not say)


@dataclass
class RunnerRun:
    """One runner process: how it ended, what it said, and the per-step times it measured."""

    exit_code: int
    stdout: str
    stderr: str
    steps: list[StepTime] = field(default_factory=list)
    load_us: dict[str, int] = field(default_factory=dict)
    peak_rss_kb: int | None = None
    io_memory: str | None = None  # "rpcmem" or "ordinary"; None from a runner that does not say
    heap_pattern: int | None = None  # the byte its fresh heap allocations held, from a runner that measured it
    reference_us: list[int] = field(default_factory=list)  # the reference program's execute after each step

    @property
    def step_rss_kb(self) -> list[int]:
        """The process's peak RSS after each step, in plan order ([] when a step's line did not carry it)."""
        found = [step.peak_rss_kb for step in self.steps]
        return [int(kb) for kb in found if kb is not None] if None not in found else []

    @property
    def error_line(self) -> str | None:
        """The runner's own one-line diagnosis (None when it gave none)."""
        lines = [line for line in self.stderr.splitlines() if line.startswith(ERROR_PREFIX)]
        return lines[-1] if lines else None


def write_plan(steps: list[tuple[str, list[Path]]], path: Path, reloads: tuple[int, ...] = ()) -> Path:
    """The plan for (method, input files) per step, with a `reload` line before each step of `reloads` (the
    program loaded again there). Names are checked here, so nothing a card or a report
    supplies can smuggle a second word into a line: a method is an identifier, a file name has no whitespace.
    The runner resolves a relative input path against the plan file's folder."""
    lines = [PLAN_HEADER]
    for index, (method, inputs) in enumerate(steps):
        if index in reloads:
            lines.append(RELOAD_LINE)
        if not METHOD_NAME.fullmatch(method):
            raise PlanError(
                f"step {index}: method name {method!r} is not an identifier: use the program's method name "
                f"(or {METHOD_INDEX_PREFIX}N, its Nth method)"
            )
        for name in map(str, inputs):
            if any(character.isspace() for character in name):
                raise PlanError(f"step {index}: input file name {name!r} holds whitespace: rename the file")
        lines.append(" ".join(["step", method, *map(str, inputs)]))
    path.write_text("\n".join(lines) + "\n")
    return path


RELOAD_LINE = "reload"  # suite_runner.cpp: a fresh Module before the next step


def runner_env(toolchain: Toolchain, trace: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """What the runner needs to run a QNN-delegated program on the HTP simulator: the toolchain's own child
    environment (one body for it: Toolchain.child_env). The executorch libraries are found by the binary's
    rpath, set at build."""
    return toolchain.child_env(trace=trace, base=base)


def parse(exit_code: int, stdout: str, stderr: str) -> RunnerRun:
    peak = PEAK_LINE.search(stdout)
    io_memory = IO_MEMORY_LINE.search(stdout)
    heap = HEAP_LINE.search(stdout)
    return RunnerRun(
        exit_code,
        stdout,
        stderr,
        [
            StepTime(int(step), method, int(micros), int(rss) if rss else None)
            for step, method, micros, rss in STEP_LINE.findall(stdout)
        ],
        {method: int(micros) for method, micros in LOAD_LINE.findall(stdout)},
        int(peak.group(1)) if peak else None,
        io_memory.group(1) if io_memory else None,
        int(heap.group(1), 16) if heap else None,
        [int(micros) for _, micros in REFERENCE_LINE.findall(stdout)],
    )


def run_plan(
    binary: Path,
    program: Path,
    plan: Path,
    output_dir: Path,
    env: dict[str, str],
    options: tuple[str, ...] = (),
    timeout_s: float | None = RUN_TIMEOUT_S,
    methods: list[str] = (),
    reference: Path | None = None,
) -> RunnerRun:
    """Run the plan in one runner process on this host (the plan's methods decide its options:
    contract.plan_options; `options`, any more); outputs land in output_dir as output_<step>_<index>.raw.
    reference: a program timed after each step in a Module of its own (RunnerRun.reference_us)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    argv = contract.suite_runner_argv(
        str(program), str(plan), str(output_dir), list(methods), reference=str(reference) if reference else None
    )
    completed = subprocess.run(
        [str(binary), *argv, *options],
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return parse(completed.returncode, completed.stdout, completed.stderr)
