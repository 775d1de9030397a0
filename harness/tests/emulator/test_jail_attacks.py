"""Attacks from a device command on the host, one test each: the jail (harness/emulator/jail.py) shows the
command its device and what a shell and the runner need, nothing of the run or the user, wherever TMPDIR
put the run's work folder; it signals no host process and leaves no process behind.

The fleets here are started as a run starts its own: the work folder made by make_work_folder under a
TMPDIR outside /tmp (under /var/tmp; inside the checkout, a path the jail must bind for the runner), a
stand-in lowering server socket and its key in it, the fleet in its `emulator` folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.device.adb import AdbClient
from harness.device.device import Device, DeviceError
from harness.emulator import jail
from harness.emulator.launcher import EmulatorFleet
from harness.files import make_work_folder
from harness.paths import REPO_ROOT
from harness.tests.child_suite import suite_command

GONE_WITHIN_S = 5.0  # how long a killed pid namespace may take to be reaped
TMPDIRS = {"var-tmp": Path("/var/tmp"), "in-checkout": REPO_ROOT / ".qnn"}


class Run:
    """A fleet started as a run starts one, with the host secrets a device command must not reach."""

    def __init__(self, base: Path) -> None:
        self.tmpdir = Path(tempfile.mkdtemp(prefix="qnnsuite-tmpdir-", dir=base))
        saved = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(self.tmpdir)
        try:
            self.work_dir = make_work_folder("qnnsuite-jail-attack-")
            self.fleet = EmulatorFleet(["SM8650"], self.work_dir / "emulator", private_dirs=(self.work_dir,))
            self.fleet.start()
        finally:
            os.environ.pop("TMPDIR") if saved is None else os.environ.__setitem__("TMPDIR", saved)
        self.lowering = socket.socket(socket.AF_UNIX)
        self.lowering.bind(str(self.work_dir / "lower.sock"))
        self.lowering.listen()
        (self.work_dir / "lower.sock.key").write_text("secret")

    def device(self) -> Device:
        return Device(self.fleet.devices[0].serial, AdbClient(server=self.fleet.server))

    def secrets(self) -> dict[str, Path]:
        """What the device must not see, each there on the host (checked)."""
        found = {
            "lowering socket": self.work_dir / "lower.sock",
            "lowering key": self.work_dir / "lower.sock.key",
            "adb server socket": Path(self.fleet.server.path),
            "adb key": self.fleet.server_public_key.with_suffix(""),
        }
        assert all(path.exists() for path in found.values()), found
        return found

    def stop(self) -> None:
        self.lowering.close()
        self.fleet.stop()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture(scope="module", params=sorted(TMPDIRS))
def run(request: pytest.FixtureRequest) -> Iterator[Run]:
    if jail.unavailable_reason():
        pytest.skip(f"no jail on this machine: {jail.unavailable_reason()}")
    started = Run(TMPDIRS[request.param])
    try:
        yield started
    finally:
        started.stop()


def _reaches(device: Device, path: Path) -> str:
    """What the device shell finds at a host path: "" when nothing is there for it."""
    probe = device.shell(f"test -e '{path}' && echo exists; ls -d '{path}' 2>/dev/null").output
    return probe.strip()


@pytest.mark.device
def test_a_device_command_reaches_no_socket_or_key_of_the_run(run: Run) -> None:
    """Attack: with TMPDIR outside /tmp, a device command connects to the run's lowering server (which ran
    its requests as the suite's user), to the run's adb server, or reads the run's adb key."""
    device = run.device()
    for what, path in run.secrets().items():
        assert _reaches(device, path) == "", what
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({str(run.work_dir / 'lower.sock')!r})"
    attempt = device.shell(f'{sys.executable} -c "{connect}"')
    assert attempt.exit_code != 0 and "FileNotFoundError" in attempt.output, attempt.output
    assert device.shell("echo ok").output == "ok\n", "the device itself still works"


@pytest.mark.device
def test_a_device_command_reaches_no_unix_socket_under_a_home_folder(run: Run) -> None:
    """Attack: a device command uses an ssh ControlMaster or a gpg agent socket in the user's home."""
    home = Path.home()
    if not os.access(home, os.W_OK):
        pytest.skip(f"the home folder {home} is not writable here")
    folder = Path(tempfile.mkdtemp(prefix=".qnnsuite-agent-", dir=home))
    try:
        with socket.socket(socket.AF_UNIX) as agent:
            agent.bind(str(folder / "S.gpg-agent"))
            agent.listen()
            assert _reaches(run.device(), folder / "S.gpg-agent") == ""
            listing = run.device().shell(f"ls -A '{home}'").output.split()
            assert folder.name not in listing, "the home folder shows only the way to a needed path (a Python)"
    finally:
        shutil.rmtree(folder)


@pytest.mark.device
def test_a_device_command_signals_no_host_process(run: Run) -> None:
    """Attack: a device command kills a process of the suite's user (a host `sleep` here) by its pid."""
    host = subprocess.Popen(["sleep", "300"])
    try:
        attempt = run.device().shell(f"kill -9 {host.pid}; echo status=$?")
        assert "status=0" not in attempt.output, attempt.output
        assert host.poll() is None, "the host process still runs"
        assert run.device().shell("echo $$").output.strip() in ("1", "2"), "the shell sees its own pids only"
    finally:
        host.kill()
        host.wait()


def _processes_named(word: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and word.encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _gone(word: str) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while _processes_named(word):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.device
def test_a_daemon_started_on_a_device_does_not_outlive_it(run: Run) -> None:
    """Attack: `setsid env -i sleep N &` on a device, a daemon that would outlive the device and the run."""
    seconds = str(900000 + os.getpid() % 1000)
    device = run.device()
    started = device.shell(f"setsid env -i sleep {seconds} </dev/null >/dev/null 2>&1 & echo started")
    assert started.output == "started\n"
    assert _gone(seconds), f"sleep {seconds} still runs after its shell: {_processes_named(seconds)}"
    extra = run.fleet.add_device("SM8650")
    other = Device(extra.serial, AdbClient(server=run.fleet.server))

    def hold() -> None:  # its shell runs on until the device is stopped under it
        with contextlib.suppress(DeviceError):
            other.shell(f"setsid env -i sleep {seconds} </dev/null >/dev/null 2>&1 & sleep 300", timeout_s=120)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    deadline = time.monotonic() + 30
    while not _processes_named(seconds):
        assert time.monotonic() < deadline, "the daemon never started"
        time.sleep(0.05)
    run.fleet.stop_device(extra.serial)
    assert _gone(seconds), f"sleep {seconds} still runs after its device stopped: {_processes_named(seconds)}"
    holder.join(30)
    for pid in _processes_named(seconds):  # never leave one behind, even when the test fails
        os.kill(pid, signal.SIGKILL)


FULL_TMP = """
set -e
mount -t tmpfs -o size=512k tmpfs /tmp
mkdir -m 700 /tmp/runtime
dd if=/dev/zero of=/tmp/fill bs=4k 2>/dev/null || true
exec "$@"
"""


@pytest.mark.child_suite
def test_a_full_tmp_stops_the_run_with_one_line(tmp_path: Path) -> None:
    """Attack (by the host): /tmp is full, so tempfile would make the run's work folder in /var/tmp, silently;
    the run must stop with one line instead (here /tmp is a full tmpfs in a mount namespace of the run's own)."""
    if os.getuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to give a run a full /tmp of its own")
    env = {key: value for key, value in os.environ.items() if key not in ("TMPDIR", "TEMP", "TMP")}
    completed = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", FULL_TMP, "full-tmp"]
        + suite_command("--collect-only", "--emulate", "SM8650"),
        cwd=REPO_ROOT,
        env={**env, "COLUMNS": "300", "XDG_RUNTIME_DIR": "/tmp/runtime"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert lines == [
        "ERROR: cannot make the run's work folder in /tmp (No space left on device): free space there or set "
        "TMPDIR to a folder of yours with room (the run never falls back to another folder)"
    ]


def test_a_private_folder_inside_a_needed_path_is_hidden_whatever_holds_it(tmp_path: Path) -> None:
    """Attack: the run's work folder lies inside the checkout (which the jail binds for the runner) while a
    folder above the checkout is private too; a home folder named as a needed path is never bound."""
    work = REPO_ROOT / ".qnn" / "a-work-folder"
    argv = jail.host_binds(
        tmp_path / "device" / "root", {"PYTHONPATH": f"{REPO_ROOT}:{Path.home()}"}, [REPO_ROOT.parent, work]
    )
    binds = [argv[index + 1] for index, word in enumerate(argv) if word == "--ro-bind"]
    hidden = [argv[index + 1] for index, word in enumerate(argv) if word == "--tmpfs"]
    assert str(REPO_ROOT) in binds and str(work) in hidden and str(REPO_ROOT.parent) not in hidden + binds
    assert str(Path.home()) not in binds and "/" not in binds
