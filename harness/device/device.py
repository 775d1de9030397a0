"""One Android device over a real adb server: its identity, its workspaces, push/run/pull and its lock.

Modelled on Mobly's device controller: one object owns the device's lifecycle (state checks, SoC
detection, workspaces it created and removes, one user at a time) so that suites and fixtures never
speak adb themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import re
import shlex
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import adbutils
from filelock import FileLock

from harness.device.adb import AdbServer
from harness.device.sync import SyncRefused, SyncSession, check_sizes
from harness.qnn import soc as soc_table
from harness.user_state import UnsafeStateDir, open_append, state_dir

WORKSPACE_ROOT = "/data/local/tmp/qnnsuite"
# Where phones say which SoC they have, most direct first: Android 12+ sets ro.soc.model; some vendors only
# ro.hardware.chipname; older builds only name the platform (codename, harness/qnn/soc.py); a few
# ro.hardware; the kernel's soc0 driver names the part (or the codename).
SOC_PROPERTIES = ("ro.soc.model", "ro.hardware.chipname", "ro.board.platform", "ro.hardware")
SOC_MACHINE_FILE = "/sys/devices/soc0/machine"
KILLED_BY_TIMEOUT = (124, 137)  # toybox/coreutils `timeout`: TERM -> 124, -s KILL -> 137
# A run that ends this far into its timeout (or later) was ended by it; the shell's start and adb's round trip
# make the measured duration a little shorter than the device-side one.
TIMEOUT_REACHED_FRACTION = 0.9
ADB_GRACE_S = 30  # host-side adb timeout beyond the device-side one, in case the device hangs
PROBE_TIMEOUT_S = 10.0  # after a command times out: does the device answer at all?
TRANSFER_TIMEOUT_S = 120  # no answer for this long in a push or pull: the device is gone
# A command or transfer still running after WATCH_AFTER_S has its device probed every WATCH_INTERVAL_S; after
# WATCH_MISSES unanswered probes in a row the device is frozen (it keeps its link but answers nothing, e.g.
# SIGSTOPped or wedged): the command is cut and the device lost within about 5 + 2 x 10 s, not at its timeout.
# Two misses, not one, so a machine too loaded to answer one probe in 10 s does not lose a healthy device.
WATCH_AFTER_S = 5.0
WATCH_INTERVAL_S = 5.0
WATCH_MISSES = 2


class DeviceError(RuntimeError):
    """A device problem worded as one line that names the device, the problem and the fix."""


class DeviceLost(DeviceError):
    """The device stopped answering (disconnected, rebooted, adb connection dropped)."""

    label: str | None = None  # the pool's name of the device (server/serial), when it was lost being prepared


class DeviceFrozen(DeviceLost):
    """The device keeps its link but answered none of the watchdog's probes: no reconnect is worth waiting for."""


@dataclass(frozen=True)
class RunResult:
    command: str
    exit_code: int
    output: str  # stdout and stderr as they arrived
    duration_s: float
    # stderr alone: with shell v2 the two streams travel apart, so which arrived last varies from run to run
    stderr: str = ""

    def timed_out(self, timeout_s: float) -> bool:
        """Killed by the device-side timeout: its exit code, and not well before the timeout was up (an exit
        137 after a fraction of it is a SIGKILL from elsewhere, e.g. Android's low-memory killer)."""
        return self.exit_code in KILLED_BY_TIMEOUT and self.duration_s >= timeout_s * TIMEOUT_REACHED_FRACTION


def lock_dir() -> Path:
    """Fixed per user, so two separate pytest runs serialise on a device too; private (harness.user_state)."""
    return state_dir("locks", os.environ.get("QNNSUITE_LOCK_DIR"))


def shell_line(argv: list[str]) -> str:
    """A device command line from its words: each one quoted, so no word is ever read as shell syntax."""
    return shlex.join(argv)


def device_label(server: str, serial: str) -> str:
    """How reports, locks and the summary name a device: its adb server and serial (serials repeat across hosts)."""
    return f"{server}/{serial}"


def device_display(label: str, soc: str, emulated: bool) -> str:
    """How a person reads a device (terminal lines, summary.md, the page): `emulated SM8650 (127.0.0.1:45551)`
    for an emulated device, a phone's serial. device_label's full address stays in report.json, locks and the
    pool: a private server's is a socket path of some 100 characters that is gone when the run ends."""
    serial = label.rsplit("/", 1)[-1]
    return f"emulated {soc} ({serial})" if emulated else serial


def devices_display(labels: str, soc: str, emulated: bool) -> str:
    """device_display of each of a comma-separated list of labels (report.json's environment device_serial)."""
    return ", ".join(device_display(label.strip(), soc, emulated) for label in labels.split(",") if label.strip())


def safe_pull_name(name: str) -> bool:
    """Whether a name a device listed can be a file in the local pull folder (not `..`, no `/`, no NUL)."""
    return name not in ("", ".", "..") and not any(char in name for char in "/\\\0")


class ReportsIdentity(Protocol):
    serial: str

    def getprop(self, name: str) -> str: ...

    def read_text(self, path: str) -> str: ...


def detect_soc(device: ReportsIdentity) -> str:
    """The SoC from the first source that names exactly one SoC of the table; otherwise one line listing
    everything that was read."""
    seen = []
    for source, read in [*((name, device.getprop) for name in SOC_PROPERTIES), (SOC_MACHINE_FILE, device.read_text)]:
        value = read(source)
        seen.append(f"{source}={value!r}")
        named = soc_table.named_by(value) if value else ()
        if len(named) == 1:
            return named[0]
    raise DeviceError(
        f"device {device.serial}: cannot tell its SoC; it reports {', '.join(seen)}, and none of these "
        f"names exactly one SoC the ExecuTorch under test knows: report these values (the codenames "
        f"are in harness/qnn/soc.py)"
    )


class Device:
    def __init__(self, serial: str, client: adbutils.AdbClient) -> None:
        self.serial = serial
        self.server = (getattr(client, "server", None) or AdbServer(client.host, client.port)).address
        self.label = device_label(self.server, serial)
        self._client = client
        self._adb = client.device(serial)
        self._workspaces: set[str] = set()

    def __repr__(self) -> str:
        return f"Device({self.serial})"

    # --- identity -------------------------------------------------------------------------------
    def getprop(self, name: str) -> str:
        return self.shell(shell_line(["getprop", name]), timeout_s=30).output.strip()

    def read_text(self, path: str) -> str:
        """A small device file's text ("" when it cannot be read)."""
        result = self.shell(f"cat {shlex.quote(path)} 2>/dev/null", timeout_s=30)
        return result.output.strip() if result.exit_code == 0 else ""

    @cached_property
    def soc(self) -> str:
        return detect_soc(self)

    @cached_property
    def htp_arch(self) -> int:
        return soc_table.lookup(self.soc).htp_arch

    @cached_property
    def abi(self) -> str:
        return self.getprop("ro.product.cpu.abi")

    @cached_property
    def model(self) -> str:
        return self.getprop("ro.product.model")

    # --- commands -------------------------------------------------------------------------------
    def answers(self) -> bool:
        """Whether the device still runs a trivial command, within PROBE_TIMEOUT_S."""
        try:
            return self._adb.shell2("echo ok", timeout=PROBE_TIMEOUT_S, v2=True).output.strip() == "ok"
        except (adbutils.AdbError, adbutils.AdbTimeout, OSError, EOFError):
            return False

    @contextlib.contextmanager
    def _watchdog(self, doing: str) -> Iterator[None]:
        """Probe the device from another thread while this one blocks on it; a frozen device is lost at once.

        The probes use their own connections; the watched thread's connections are shut down when the device
        stops answering, which ends its blocking read, and DeviceLost replaces whatever that read raised."""
        if not hasattr(self._client, "opened_connections"):  # a plain adbutils client: the timeouts alone bound it
            yield
            return
        done, frozen = threading.Event(), threading.Event()
        with self._client.opened_connections() as sockets:

            def watch() -> None:
                if done.wait(WATCH_AFTER_S):
                    return
                misses = 0
                while not done.is_set():
                    misses = 0 if self.answers() else misses + 1
                    if misses >= WATCH_MISSES and not done.is_set():
                        frozen.set()
                        for sock in list(sockets):
                            with contextlib.suppress(OSError):
                                sock.shutdown(socket.SHUT_RDWR)
                        return
                    done.wait(WATCH_INTERVAL_S if misses == 0 else 0)

            watcher = threading.Thread(target=watch, name=f"watchdog {self.serial}", daemon=True)
            watcher.start()
            try:
                yield
            except Exception as error:
                if frozen.is_set():
                    raise self._frozen(doing) from error
                raise
            finally:
                done.set()  # not joined: a probe under way ends by its own timeout, and the thread with it
            if frozen.is_set():  # the cut read ended as if the command had finished: its result is not one
                raise self._frozen(doing)

    def _frozen(self, doing: str) -> DeviceFrozen:
        return DeviceFrozen(
            f"device {self.serial} stopped answering while {doing}: {WATCH_MISSES} probes (`echo ok`) "
            f"got nothing in {PROBE_TIMEOUT_S:.0f} s each: check it (`adb -s {self.serial} shell echo ok`)"
        )

    def shell(self, command: str, timeout_s: float = 60) -> RunResult:
        started = time.perf_counter()
        try:
            with self._watchdog(f"`{command[:80]}` ran"):
                result = self._adb.shell2(command, timeout=timeout_s, v2=True)
        except DeviceLost:
            raise
        except adbutils.AdbTimeout as error:
            if not self.answers():  # a device that keeps its link but is frozen must not cost every case a timeout
                raise DeviceLost(
                    f"device {self.serial} stopped answering: `{command[:80]}` got nothing in "
                    f"{timeout_s:.0f} s and `echo ok` nothing in {PROBE_TIMEOUT_S:.0f} s: check it "
                    f"(`adb -s {self.serial} shell echo ok`)"
                ) from error
            raise DeviceError(f"device {self.serial}: `{command[:80]}` did not answer in {timeout_s:.0f} s") from error
        except (adbutils.AdbError, OSError, EOFError) as error:
            what = command.split("&&")[-1].strip()[:60]
            raise DeviceLost(
                f"device {self.serial} lost during `{what}` ({error}): check the cable/connection and `adb devices`"
            ) from error
        return RunResult(command, result.returncode, result.output, time.perf_counter() - started, result.stderr)

    def run(
        self,
        argv: list[str],
        cwd: str,
        timeout_s: float,
        env: dict[str, str] | None = None,
        prepend: dict[str, str] | None = None,
        first: str = "",
    ) -> RunResult:
        """Run argv with a device-side kill after timeout_s (a hung runner must not outlive its case).

        env: variables set to these values; prepend: path lists put in front of the device's own value;
        first: a command line (quoted by the caller) run in cwd before, in the same shell; argv runs only
        if it succeeds (a case's preparation costs no round trip of its own)."""
        for key in [*(env or {}), *(prepend or {})]:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise DeviceError(f"device {self.serial}: {key!r} cannot be an environment variable name")
        assignments = [f"{key}={shlex.quote(value)}" for key, value in (env or {}).items()]
        assignments += [f'{key}={shlex.quote(value)}"${{{key}:+:${key}}}"' for key, value in (prepend or {}).items()]
        line = " ".join(
            [
                f"cd {shlex.quote(cwd)} &&",
                *([f"{first} &&"] if first else []),
                *assignments,
                shell_line(["timeout", "-s", "KILL", str(int(timeout_s)), *argv]),
            ]
        )
        return self.shell(line, timeout_s=timeout_s + ADB_GRACE_S)

    # --- files ----------------------------------------------------------------------------------
    def remote_sha256(self, remote: str) -> str | None:
        result = self.shell(f"sha256sum {shlex.quote(remote)} 2>/dev/null", timeout_s=120)
        digest = result.output.split()[0] if result.exit_code == 0 and result.output.strip() else ""
        return digest if re.fullmatch(r"[0-9a-f]{64}", digest) else None

    def push(self, local: Path, remote: str, mode: int = 0o644) -> bool:
        """Push unless the device already has these bytes; True when bytes were transferred.
        (Files going into a folder that was just emptied need no hash: push_files.)"""
        if self.remote_sha256(remote) == hashlib.sha256(local.read_bytes()).hexdigest():
            return False
        self.push_files([(local, remote)], mode)
        return True

    def push_files(self, files: list[tuple[Path, str]], mode: int = 0o644) -> int:
        """Push (local, remote) pairs over one sync session; returns the bytes sent."""
        sent = 0
        with self._sync("pushing") as session:
            for local, remote in files:
                try:
                    sent += session.push(local, remote, mode)
                except SyncRefused as refused:
                    self._explain_failed_push(local, remote, refused)
        return sent

    @contextlib.contextmanager
    def _sync(self, doing: str) -> Iterator[SyncSession]:
        """A sync session (harness.device.sync: many files, one connection) whose failures read as one line."""
        session = None
        try:
            with self._watchdog(doing + " files"):
                session = SyncSession(self._adb, TRANSFER_TIMEOUT_S)
                with session:
                    yield session
        except DeviceLost:
            raise
        except SyncRefused as refused:
            raise DeviceError(
                f"device {self.serial} refused {doing} {session.current if session else ''} ({refused}): "
                f"check that the path exists and is readable"
            ) from refused
        except (adbutils.AdbError, OSError, EOFError) as error:
            name = posixpath.basename(session.current) if session and session.current else "files"
            raise DeviceLost(
                f"device {self.serial} lost while {doing} {name} ({error}): check the connection and `adb devices`"
            ) from error

    def _explain_failed_push(self, local: Path, remote: str, error: Exception) -> None:
        """adb reports a refused push as a bare FAIL; tell a full disk from a lost device."""
        try:
            free = self.free_kb(remote.rsplit("/", 1)[0] or "/")
        except DeviceError:
            raise DeviceLost(
                f"device {self.serial} lost while pushing {local.name} ({error}): "
                f"check the connection and `adb devices`"
            ) from error
        size_kb = local.stat().st_size // 1024 + 1
        if free is not None and free < size_kb:
            raise DeviceError(
                f"device {self.serial}: no space left on device pushing {local.name} ({size_kb} KB, "
                f"{free} KB free): free space under {WORKSPACE_ROOT}"
            ) from error
        raise DeviceError(
            f"device {self.serial} refused the push of {local.name} to {remote} ({error}): "
            f"check permissions and `adb -s {self.serial} shell df {WORKSPACE_ROOT}`"
        ) from error

    def free_kb(self, remote_dir: str) -> int | None:
        """Available KB where remote_dir lives, from the device's df (None if unreadable)."""
        result = self.shell(f"df -k {shlex.quote(remote_dir)} 2>/dev/null | tail -n 1", timeout_s=30)
        fields = result.output.split()
        return int(fields[3]) if len(fields) >= 4 and fields[3].isdigit() else None

    def pull(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        with self._sync("pulling") as session:
            session.pull(remote, local)

    def pull_files(self, remote_dir: str, local_dir: Path, limits: dict[str, int] | None = None) -> list[str]:
        """Pull every regular file of a device directory over one sync session; returns their names.
        limits: only these names, each at most so many bytes (sync.Oversized, before any is pulled)."""
        local_dir.mkdir(parents=True, exist_ok=True)
        with self._sync("pulling") as session:
            sizes = session.list_sizes(remote_dir)
            if limits is not None:
                sizes = {name: size for name, size in sizes.items() if name in limits}
                check_sizes(sizes, limits)
            for name in sizes:
                if not safe_pull_name(name):
                    raise DeviceError(
                        f"device {self.serial} listed a file named {name!r} in {remote_dir}, which "
                        f"would land outside {local_dir}: nothing more is pulled; check the device"
                    )
                session.pull(f"{remote_dir}/{name}", local_dir / name, limits[name] if limits is not None else None)
        return list(sizes)

    def list_dir(self, remote: str) -> list[str]:
        result = self.shell(f"ls {shlex.quote(remote)} 2>/dev/null", timeout_s=60)
        return result.output.split() if result.exit_code == 0 else []

    # --- workspaces and exclusive use -----------------------------------------------------------
    def workspace(self, name: str) -> str:
        path = f"{WORKSPACE_ROOT}/{name}"
        result = self.shell(f"mkdir -p {shlex.quote(path)}")
        if result.exit_code != 0:
            raise DeviceError(
                f"device {self.serial}: cannot create {path} ({result.output.strip()}): "
                f"check free space and permissions under {WORKSPACE_ROOT}"
            )
        self._workspaces.add(path)
        return path

    def remove_workspaces(self) -> list[str]:
        """Remove what this object created; returns what could not be removed (device gone)."""
        left = []
        for path in sorted(self._workspaces):
            try:
                self.shell(f"rm -rf {shlex.quote(path)}")
            except DeviceError:
                left.append(path)
        self._workspaces.clear()
        return left

    @property
    def workspaces(self) -> list[str]:
        return sorted(self._workspaces)

    @contextlib.contextmanager
    def exclusive(self, holder: str, wait: bool = True) -> Iterator[None]:
        """One user of this device at a time, across xdist workers and separate pytest runs.

        With wait=False a busy device raises filelock.Timeout at once. Each hold is appended to
        <lock dir>/<server>_<port>_<serial>.uses.jsonl so overlap can be measured (the server is part of the
        name: two hosts' servers may each have a device of one serial).
        """
        try:
            directory = lock_dir()
        except UnsafeStateDir as unsafe:
            raise DeviceError(f"device {self.serial}: cannot lock it: {unsafe}") from unsafe
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.label)
        with FileLock(str(directory / f"{safe}.lock"), timeout=-1 if wait else 0):
            started = time.time()
            try:
                yield
            finally:
                with open_append(directory / f"{safe}.uses.jsonl") as log:
                    log.write(
                        json.dumps({"holder": holder, "pid": os.getpid(), "start": started, "end": time.time()}) + "\n"
                    )
