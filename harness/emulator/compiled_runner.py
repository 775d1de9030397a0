"""The emulated device's suite_runner command: the suite's compiled runner, in a fresh process on the device.

    suite_runner --model_path M.pte --plan_path plan.txt --output_folder_path out [runner options]

The payload's `suite_runner` (harness/emulator/suite_runner, a shell line) runs this module with the binary
pushed beside it (`suite_runner.bin`, built on the host by harness/runner/build.py against the executorch
under test). It runs as any device command does, in the device's jail (harness/emulator/jail.py), so the
runner reads and writes only what a device command may. Around the binary it does what the device and the
harness need and the binary does not know of:
- the interposer's execute trace: out/trace.jsonl made here, never through a link and only if it is new
  (O_EXCL|O_NOFOLLOW), and named to the interposer by descriptor (/proc/self/fd/N) where the device has a
  /proc; the jail has none (jail.py), and there the file's device path is named instead, which reaches
  nothing outside the device's own folders. Not on an emulated phone, which has a trace only where the
  harness pushed its interposer, as a phone;
- the runner's stderr copied, line by line, into the device log that the device's logcat reads
  (device_log.copy_stderr, as for the pybindings runner);
- the fault switches of $EMULATED_FAULTS_FILE, acting on the compiled runner's own process where they can
  (runner_hang: it is stopped; runner_crash: SIGSEGV; runner_killed: SIGKILL: each raised by the runner's
  process on itself before it execs the binary, so the fault comes before anything the runner does;
  runner_exit: the command exits with that code before starting it; runner_fewer_outputs: each step's last
  output removed after it ran;
  runner_reload_each_line: a broken runner that loses state between steps, one process per step;
  runner_drop_prefill_chunks {"method": M}: a runtime that keeps only the first chunk of a prefill: a step of
  M right after a step of M starts a fresh process (chunk 2 reads nothing of chunk 1);
  runner_forget_at_turn {"method": M}: a runtime that forgets the conversation at a second prefill: a step of
  M after a step of another method starts a fresh process;
  runner_ignore_reload: a runtime that does not reset: the plan's `reload` lines are dropped;
  runner_slow_execute {"ms": N, "pct": P, "match": TEXT}: test-only, a slower execute: for a case whose device
  folder name holds TEXT (a case id holds its mode, e.g. delegate_mutbuf), the wrapper adds N ms plus P% of
  the execute's own time to each step line's execute_us, as if each execute took that much longer, and sleeps
  as long once the runner ended (the reference program's lines pass as they are): the performance gate's test).
  runner_leak_registration: the interposer in front of libQnnHtp.so leaks one QNN memory registration per
  graph execute (its QNNSUITE_LEAK_REGISTRATION, harness/qnn/interposer.c), as a runtime that registers a
  buffer per execute and never deregisters it: the horizon judgement's test (harness/horizon.py).
  runner_lose_delegate_state refills the delegate's buffers inside the runner process between two steps,
  which cannot be done from outside it: that fault runs the plan through the pybindings runner
  (qnn_executor_runner beside this one, harness/emulator/host_runner.py) and says so on its first line.
The binary ends as the command ends: killed with it (PR_SET_PDEATHSIG), and its signal or exit code is the
command's, so the harness tells a crash from a hang as it does for a phone's runner.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.emulator import device_log
from harness.emulator.device_fs import active_faults
from harness.emulator.phone_runtime import PHONE_ENV, NoQnnLibrary, runner_environment
from harness.runner import contract

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up counts: device_log.py)
if TYPE_CHECKING:
    import subprocess

BINARY_NAME = "suite_runner.bin"  # beside the payload's suite_runner (harness/device/payload.py)
PYBINDINGS_RUNNER = "qnn_executor_runner"  # beside it too: the reference runner, and the fault route below
TRACE_NAME, TRACE_VARIABLE, PLAN_HEADER = contract.TRACE_NAME, contract.TRACE_VARIABLE, contract.PLAN_HEADER
ROUTED_LINE = "runner: measured by qnn_executor_runner"  # harness/device/execute.py reads which runner ran


RUNNER_FAULTS = (
    "runner_hang",
    "runner_crash",
    "runner_killed",
    "runner_exit",
    "runner_fewer_outputs",
    "runner_reload_each_line",
    "runner_lose_delegate_state",
    "runner_slow_execute",
    "runner_leak_registration",
    "runner_drop_prefill_chunks",
    "runner_forget_at_turn",
    "runner_ignore_reload",
)


def read_faults() -> dict:
    """The device's fault switches in force (json is imported only when the file holds any: start-up counts)."""
    path = os.environ.get("EMULATED_FAULTS_FILE")
    try:
        text = Path(path).read_text().strip() if path else ""
    except OSError:
        return {}
    if text in ("", "{}"):
        return {}
    import json

    try:
        return active_faults(json.loads(text))
    except json.JSONDecodeError:
        return {}


def open_trace(output_dir: Path) -> tuple[int, str]:
    """A new trace file in output_dir and the name the interposer gets for it (see the module's docstring)."""
    path = output_dir / TRACE_NAME
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return descriptor, f"/proc/self/fd/{descriptor}" if os.path.isdir("/proc/self/fd") else str(path)


def plan_steps(plan: Path) -> list[str]:
    """The plan's step lines (the binary checks them; here only to split the plan for one fault)."""
    lines = [line.strip() for line in plan.read_text().splitlines()]
    return [line for line in lines if line.startswith("step ")]


def end_like(status: int) -> int:
    """The command's exit: the binary's code, or the binary's signal raised on this process, so the shell
    reports 128+N for a runner that a signal ended, as for any other device command."""
    import signal

    if status < 0:
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # their action cannot be changed, nor need be
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


class Runner:
    """Starts the binary with the device's trace in place and the faults' hold on it (the fault path)."""

    def __init__(self, binary: str, env: dict[str, str], pass_fds: tuple[int, ...]) -> None:
        self.binary, self.env, self.pass_fds = binary, env, pass_fds

    def start(
        self, argv: list[str], stdout: int | None = None, fault_signal: int | None = None
    ) -> subprocess.Popen[bytes]:
        """The binary in a new process; with fault_signal, that process sends it to itself before the exec,
        so the fault acts before the runner can load anything, however loaded the machine (a signal sent
        from here after the start raced the runner: under load it had read the program and failed first).
        A process stopped so never execs: Popen returns only once the command is killed, as a hung one is."""
        import subprocess

        from harness.process.lifetime import die_with_parent

        def before_exec() -> None:
            die_with_parent()  # first: a stopped runner still dies with the command (a timeout's kill, a hang-up)
            if fault_signal is not None:
                import signal

                if fault_signal not in (signal.SIGKILL, signal.SIGSTOP):  # theirs cannot be changed, nor need be
                    signal.signal(fault_signal, signal.SIG_DFL)  # SIGSEGV's default action, whatever was inherited
                os.kill(os.getpid(), fault_signal)

        return subprocess.Popen(
            [self.binary, *argv], env=self.env, stdout=stdout, pass_fds=self.pass_fds, preexec_fn=before_exec
        )


def plan_segments(plan: Path, starts: set[int]) -> list[tuple[int, list[str]]]:
    """The plan's step (and reload) lines cut before each step of `starts`: (first step, lines) per segment."""
    lines = [line.strip() for line in plan.read_text().splitlines()]
    segments: list[tuple[int, list[str]]] = [(0, [])]
    step = 0
    for line in (line for line in lines if line.startswith("step ") or line == "reload"):
        if line.startswith("step "):
            if step in starts and step:  # a fresh process: a reload just before it has nothing more to do
                if segments[-1][1][-1:] == ["reload"]:
                    segments[-1][1].pop()
                segments.append((step, []))
            step += 1
        segments[-1][1].append(line)
    return segments


def processes_from(runner: Runner, argv: list[str], plan: Path, output_dir: Path, starts: set[int]) -> int:
    """A broken runtime that loses the program's state before each step of `starts`: the plan run in one
    fresh runner process per segment (plan_segments), its outputs and step lines renumbered as one run's."""
    import re
    import subprocess

    for first, lines in plan_segments(plan, starts):
        step_plan = plan.with_name(f".{plan.name}.from{first}")
        step_plan.write_text("\n".join([PLAN_HEADER, *lines]) + "\n")
        step_dir = output_dir / f".from{first}"
        step_dir.mkdir(exist_ok=True)
        process = runner.start(contract.with_plan(argv, str(step_plan), str(step_dir)), stdout=subprocess.PIPE)
        out, _ = process.communicate()
        renumbered = re.sub(rb"(?m)^step (\d+) ", lambda m, at=first: b"step %d " % (at + int(m.group(1))), out)
        sys.stdout.buffer.write(renumbered)
        sys.stdout.flush()
        if process.returncode != 0:
            return process.returncode
        for produced in sorted(step_dir.iterdir()):
            step, _, rest = produced.name.removeprefix("output_").partition("_")
            produced.rename(output_dir / f"output_{first + int(step)}_{rest}")
        step_dir.rmdir()
        step_plan.unlink()
    return 0


def fault_starts(faults: dict, methods: list[str]) -> set[int] | None:
    """The steps a state-losing fault starts a fresh process at (None: no such fault in force): every step
    (runner_reload_each_line), or the steps of the fault's method that follow the same method (a prefill's
    later chunks: runner_drop_prefill_chunks) or another one (a second prefill: runner_forget_at_turn)."""
    if faults.get("runner_reload_each_line"):
        return set(range(len(methods)))
    for fault, same in (("runner_drop_prefill_chunks", True), ("runner_forget_at_turn", False)):
        switch = faults.get(fault)
        if isinstance(switch, dict) and isinstance(switch.get("method"), str):
            return {
                step
                for step in range(1, len(methods))
                if methods[step] == switch["method"] and (methods[step - 1] == switch["method"]) == same
            }
    return None


def without_reloads(plan: Path) -> Path:
    """The fault runner_ignore_reload: the plan less its reload lines, beside it."""
    kept = [line for line in plan.read_text().splitlines() if line.strip() != "reload"]
    stripped = plan.with_name(f".{plan.name}.noreload")
    stripped.write_text("\n".join(kept) + "\n")
    return stripped


def slowdown(fault: object, folder: str) -> tuple[int, int]:
    """The runner_slow_execute fault's delay for a case run in folder, (ms, percent of the execute's time)
    ((0, 0): not this case, or a malformed switch)."""
    if not isinstance(fault, dict) or not isinstance(fault.get("match"), str) or fault["match"] not in folder:
        return 0, 0
    delay, percent = fault.get("ms"), fault.get("pct")
    return (
        delay if isinstance(delay, int) and delay > 0 else 0,
        percent if isinstance(percent, int) and percent > 0 else 0,
    )


def slowed(runner: Runner, argv: list[str], delay_ms: int, percent: int = 0) -> int:
    """The fault runner_slow_execute: the runner's lines, each step line's execute_us grown by delay_ms plus
    percent of it, passed on once the runner ended, after a sleep of all that was added (the plan's wall time
    grows by as much). The lines are kept in a file until then, so this process does nothing while the runner
    runs: reading them as they came woke it during the reference program's executes, which it slowed."""
    import re
    import tempfile
    import time

    step_line = re.compile(rb"^(step \d+ method \S+ execute_us )(\d+)((?: peak_rss_kb \d+)?\s*)$")
    with tempfile.TemporaryFile(dir=".") as lines:  # the case folder: the jail may have no /tmp
        status = runner.start(argv, stdout=lines.fileno()).wait()
        lines.seek(0)
        added_total_us, rewritten = 0, []
        for line in lines:
            match = step_line.match(line)
            if match:
                added_us = delay_ms * 1000 + int(match.group(2)) * percent // 100
                added_total_us += added_us
                line = match.group(1) + str(int(match.group(2)) + added_us).encode() + match.group(3)
            rewritten.append(line)
    time.sleep(added_total_us / 1e6)
    sys.stdout.buffer.write(b"".join(rewritten))
    sys.stdout.flush()
    return status


def drop_last_outputs(output_dir: Path) -> None:
    """The fault runner_fewer_outputs: each step's last output goes, as a runner that wrote one too few."""
    import re

    last: dict[str, tuple[int, str]] = {}
    for name in os.listdir(output_dir):
        match = re.fullmatch(r"output_(\d+)_(\d+)\.raw", name)
        if match and int(match.group(2)) >= last.get(match.group(1), (-1, ""))[0]:
            last[match.group(1)] = (int(match.group(2)), name)
    for _, name in last.values():
        os.unlink(output_dir / name)


def through_pybindings(argv: list[str], plan: Path, here: Path) -> None:
    """runner_lose_delegate_state: the plan as upstream's input list, run by the pybindings runner (exec)."""
    print(f"{ROUTED_LINE} (fault switch runner_lose_delegate_state: it writes into the runner's memory)", flush=True)
    steps = [line.split()[1:] for line in plan_steps(plan)]
    methods = {words[0] for words in steps}
    index = next(iter(methods))
    if len(methods) != 1 or not index.startswith("@"):
        print("suite_runner: error: the fault runner_lose_delegate_state takes one method by index", file=sys.stderr)
        sys.exit(3)
    input_list = contract.write_input_list([words[1:] for words in steps], plan.with_name(f".{plan.name}.input_list"))
    output_dir = contract.outputs_of(argv) or "."
    argv = contract.executor_runner_argv(contract.model_of(argv) or "", str(input_list), output_dir, int(index[1:]))
    os.execv(str(here / PYBINDINGS_RUNNER), [PYBINDINGS_RUNNER, *argv])


# Faults that act on the runner's process, before its exec: (the line it prints, the signal it raises).
SIGNAL_FAULTS = {
    "runner_hang": ("hanging", "SIGSTOP"),
    "runner_crash": ("crashing", "SIGSEGV"),
    "runner_killed": ("killed", "SIGKILL"),
}


def main(argv: list[str]) -> int:
    """argv: the payload folder (where the binary and the pybindings runner are), then the runner's own."""
    here, argv = Path(argv[0]), argv[1:]
    faults = {name: value for name, value in read_faults().items() if name in RUNNER_FAULTS and value is not None}
    plan_path, output = contract.plan_of(argv), contract.outputs_of(argv)
    if faults.get("runner_exit") is not None:
        print(f"runner: exiting {faults['runner_exit']} (fault switch)", flush=True)
        return int(faults["runner_exit"])
    if faults.get("runner_lose_delegate_state") and plan_path:
        through_pybindings(argv, Path(plan_path), here)
    device_log.copy_stderr("suite_runner")  # before the trace is opened: the copier holds nothing of the runner's
    env = dict(os.environ)
    pass_fds: tuple[int, ...] = ()
    if PHONE_ENV in env:  # an emulated phone: the loader finds the pushed libraries, as the phone's would
        try:
            env = runner_environment(env)
        except NoQnnLibrary as missing:
            print(f"suite_runner: {missing}", file=sys.stderr, flush=True)
            return 1
    elif output and Path(output).is_dir():
        try:
            trace, env[TRACE_VARIABLE] = open_trace(Path(output))
        except FileExistsError:
            print(f"suite_runner: {Path(output) / TRACE_NAME} appeared while it was made; run again", file=sys.stderr)
            return 2
        os.set_inheritable(trace, True)
        pass_fds = (trace,)
    if faults.pop("runner_leak_registration", None):  # a switch of the interposer's, in the runner's environment
        env[contract.LEAK_REGISTRATION_VARIABLE] = "1"
    binary = str(here / BINARY_NAME)
    if not faults:  # become the runner: its exit status and signals are the command's
        os.execve(binary, [binary, *argv], env)
    runner = Runner(binary, env, pass_fds)
    if faults.get("runner_ignore_reload") and plan_path and output:
        argv = contract.with_plan(argv, str(without_reloads(Path(plan_path))), output)
    starts = fault_starts(faults, [line.split()[1] for line in plan_steps(Path(plan_path))]) if plan_path else None
    if starts is not None and output:
        return end_like(processes_from(runner, argv, Path(plan_path), Path(output), starts))
    delay_ms, percent = slowdown(faults.get("runner_slow_execute"), Path.cwd().name)
    if delay_ms or percent:
        return end_like(slowed(runner, argv, delay_ms, percent))
    import signal

    fault_signal = None
    for fault, (doing, name) in SIGNAL_FAULTS.items():
        if faults.get(fault) and fault_signal is None:
            print(f"runner: {doing} (fault switch)", flush=True)
            fault_signal = getattr(signal, name)
    status = runner.start(argv, fault_signal=fault_signal).wait()
    if status == 0 and faults.get("runner_fewer_outputs") and output:
        drop_last_outputs(Path(output))
    return end_like(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
