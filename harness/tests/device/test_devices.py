"""The device layer over emulated devices: round trips, unchanged pushes, SoC detection, bad
devices, exclusive use across workers and runs, a device lost mid-run and a hung runner."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import adbutils
import pytest

from harness import run_records
from harness.context import RunContext
from harness.device import discovery, kinds
from harness.device.adb import AdbClient, AdbServer
from harness.device.device import PROBE_TIMEOUT_S, WORKSPACE_ROOT, Device, DeviceError, DeviceLost
from harness.device.execute import DeviceRunRequest, RunnerFailed, Workspace, run_case
from harness.device.payload import (
    EMULATED_RUNNER,
    EMULATED_SUITE_RUNNER,
    RUNNER_COMMANDS,
    RUNNER_NAME,
    SUITE_RUNNER_BINARY_NAME,
    SUITE_RUNNER_NAME,
)
from harness.device.pool import DevicePool, DeviceSpec, remove_run_folders
from harness.emulator.launcher import EmulatorFleet
from harness.paths import REPO_ROOT
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk

SCENARIO = Path(__file__).parent / "scenarios" / "scenario_devices.py"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, toolchain):
    device_env = {**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}
    with EmulatorFleet(["SM8650", "SM8750"], tmp_path_factory.mktemp("fleet"), device_env=device_env) as started:
        yield started


@pytest.fixture
def device(fleet) -> Device:
    return Device(fleet.devices[0].serial, AdbClient(server=fleet.server))


def test_round_trip_with_exit_codes(device, tmp_path):
    workspace = device.workspace("roundtrip")
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(4096))
    assert device.push(source, f"{workspace}/data.bin") is True
    result = device.run(["sh", "-c", "cat data.bin | wc -c; exit 7"], cwd=workspace, timeout_s=30)
    assert result.exit_code == 7 and result.output.split()[0] == "4096"
    device.pull(f"{workspace}/data.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    assert device.remove_workspaces() == [] and device.list_dir(workspace) == []


def test_unchanged_push_transfers_nothing(device, tmp_path):
    workspace = device.workspace("unchanged")
    big = tmp_path / "five_mb.bin"
    big.write_bytes(os.urandom(5 * 1024 * 1024))
    started = time.perf_counter()
    assert device.push(big, f"{workspace}/five_mb.bin") is True
    first = time.perf_counter() - started
    started = time.perf_counter()
    assert device.push(big, f"{workspace}/five_mb.bin") is False, "second push of identical bytes must be skipped"
    second = time.perf_counter() - started
    big.write_bytes(os.urandom(5 * 1024 * 1024))
    assert device.push(big, f"{workspace}/five_mb.bin") is True, "changed bytes must be pushed again"
    print(f"5 MB push {first * 1000:.0f} ms, unchanged {second * 1000:.0f} ms")
    device.remove_workspaces()


def test_soc_detection_and_the_real_adb_cli(fleet):
    adb_path = os.environ.get("ADBUTILS_ADB_PATH") or adbutils.adb_path()
    for info in fleet.devices:
        device = Device(info.serial, AdbClient(server=fleet.server))
        assert (device.soc, device.abi) == (info.soc, "x86_64")
        cli = subprocess.run(
            [adb_path, "-L", fleet.server.address, "-s", info.serial, "shell", "getprop", "ro.soc.model"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert cli.stdout.strip() == info.soc


def test_bad_devices_each_get_one_line(fleet):
    client = AdbClient(server=fleet.server)
    with pytest.raises(DeviceError, match=r"^unknown device serial nosuch:1: attached are .*check `adb devices`$"):
        discovery.select(client, ["nosuch:1"])
    with pytest.raises(DeviceError, match="given twice"):
        discovery.requested_serials(["a", "a"])
    locked = fleet.add_device("SM8650", unauthorized=True)
    with pytest.raises(DeviceError, match="is unauthorized: unlock it and accept the USB debugging prompt"):
        discovery.select(client, [locked.serial])
    gone = fleet.add_device("SM8650", offline=True)
    with pytest.raises(DeviceError, match="is offline: reconnect it"):
        discovery.select(client, [gone.serial])
    with pytest.raises(DeviceError, match="no adb server answers on 127.0.0.1:1:"):
        discovery.client(AdbServer("127.0.0.1", 1))


def test_a_missing_server_s_hint_proposes_a_loopback_server_and_only_what_was_chosen(monkeypatch):
    """No adb server: the hint starts one on loopback and names no option the user did not pass; `adb -a`
    (a server every host on the network reaches) only for a server the user placed on another host."""
    monkeypatch.delenv("ADB_SERVER_SOCKET", raising=False)
    monkeypatch.delenv("ANDROID_ADB_SERVER_PORT", raising=False)
    default = discovery._start_hint(discovery.default_server())
    assert default == "start it with `adb -P 5037 start-server` (it listens on loopback only)"
    chosen = discovery._start_hint(AdbServer("127.0.0.1", 5099))
    assert "adb -a" not in chosen and chosen.endswith("or fix --adb-server 127.0.0.1:5099")
    remote = discovery._start_hint(AdbServer("rack-3", 5037))
    assert "`adb -a -P 5037 server nodaemon`" in remote and "network you trust" in remote
    monkeypatch.setenv("ADB_SERVER_SOCKET", "tcp:127.0.0.1:5077")
    assert discovery._start_hint(discovery.default_server()).endswith("or fix ADB_SERVER_SOCKET")


def _failed_run(fleet, device, tmp_path, fault: str, timeout_s: float, runner: str = SUITE_RUNNER_NAME) -> str:
    """The RunnerFailed line of a run on the emulated device's runner with one fault switch on."""
    workspace = device.workspace(f"{fault}-{runner}")
    payload = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(WHEEL_SDK))
    for item in payload:
        device.push(item.local, f"{workspace}/{item.remote_name}", mode=item.mode)
    runners = tuple(item.remote_name for item in payload if item.remote_name in RUNNER_COMMANDS)
    assert runner in runners
    fleet.set_faults(device.serial, **{fault: True})
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"not reached: the fault comes first")
    try:
        with pytest.raises(RunnerFailed) as failure:
            run_case(
                device,
                Workspace(workspace, workspace, runners=runners),
                DeviceRunRequest(
                    "case", pte, [()], tmp_path / "local", output_count=1, timeout_s=timeout_s, runner=runner
                ),
            )
    finally:
        fleet.set_faults(device.serial, **{fault: None})
    return str(failure.value)


@pytest.mark.parametrize("runner", [SUITE_RUNNER_NAME, RUNNER_NAME])
def test_hung_runner_is_killed_and_its_log_pulled(fleet, device, tmp_path, runner):
    """The compiled runner (stopped by the fault) and the pybindings runner: both killed with the command."""
    started = time.perf_counter()
    message = _failed_run(fleet, device, tmp_path, "runner_hang", timeout_s=3, runner=runner)
    assert time.perf_counter() - started < 30
    assert "hung and was killed after 3 s" in message and "runner: hanging (fault switch)" in message
    # Wherever the runner's process went (a killed parent's child is reparented), none is left of this run.
    deadline = time.monotonic() + 10
    while (alive := _runners_of(f"runner_hang-{runner}")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == [], "the hung runner must be killed on the device"
    device.remove_workspaces()


def _runners_of(workspace_name: str) -> list[int]:
    """Processes running a runner of that workspace (the binary, the wrappers, host_runner)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    return [
        pid
        for pid in pids
        if workspace_name in _cmdline(pid)
        and any(name in _cmdline(pid) for name in (SUITE_RUNNER_BINARY_NAME, "compiled_runner", "host_runner"))
    ]


@pytest.mark.parametrize("runner", [SUITE_RUNNER_NAME, RUNNER_NAME])
def test_an_early_sigkill_is_killed_not_hung(fleet, device, tmp_path, runner):
    """Exit 137 long before the timeout is something else's SIGKILL (Android's low-memory killer), not a hang."""
    message = _failed_run(fleet, device, tmp_path, "runner_killed", timeout_s=120, runner=runner)
    assert "was killed (SIGKILL, exit 137) after" in message and "well before its 120 s timeout" in message
    assert "low-memory killer" in message and "hung" not in message and "runner: killed (fault switch)" in message
    device.remove_workspaces()


WHEEL_SDK = QnnSdk(root=Path("/nonexistent-sdk"), origin=WHEEL_ORIGIN)


def test_emulated_runner_is_the_payload_of_an_x86_device():
    assert kinds.kind_for_abi("x86_64") == "emulated" and kinds.kind_for_abi("arm64-v8a") == "phone"
    payload = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(WHEEL_SDK))
    built = kinds.emulated_suite_runner()[0]
    assert built is not None, kinds.emulated_suite_runner()[1]
    assert [(item.local, item.remote_name) for item in payload] == [
        (EMULATED_RUNNER, RUNNER_NAME),
        (EMULATED_SUITE_RUNNER, SUITE_RUNNER_NAME),
        (built, SUITE_RUNNER_BINARY_NAME),
    ]
    with pytest.raises(DeviceError, match="needs its Android qnn_executor_runner: pass --runner PATH"):
        kinds.of("phone").payload("arm64-v8a", 75, kinds.PayloadInputs(WHEEL_SDK))


def test_runner_of_wrong_architecture_is_refused(tmp_path):
    x86_binary = Path(sys.executable).resolve()
    with pytest.raises(DeviceError, match="is built for x86_64 but the device is arm64-v8a"):
        kinds.of("phone").payload("arm64-v8a", 75, kinds.PayloadInputs(WHEEL_SDK, x86_binary))
    script = tmp_path / "runner"
    script.write_bytes(b"#!/bin/sh\n")  # not an ELF: no ABI to refuse, but the wheel's SDK has no phone libraries
    with pytest.raises(DeviceError, match="pushing to a phone needs a full QNN SDK"):
        kinds.of("phone").payload("arm64-v8a", 75, kinds.PayloadInputs(WHEEL_SDK, script))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_payload_goes_to_a_device_once_per_run(fleet):
    info = fleet.devices[0]
    specs = [DeviceSpec(info.serial, info.soc, 75, "x86_64", "Emulated", kind="emulated", server=fleet.server.address)]
    workers = [DevicePool(specs, "payload-run", worker, sdk=WHEEL_SDK) for worker in ("gw0", "gw1")]
    runner = info.root / "data/local/tmp/qnnsuite/payload-run/payload" / RUNNER_NAME
    written = []
    for pool in workers:
        with pool.acquire(info.soc, holder=pool.worker) as (device, workspace):
            assert workspace.payload.endswith("/payload-run/payload") and workspace.cases.endswith(
                f"/payload-run/{pool.worker}"
            )
            assert (
                device.run(
                    ["test", "-x", f"{workspace.payload}/{RUNNER_NAME}"], cwd=workspace.cases, timeout_s=30
                ).exit_code
                == 0
            )
        written.append(runner.stat().st_ctime_ns)
    assert written[0] == written[1], "the second worker of the run found the runner there and did not push it again"
    for pool in workers:
        assert pool.close(keep=False) == []
    assert runner.exists(), "workers leave the shared payload to the controller"
    assert remove_run_folders(specs, "payload-run") == []
    assert not runner.parent.parent.exists()


# --- child pytest runs of scenarios/scenario_devices.py ------------------------------------------
def _scenario(tmp_path: Path, *args: str, env: dict[str, str] | None = None, background: bool = False):
    command = [sys.executable, "-m", "pytest", str(SCENARIO), "-p", "no:cacheprovider", *args]
    full_env = {**os.environ, "QNNSUITE_LOCK_DIR": str(tmp_path / "locks"), "COLUMNS": "400", **(env or {})}
    if background:
        return subprocess.Popen(
            command, cwd=REPO_ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return subprocess.run(command, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=600)


def _uses(tmp_path: Path) -> dict[str, list[dict]]:
    """The cases' holds per device; each run's health check holds every device once before its cases do."""
    by_device = defaultdict(list)
    for path in (tmp_path / "locks").glob("*.uses.jsonl"):
        uses = [json.loads(line) for line in path.read_text().splitlines()]
        checks = [use for use in uses if use["holder"].startswith("health-")]
        cases = [use for use in uses if use not in checks]
        assert checks and min(use["start"] for use in cases) >= min(use["end"] for use in checks), uses
        by_device[path.name] = cases
    return by_device


def _overlaps(uses: list[dict]) -> int:
    ordered = sorted(uses, key=lambda use: use["start"])
    return sum(1 for before, after in zip(ordered, ordered[1:]) if after["start"] < before["end"])


def _alive(pid: int) -> bool:
    """Running and not a zombie (run_records knows a process by its start time, None once it is gone)."""
    return run_records.start_time(pid) is not None


@pytest.mark.child_suite
def test_four_workers_on_two_devices_never_overlap(tmp_path):
    completed = _scenario(
        tmp_path,
        "--emulate",
        "SM8650,SM8750",
        "-n",
        "4",
        env={"SCENARIO_CASES": "6", "SCENARIO_HOLD_S": "0.3", "SCENARIO_OUT": str(tmp_path / "ctx.json")},
    )
    assert completed.returncode == 0, completed.stdout[-3000:]
    uses = _uses(tmp_path)
    assert len(uses) == 2 and all(len(device_uses) == 6 for device_uses in uses.values())
    assert len({use["pid"] for device_uses in uses.values() for use in device_uses}) > 1, "several workers took part"
    assert [_overlaps(device_uses) for device_uses in uses.values()] == [0, 0]
    context = RunContext.from_json((tmp_path / "ctx.json").read_text())
    assert not any(_alive(pid) for pid in context.started_pids)


@pytest.mark.child_suite
def test_two_pytest_runs_on_one_device_take_turns(tmp_path, fleet):
    serial = fleet.devices[0].serial
    env = {
        **fleet.server.environment,
        "SCENARIO_SOCS": fleet.devices[0].soc,
        "SCENARIO_CASES": "3",
        "SCENARIO_HOLD_S": "0.5",
    }
    runs = [_scenario(tmp_path, "--device", serial, env=env, background=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    (uses,) = _uses(tmp_path).values()
    assert len(uses) == 6 and len({use["pid"] for use in uses}) == 2
    assert _overlaps(uses) == 0


@pytest.mark.child_suite
def test_the_folder_a_killed_run_left_on_a_phone_is_removed_by_the_next_run(tmp_path, fleet):
    """A killed run cannot remove /data/local/tmp/qnnsuite/<run id> from the phones it used; its record names
    them, and the next run of the same user on such a phone removes the folder (and only that one)."""
    info = fleet.devices[0]
    device = Device(info.serial, AdbClient(server=fleet.server))
    killed, other = "20261201-010101-999", "20261201-010101-998"
    label = f"{fleet.server.address}/{info.serial}"  # records name a device by server and serial
    for run_id in (killed, other):
        device.shell(f"mkdir -p {WORKSPACE_ROOT}/{run_id}/payload && echo x > {WORKSPACE_ROOT}/{run_id}/payload/f")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    runs = state / "qnnsuite" / "runs"
    runs.mkdir(parents=True, mode=0o700)
    (state / "qnnsuite").chmod(0o700)
    (runs / f"{killed}.json").write_text(
        json.dumps(
            {"run_id": killed, "controller": [_dead_pid(), 1], "work_dir": "", "processes": [], "devices": [label]}
        )
    )
    env = {**fleet.server.environment, "SCENARIO_SOCS": info.soc, "SCENARIO_CASES": "1", "XDG_RUNTIME_DIR": str(state)}
    completed = _scenario(tmp_path, "--device", info.serial, "-s", env=env)
    assert completed.returncode == 0, completed.stdout[-3000:]
    assert f"removed {label}:{WORKSPACE_ROOT}/{killed}, left by a killed run" in completed.stdout + completed.stderr
    listed = device.shell(f"ls {WORKSPACE_ROOT}").output.split()
    assert killed not in listed and other in listed, listed
    assert list((state / "qnnsuite" / "leftovers").iterdir()) == []
    device.shell(f"rm -rf {WORKSPACE_ROOT}/{other}")


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


@pytest.mark.child_suite
def test_device_lost_mid_run_fails_only_its_cases(tmp_path):
    completed = _scenario(
        tmp_path,
        "--emulate",
        "SM8650,SM8750",
        "-n",
        "2",
        "-rf",
        "-v",
        env={"SCENARIO_CASES": "4", "SCENARIO_KILL": "SM8750:1", "SCENARIO_OUT": str(tmp_path / "ctx.json")},
    )
    assert completed.returncode == 1, completed.stdout[-3000:]
    failed = [line for line in completed.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) >= 1 and all("-SM8750]" in line or "SM8750-" in line for line in failed), completed.stdout[
        -3000:
    ]
    assert all("lost during" in line and "check the cable/connection and `adb devices`" in line for line in failed), (
        failed
    )
    passed = [line for line in completed.stdout.splitlines() if "PASSED" in line and "[SM8650-" in line]
    assert len(passed) == 4, "every case of the other device passes"
    context = RunContext.from_json((tmp_path / "ctx.json").read_text())
    assert not any(_alive(pid) for pid in context.started_pids)


def test_a_frozen_device_is_lost_at_its_first_timeout(fleet):
    """A device that keeps its TCP link but stops answering (SIGSTOP) is declared lost after one timeout
    and a short probe, so its other cases fail at once instead of each waiting out a timeout."""
    info = fleet.add_device("SM8650")
    device = Device(info.serial, AdbClient(server=fleet.server))
    assert device.answers()
    os.kill(info.pid, signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(DeviceLost, match=rf"device {re.escape(info.serial)} stopped answering: "):
            device.shell("echo hello", timeout_s=3)
    finally:
        os.kill(info.pid, signal.SIGCONT)
    assert time.monotonic() - started < 3 + PROBE_TIMEOUT_S + 5
    fleet.stop_device(info.serial)


def test_a_device_frozen_during_a_long_command_is_lost_within_30_s(fleet):
    """The runner's command has a timeout of minutes; a device frozen while it runs is found by the watchdog's
    probes and lost within 30 s. A healthy command that runs past the first probes is not disturbed."""
    info = fleet.add_device("SM8650")
    device = Device(info.serial, AdbClient(server=fleet.server))
    healthy = device.run(["sh", "-c", "sleep 12; echo finished"], cwd="/data/local/tmp", timeout_s=120)
    assert healthy.exit_code == 0 and "finished" in healthy.output
    freeze = threading.Timer(2.0, os.kill, (info.pid, signal.SIGSTOP))
    freeze.start()
    started = time.monotonic()
    try:
        with pytest.raises(DeviceLost, match=rf"device {re.escape(info.serial)} stopped answering while `cd "):
            device.run(["sleep", "200"], cwd="/data/local/tmp", timeout_s=200)
    finally:
        freeze.join()
        os.kill(info.pid, signal.SIGCONT)
    assert time.monotonic() - started < 30
    fleet.stop_device(info.serial)


def test_a_missing_adb_server_is_an_error_and_none_is_started(tmp_path):
    """adbutils alone runs `adb start-server` (on 5037, whatever port it was given) when it finds none."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    default_was_listening = discovery.server_listening(5037)
    started = time.monotonic()
    with pytest.raises(adbutils.AdbError):
        AdbClient(host="127.0.0.1", port=port).list()
    assert time.monotonic() - started < 5
    assert not discovery.server_listening(port)
    assert discovery.server_listening(5037) == default_was_listening, "no server was started on 5037"


def test_a_runners_last_words_are_its_last_stderr_line_whatever_order_the_streams_arrived_in():
    """shell v2 carries stdout and stderr apart: a corrupt program's "cannot load" (stderr) can arrive before
    the line the runner printed ahead of it on stdout (seen in CI), so the combined output's last line lies."""
    from harness.device.device import RunResult
    from harness.device.execute import _last_words

    arrived = "runner: cannot load model.pte: bad magic\nrunner: heap pattern 0x40\n"
    assert (
        _last_words(RunResult("r", 3, arrived, 0.1, "runner: cannot load model.pte: bad magic\n"))
        == "runner: cannot load model.pte: bad magic"
    )
    assert (
        _last_words(RunResult("r", 3, "runner: exiting 3 (fault switch)\n", 0.1, ""))
        == "runner: exiting 3 (fault switch)"
    ), "nothing on stderr: the output's last line"
