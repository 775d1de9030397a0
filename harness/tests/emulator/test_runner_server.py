"""The runner server (harness/process: fork_server + services.RUNNER, with runner_client.py) against a fresh host_runner, on a real .pte.

A run through the server must be indistinguishable from a fresh `python -m harness.emulator.host_runner`
(same outputs, same trace, same exit codes, same faults) but much cheaper; a killed client must take its
child with it, and with no server the emulated runner must still work the old way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.device.execute import write_inputs
from harness.device.payload import EMULATED_RUNNER
from harness.emulator.runner_client import SOCKET_ENV
from harness.pipeline import card as cards, mutbuf
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.process.fork_client import MAX_UNIX_PATH_BYTES, unix_address
from harness.process.fork_server import pid_file_of, start_server, stop_server
from harness.process.services import RUNNER
from harness.qnn import qnnlog
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4
RUN_TIMEOUT_S = 300
GONE_TIMEOUT_S = 10.0
TIMED_RUNS = 5
RUNNER_ARGS = ["--model_path", "model.pte", "--input_list_path", "input_list.txt", "--output_folder_path", "outputs"]


@dataclass(frozen=True)
class Server:
    process: subprocess.Popen[bytes]
    socket_path: Path


@pytest.fixture(scope="module")
def lowered(toolchain, tmp_path_factory) -> LoweredArtifact:
    case = Case(cards.find("fixtures.zoo:kv_gather_written"), "fp16", Mode.DELEGATE, "SM8650")
    artifact = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)
    assert artifact.ok, artifact.failure
    return artifact


@pytest.fixture(scope="module")
def runner_env(toolchain) -> dict[str, str]:
    """What an emulated device gives its commands, minus the per-device variables."""
    return {**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}


@pytest.fixture(scope="module")
def server(runner_env, tmp_path_factory):
    socket_path = tmp_path_factory.mktemp("server") / "runner.sock"
    process = start_server(RUNNER, socket_path, runner_env)
    yield Server(process, socket_path)
    stop_server(process)


@pytest.fixture(scope="module")
def direct(lowered, runner_env, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The reference: a fresh host_runner process, as before the server existed."""
    directory = case_dir(lowered, tmp_path_factory.mktemp("direct"))
    return directory, run_direct(directory, runner_env)


def case_dir(lowered: LoweredArtifact, directory: Path, faults: dict | None = None) -> Path:
    """A case directory laid out as execute.run_case leaves it on a device."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(lowered.pte, directory / "model.pte")
    rows = write_inputs(lowered.case.card.steps(STEPS), directory)
    (directory / "input_list.txt").write_text("".join(" ".join(path.name for path in row) + "\n" for row in rows))
    (directory / "faults.json").write_text(json.dumps(faults or {}))
    return directory


def device_env(runner_env: dict[str, str], directory: Path, server: Server | None) -> dict[str, str]:
    """As Device.run sets it: the case directory stands in for the workspace put before LD_LIBRARY_PATH."""
    env = {
        **runner_env,
        "EMULATED_FAULTS_FILE": str(directory / "faults.json"),
        "LD_LIBRARY_PATH": f"{directory}:{runner_env['LD_LIBRARY_PATH']}",
        "ADSP_LIBRARY_PATH": str(directory),
    }
    if server is not None:
        env[SOCKET_ENV] = str(server.socket_path)
    return env


def run_direct(directory: Path, runner_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.emulator.host_runner", *RUNNER_ARGS],
        cwd=directory,
        env=device_env(runner_env, directory, None),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def start_runner(directory: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """The emulated device's qnn_executor_runner script, started as a device command starts it."""
    return subprocess.Popen(
        [str(EMULATED_RUNNER), *RUNNER_ARGS],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_served(directory: Path, runner_env: dict[str, str], server: Server | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EMULATED_RUNNER), *RUNNER_ARGS],
        cwd=directory,
        env=device_env(runner_env, directory, server),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def output_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((directory / "outputs").glob("output_*.raw"))}


def trace_content(directory: Path) -> list[dict]:
    """The trace without what differs between any two processes: pids and absolute addresses.

    Addresses become the order in which they first appear, so which tensors share an address still counts.
    """
    numbering: dict[str, int] = {}
    records = mutbuf.read_trace(directory / "outputs" / "trace.jsonl")
    for record in records:
        record.pop("pid")
        for tensor in record["inputs"] + record["outputs"]:
            if "addr" in tensor:
                tensor["addr"] = numbering.setdefault(tensor["addr"], len(numbering))
    return records


def trace_pids(directory: Path) -> set[int]:
    return {record["pid"] for record in mutbuf.read_trace(directory / "outputs" / "trace.jsonl")}


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def is_gone(pid: int) -> bool:
    """Ended: no such process, or a zombie left to whoever adopted it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(condition, what: str, timeout_s: float = GONE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


HEAP_PATTERN_LINE = "runner: heap pattern "  # the runner's first line, before any fault (host_runner.main)


def said(output: str) -> str:
    """What the runner said, less its heap-pattern line."""
    return "\n".join(line for line in output.strip().splitlines() if not line.startswith(HEAP_PATTERN_LINE))


def hanging_child(server: Server, client: subprocess.Popen[str]) -> int:
    """The server's child running this hanging client's run, once it says it hangs."""
    assert client.stdout.readline().startswith(HEAP_PATTERN_LINE)
    assert client.stdout.readline().strip() == "runner: hanging (fault switch)"
    children = children_of(server.process.pid)
    assert len(children) == 1, children
    return children[0]


def test_served_run_matches_a_fresh_host_runner(server, direct, lowered, runner_env, tmp_path):
    reference_dir, reference = direct
    assert reference.returncode == 0, reference.stderr[-2000:]
    served_dirs = [case_dir(lowered, tmp_path / name) for name in ("first", "second")]
    for directory in served_dirs:
        completed = run_served(directory, runner_env, server)
        assert completed.returncode == 0, completed.stderr[-2000:]
        assert qnnlog.error_lines(completed.stdout + completed.stderr) == []
        assert "runner: 4 line(s) x 1 iteration(s)" in completed.stdout
        assert output_bytes(directory) == output_bytes(reference_dir)
        assert len(output_bytes(directory)) == STEPS
        assert trace_content(directory) == trace_content(reference_dir)
    pids = [trace_pids(directory) for directory in served_dirs]
    assert len(pids[0]) == len(pids[1]) == 1 and pids[0] != pids[1], f"one fresh process per run: {pids}"
    assert server.process.pid not in pids[0] | pids[1]
    assert all(
        binding.shared for binding in mutbuf.bindings(mutbuf.read_trace(served_dirs[0] / "outputs" / "trace.jsonl"))
    )


def test_server_never_maps_a_qnn_library(server, lowered, runner_env, tmp_path):
    completed = run_served(case_dir(lowered, tmp_path), runner_env, server)
    assert completed.returncode == 0, completed.stderr[-2000:]
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "executorch" in maps, "the server has executorch's pybindings imported"
    assert "/libQnn" not in maps


@pytest.mark.parametrize(
    "faults, status, says",
    [
        ({"runner_exit": 3}, 3, "runner: exiting 3 (fault switch)"),
        ({"runner_crash": True}, 128 + signal.SIGSEGV, "runner: crashing (fault switch)"),
    ],
)
def test_exit_status_and_crash_reach_the_client(server, lowered, runner_env, tmp_path, faults, status, says):
    completed = run_served(case_dir(lowered, tmp_path, faults), runner_env, server)
    assert (completed.returncode, said(completed.stdout)) == (status, says)
    assert server.process.poll() is None, "a crashing child leaves the server up"


def test_reload_each_line_fault_is_kept(server, direct, lowered, runner_env, tmp_path):
    faults = {"runner_reload_each_line": True}
    served_dir, direct_dir = (
        case_dir(lowered, tmp_path / "served", faults),
        case_dir(lowered, tmp_path / "direct", faults),
    )
    for completed in (run_served(served_dir, runner_env, server), run_direct(direct_dir, runner_env)):
        assert completed.returncode == 0, completed.stderr[-2000:]
    assert output_bytes(served_dir) == output_bytes(direct_dir) != output_bytes(direct[0])


def test_fewer_outputs_fault_is_kept(server, lowered, runner_env, tmp_path):
    directory = case_dir(lowered, tmp_path, {"runner_fewer_outputs": True})
    completed = run_served(directory, runner_env, server)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert output_bytes(directory) == {}  # the model has one output, and the fault drops it


@pytest.mark.parametrize("how", ["sigkill", "timeout"])
def test_killed_client_takes_its_hanging_child_along(server, lowered, runner_env, tmp_path, how):
    directory = case_dir(lowered, tmp_path, {"runner_hang": True})
    env = device_env(runner_env, directory, server)
    if how == "timeout":  # as Device.run starts the runner
        client = subprocess.Popen(
            ["/bin/sh", "-c", f"timeout -s KILL 5 {EMULATED_RUNNER} {' '.join(RUNNER_ARGS)}"],
            cwd=directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    else:
        client = start_runner(directory, env)
    child = hanging_child(server, client)
    held = {fd: os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")}
    declare = {fd: target for fd, target in held.items() if fd not in ("0", "1", "2")}
    server_holds = {
        os.readlink(f"/proc/{server.process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{server.process.pid}/fd")
    }
    assert len(declare) == 1 and all(
        target.startswith("pipe:") and target in server_holds for target in declare.values()
    ), f"the child holds only the client's stdio and the pipe it declares its code to the server on: {held}"
    assert Path(f"/proc/{child}/cwd").resolve() == directory.resolve()
    if how == "sigkill":
        assert os.readlink(f"/proc/{child}/fd/1") == os.readlink(f"/proc/{client.pid}/fd/1")
        client.kill()
    assert client.wait(RUN_TIMEOUT_S) == (128 + signal.SIGKILL if how == "timeout" else -signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{child}").exists(), f"the server to kill and reap child {child}")
    assert children_of(server.process.pid) == []


def test_concurrent_runs_all_succeed(server, direct, lowered, runner_env, tmp_path):
    directories = [case_dir(lowered, tmp_path / f"run{index}") for index in range(4)]
    clients = [start_runner(directory, device_env(runner_env, directory, server)) for directory in directories]
    for client in clients:
        _, stderr = client.communicate(timeout=RUN_TIMEOUT_S)
        assert client.returncode == 0, stderr[-2000:]
    reference_dir, _ = direct
    for directory in directories:
        assert output_bytes(directory) == output_bytes(reference_dir)
        assert trace_content(directory) == trace_content(reference_dir)
    assert len(set().union(*(trace_pids(directory) for directory in directories))) == 4


@pytest.mark.parametrize("socket_env", ["unset", "no server there"])
def test_without_a_server_the_runner_runs_itself(direct, lowered, runner_env, tmp_path, socket_env):
    directory = case_dir(lowered, tmp_path / "case")
    env = device_env(runner_env, directory, None)
    if socket_env == "no server there":
        env[SOCKET_ENV] = str(tmp_path / "absent.sock")
    client = start_runner(directory, env)
    _, stderr = client.communicate(timeout=RUN_TIMEOUT_S)
    assert client.returncode == 0, stderr[-2000:]
    assert trace_pids(directory) == {client.pid}, "the client exec'd host_runner in its own process"
    assert output_bytes(directory) == output_bytes(direct[0])


def test_a_run_wanting_another_qnn_library_is_turned_down_and_run_directly(
    server, direct, toolchain, lowered, runner_env, tmp_path
):
    """A libQnnHtp.so first on the client's LD_LIBRARY_PATH would win in a fresh process, not in a server child."""
    overlay_copy = tmp_path / "overlay"
    shutil.copytree(toolchain.overlay_root, overlay_copy, symlinks=True)
    library = overlay_copy / toolchain.overlay_lib_dir.relative_to(toolchain.overlay_root) / "libQnnHtp.so"
    library.unlink()
    shutil.copyfile(toolchain.interposer, library)
    directory = case_dir(lowered, tmp_path / "case")
    env = device_env(runner_env, directory, server)
    env["LD_LIBRARY_PATH"] = f"{library.parent}:{env['LD_LIBRARY_PATH']}"
    client = start_runner(directory, env)
    _, stderr = client.communicate(timeout=RUN_TIMEOUT_S)
    assert client.returncode == 0, stderr[-2000:]
    assert f"the server turned the request down (its LD_LIBRARY_PATH finds libQnnHtp.so at {library}," in stderr
    assert trace_pids(directory) == {client.pid}
    assert output_bytes(directory) == output_bytes(direct[0])


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_stopped_server_takes_its_runs_along(runner_env, lowered, tmp_path, how):
    socket_path = tmp_path / "runner.sock"
    process = start_server(RUNNER, socket_path, runner_env)
    server = Server(process, socket_path)
    try:
        directory = case_dir(lowered, tmp_path / "case", {"runner_hang": True})
        client = start_runner(directory, device_env(runner_env, directory, server))
        child = hanging_child(server, client)
        if how == "sigkill":  # the child goes by PR_SET_PDEATHSIG, the client hears the server is gone
            process.kill()
    finally:
        stop_server(process)
    _, stderr = client.communicate(timeout=RUN_TIMEOUT_S)
    if how == "sigterm":
        assert process.returncode == 0
        assert client.returncode == 128 + signal.SIGKILL, "the client hears its run was killed"
        assert not socket_path.exists() and not pid_file_of(socket_path).exists()
    else:
        assert client.returncode == 1 and "went away during the run" in stderr
    wait_until(lambda: is_gone(child), f"child {child} to end")


def test_socket_paths_longer_than_af_unix_allows(tmp_path):
    directory = tmp_path / ("d" * MAX_UNIX_PATH_BYTES)
    directory.mkdir()
    path = str(directory / "runner.sock")

    def at(path_call, path: str) -> None:
        address, directory_fd = unix_address(path)
        try:
            path_call(address)
        finally:
            if directory_fd is not None:
                os.close(directory_fd)

    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener,
        socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client,
    ):
        at(listener.bind, path)
        listener.listen()
        at(client.connect, path)
        assert Path(path).is_socket()


def test_served_runs_are_much_cheaper_than_fresh_processes(server, lowered, runner_env, tmp_path):
    directory = case_dir(lowered, tmp_path)
    timings: dict[str, list[float]] = {"direct": [], "served": []}
    for _ in range(TIMED_RUNS):
        for name, run in (
            ("direct", lambda: run_direct(directory, runner_env)),
            ("served", lambda: run_served(directory, runner_env, server)),
        ):
            started = time.perf_counter()
            completed = run()
            timings[name].append(time.perf_counter() - started)
            assert completed.returncode == 0, completed.stderr[-2000:]
    direct_s, served_s = statistics.median(timings["direct"]), statistics.median(timings["served"])
    print(
        f"\nmedian of {TIMED_RUNS}: fresh host_runner {direct_s:.3f} s, through the server {served_s:.3f} s, "
        f"{direct_s / served_s:.1f}x"
    )
    assert direct_s / served_s >= 3, timings
