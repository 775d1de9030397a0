"""The emulated devices are real adb devices: stock adbutils and the adb CLI drive them through a real server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import adbutils
import pytest

from harness.device.adb import AdbClient, AdbServer
from harness.emulator import jail, launcher
from harness.emulator.adbd_services import RAW_HANGUP_GRACE_S, SandboxEscape, device_to_host
from harness.emulator.launcher import EmulatorFleet, FleetError
from harness.emulator.shell_paths import rewrite_device_paths
from harness.tests.waiting import eventually

ADB = os.environ.get("ADBUTILS_ADB_PATH") or adbutils.adb_path()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorFleet]:
    with EmulatorFleet(["SM8650", "SM8750"], tmp_path_factory.mktemp("fleet")) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet: EmulatorFleet) -> adbutils.AdbClient:
    return AdbClient(server=fleet.server)


@pytest.fixture
def device(fleet: EmulatorFleet, client: adbutils.AdbClient) -> adbutils.AdbDevice:
    return client.device(fleet.devices[0].serial)


def adb_cli(fleet: EmulatorFleet, serial: str, *args: str, stdin_text: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ADB, "-L", fleet.server.address, "-s", serial, *args],
        capture_output=True,
        text=True,
        timeout=30,
        input=stdin_text,
    )


def sandbox_pids(root: Path) -> list[int]:
    """PIDs of commands running on the emulated device whose sandbox is `root`."""
    marker = f"ANDROID_ROOT_SANDBOX={root}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_rewrite_device_paths_prefixes_device_roots_only() -> None:
    root = Path("/sandbox")
    command = (
        "cd /data/local/tmp && LD_LIBRARY_PATH=/vendor/lib64:/system/lib64 ./runner "
        "--model_path '/data/local/tmp/m.pte' --out=\"/sdcard/o\" > /data/log; cat /etc/hosts /database"
    )
    assert rewrite_device_paths(command, root) == (
        "cd /sandbox/data/local/tmp && LD_LIBRARY_PATH=/sandbox/vendor/lib64:/sandbox/system/lib64 ./runner "
        "--model_path '/sandbox/data/local/tmp/m.pte' --out=\"/sandbox/sdcard/o\" > /sandbox/data/log; "
        "cat /etc/hosts /database"
    )
    assert rewrite_device_paths("ls /data", root) == "ls /sandbox/data"
    assert rewrite_device_paths("echo a/data/x", root) == "echo a/data/x"


def test_rewrite_leaves_paths_already_in_the_sandbox_alone() -> None:
    root = Path("/data/ci/root")
    rewritten = rewrite_device_paths("ls /data/ci/root/data/x /data/x", root)
    assert rewritten == "ls /data/ci/root/data/x /data/ci/root/data/x"


def test_device_paths_cannot_escape_the_sandbox(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    assert device_to_host("/data/../../../etc/passwd", root) == root / "etc/passwd"
    assert device_to_host("/", root) == root
    (root / "data/link").symlink_to("/etc")
    with pytest.raises(SandboxEscape):
        device_to_host("/data/link/passwd", root)


def test_shell_v2_reports_exit_code_and_separate_stderr(device: adbutils.AdbDevice) -> None:
    result = device.shell2("echo hi; echo oops >&2; exit 3", v2=True)
    assert (result.returncode, result.stdout, result.stderr) == (3, "hi\n", "oops\n")


def test_shell_v1_and_exec_stream_raw_output(device: adbutils.AdbDevice) -> None:
    assert device.shell("echo out; echo err >&2").splitlines() == ["out", "err"]
    with device.open_transport() as connection:
        connection.send_command("exec:printf 'a\\0b'")
        connection.check_okay()
        assert connection.read_until_close(encoding=None) == b"a\0b"


def test_commands_run_inside_the_sandbox(fleet: EmulatorFleet, device: adbutils.AdbDevice) -> None:
    root = fleet.devices[0].root
    output = device.shell("pwd; echo $ANDROID_ROOT_SANDBOX; echo made > /data/local/tmp/made.txt")
    jailed = jail.unavailable_reason() is None  # in the jail the sandbox is the device's /
    assert output.splitlines() == ["/data/local/tmp" if jailed else str(root / "data/local/tmp"), str(root)]
    assert (root / "data/local/tmp/made.txt").read_text() == "made\n"


def test_push_stat_list_pull_round_trip(device: adbutils.AdbDevice, tmp_path: Path) -> None:
    payload = os.urandom(100_000)
    device.sync.push(payload, "/data/local/tmp/dir/blob.bin", mode=0o644)
    info = device.sync.stat("/data/local/tmp/dir/blob.bin")
    assert info.size == len(payload) and info.mode & 0o777 == 0o644
    assert [entry.path for entry in device.sync.list("/data/local/tmp/dir")] == ["blob.bin"]
    device.sync.pull("/data/local/tmp/dir/blob.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload


def test_push_and_pull_5_mb(device: adbutils.AdbDevice, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(5 * 1024 * 1024))
    assert device.sync.push(source, "/data/local/tmp/big.bin") == source.stat().st_size
    assert device.sync.read_bytes("/data/local/tmp/big.bin") == source.read_bytes()


def test_pull_of_missing_file_fails_cleanly(device: adbutils.AdbDevice) -> None:
    assert device.sync.stat("/data/local/tmp/missing").mode == 0
    with pytest.raises(adbutils.AdbError, match="No such file"):
        device.sync.read_bytes("/data/local/tmp/missing")
    assert device.shell("echo still-usable") == "still-usable"


def test_adb_cli_reads_each_devices_soc(fleet: EmulatorFleet) -> None:
    for info in fleet.devices:
        result = adb_cli(fleet, info.serial, "shell", "getprop", "ro.soc.model")
        assert (result.returncode, result.stdout.strip()) == (0, info.soc)
    listing = subprocess.run(
        [ADB, "-L", fleet.server.address, "devices", "-l"], capture_output=True, text=True, timeout=30
    ).stdout
    assert "model:Emulated_SM8650" in listing and "model:Emulated_SM8750" in listing


def test_adb_cli_push_pull_and_exit_code(fleet: EmulatorFleet, tmp_path: Path) -> None:
    serial = fleet.devices[1].serial
    (tmp_path / "in.txt").write_text("cli")
    assert adb_cli(fleet, serial, "push", str(tmp_path / "in.txt"), "/data/local/tmp/cli/in.txt").returncode == 0
    assert adb_cli(fleet, serial, "pull", "/data/local/tmp/cli/in.txt", str(tmp_path / "out.txt")).returncode == 0
    assert (tmp_path / "out.txt").read_text() == "cli"
    assert adb_cli(fleet, serial, "shell", "exit 7").returncode == 7


@pytest.mark.parametrize("service", ["shell", "exec-in"])  # shell protocol v2 / raw exec: stdin
def test_adb_cli_forwards_stdin(fleet: EmulatorFleet, service: str) -> None:
    target = f"/data/local/tmp/stdin-{service}.txt"
    result = adb_cli(fleet, fleet.devices[1].serial, service, f"cat > {target}", stdin_text=f"via {service}\n")
    written = fleet.devices[1].root / target.lstrip("/")
    assert result.returncode == 0  # exec-in returns once stdin is sent, without waiting for the command
    assert eventually(lambda: written.exists() and written.read_text() == f"via {service}\n")


def test_concurrent_streams_on_one_device(device: adbutils.AdbDevice) -> None:
    def round_trip(index: int) -> bool:
        payload = os.urandom(300_000)
        device.sync.push(payload, f"/data/local/tmp/parallel/{index}.bin")
        echoed = device.shell2(f"echo {index}", v2=True).stdout
        return device.sync.read_bytes(f"/data/local/tmp/parallel/{index}.bin") == payload and echoed == f"{index}\n"

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(round_trip, range(16)))


def test_killing_the_host_side_kills_the_device_command(fleet: EmulatorFleet) -> None:
    info = fleet.devices[1]
    host_side = subprocess.Popen(
        [ADB, "-L", fleet.server.address, "-s", info.serial, "shell", "sleep 300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        assert eventually(lambda: bool(sandbox_pids(info.root)))
    finally:
        host_side.kill()
        host_side.wait()
    assert eventually(lambda: not sandbox_pids(info.root))  # shell v2: killed at once


def test_hanging_up_a_raw_shell_kills_its_command_after_a_grace(
    fleet: EmulatorFleet, client: adbutils.AdbClient
) -> None:
    info = fleet.devices[1]
    with client.device(info.serial).open_transport() as connection:  # what adbutils' shell() does on a timeout
        connection.send_command("shell:sleep 300")
        connection.check_okay()
        assert eventually(lambda: bool(sandbox_pids(info.root)))
    assert eventually(lambda: not sandbox_pids(info.root), timeout_s=RAW_HANGUP_GRACE_S + 30)


def test_storage_full_fails_pushes_and_flags_commands(
    fleet: EmulatorFleet, device: adbutils.AdbDevice, tmp_path: Path
) -> None:
    serial = fleet.devices[0].serial
    fleet.set_faults(serial, storage_full=True)
    try:
        with pytest.raises(adbutils.AdbError):  # adbutils drops the FAIL message
            device.sync.push(b"data", "/data/local/tmp/full.bin")
        (tmp_path / "f.bin").write_bytes(b"data")
        result = adb_cli(fleet, serial, "push", str(tmp_path / "f.bin"), "/data/local/tmp/full.bin")
        assert result.returncode != 0 and "No space left on device" in result.stderr
        assert device.shell("echo $EMULATED_STORAGE_FULL") == "1"
    finally:
        fleet.set_faults(serial, storage_full=None)
    device.sync.push(b"data", "/data/local/tmp/full.bin")


def test_drop_after_bytes_breaks_a_pull_once(fleet: EmulatorFleet, client: adbutils.AdbClient) -> None:
    dropping, healthy = fleet.devices[:2]
    device = client.device(dropping.serial)
    device.sync.push(b"z" * 2_000_000, "/data/local/tmp/drop.bin")
    fleet.set_faults(dropping.serial, drop_after_bytes=100_000)
    with pytest.raises(adbutils.AdbError):
        device.sync.read_bytes("/data/local/tmp/drop.bin")
    assert client.device(healthy.serial).shell("echo ok") == "ok"
    assert eventually(lambda: fleet.device_states().get(dropping.serial) == "device")  # adb reconnects by itself
    assert len(device.sync.read_bytes("/data/local/tmp/drop.bin")) == 2_000_000  # the fault fired once


def test_unauthorized_and_offline_devices_are_listed_as_such(fleet: EmulatorFleet) -> None:
    unauthorized = fleet.add_device("SM8650", unauthorized=True)
    offline = fleet.add_device("SM8750", offline=True)
    listing = subprocess.run(
        [ADB, "-L", fleet.server.address, "devices"], capture_output=True, text=True, timeout=30
    ).stdout
    assert f"{unauthorized.serial}\tunauthorized" in listing and f"{offline.serial}\toffline" in listing
    for healthy in fleet.devices[:2]:
        assert f"{healthy.serial}\tdevice" in listing


def test_stopped_device_vanishes_with_its_commands(fleet: EmulatorFleet, client: adbutils.AdbClient) -> None:
    doomed = fleet.add_device("SM8650")
    # A command still running (a background one ends with its shell: each has a pid namespace of its own).
    running = client.device(doomed.serial).shell("sleep 300", stream=True)
    assert eventually(lambda: bool(sandbox_pids(doomed.root)))
    fleet.stop_device(doomed.serial)
    running.close()
    assert not is_alive(doomed.pid)
    assert eventually(lambda: not sandbox_pids(doomed.root))  # SIGKILLed, gone once the kernel is done
    # The adb server drops the transport when its own read sees the socket close, a moment later (as for a cable)
    assert eventually(lambda: fleet.device_states().get(doomed.serial) in (None, "offline"))
    assert doomed not in fleet.devices
    assert client.device(fleet.devices[0].serial).shell("echo alive") == "alive"


@pytest.mark.device
def test_stop_leaves_no_process_and_closes_the_server_port(tmp_path: Path) -> None:
    fleet = EmulatorFleet(["SM8650"], tmp_path).start()
    pids, server_socket = fleet.started_pids, fleet.server.path
    assert len(pids) == 2 and all(is_alive(pid) for pid in pids)
    fleet.stop()
    fleet.stop()  # idempotent
    assert not any(is_alive(pid) for pid in pids)
    with pytest.raises((ConnectionRefusedError, FileNotFoundError)), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(server_socket)


@pytest.mark.device
def test_failed_start_stops_what_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def properties_or_failure(soc: str, name: str, as_phone: bool = False, index: int = 0) -> dict[str, str]:
        if soc == "BROKEN":
            raise FleetError("no such SoC")
        return {"ro.soc.model": soc}

    monkeypatch.setattr(launcher, "device_properties", properties_or_failure)
    fleet = EmulatorFleet(["SM8650", "BROKEN"], tmp_path)
    with pytest.raises(FleetError, match="no such SoC"):
        fleet.start()
    assert len(fleet.started_pids) == 2 and not any(is_alive(pid) for pid in fleet.started_pids)


@pytest.mark.device
def test_launcher_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.emulator.launcher", "--soc", "SM8750", "--workdir", str(tmp_path)],
        cwd=launcher.PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        description = json.loads(process.stdout.readline())
        serial = description["devices"][0]["serial"]
        client = AdbClient(server=AdbServer.parse(description["adb_server"], "adb_server"))
        assert client.device(serial).getprop("ro.board.platform") == "sun"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    assert not is_alive(description["devices"][0]["pid"])
