"""Device shells in a bubblewrap jail: the sandbox is the device's file system, the host is read-only.

An emulated device runs its commands with the host's /bin/sh. Without a jail a command can write wherever
the suite's user can; in the jail (bwrap: new user, mount, net, ipc and uts namespaces, all
capabilities dropped, no /proc) the device's top directories are the sandbox's, bound read-write at /data, /sdcard,
/system and /vendor, and every other host directory is bound read-only at its own path, so the venv, the
QNN libraries and the runner socket are still there. Measured on the CI machine: `bwrap --unshare-all` works
as root and as an unprivileged user (Debian package bubblewrap); where it does not, adbd falls back to
harness.emulator.shell_paths (quote-proof path rewriting and refusal of host paths), which it says in its log.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.emulator.device_fs import DEVICE_TOP_DIRS

# Host entries the jail gets fresh (proc, dev) or never sees; everything else is bound read-only.
NOT_FROM_HOST = {"proc", "dev", "lost+found", *DEVICE_TOP_DIRS}
PROBE_TIMEOUT_S = 10


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def jail_argv(root: Path, argv: list[str], cwd: str, writable: tuple[Path, ...] = ()) -> list[str]:
    """bwrap arguments that run `argv` in `cwd` (a device path) with `root` as the device's file system.

    writable: host directories that stay writable at their own paths (none for device shells)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap is not installed")
    # No pid namespace: a device command may outlive its shell (`nohup x &`), as on a phone, and dies with
    # the device (launcher.kill_sandbox_processes). Without one no /proc can be mounted, and the host's
    # is not bound: its /proc/PID/root would lead back to the host's writable file system.
    command = [bwrap, "--unshare-user-try", "--unshare-ipc", "--unshare-net", "--unshare-uts",
               "--unshare-cgroup-try", "--die-with-parent", "--cap-drop", "ALL"]
    for name in sorted(os.listdir("/")):
        host = Path("/", name)
        if name in NOT_FROM_HOST:
            continue
        if host.is_symlink():
            command += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            command += ["--ro-bind", str(host), str(host)]
    command += ["--dev", "/dev"]
    for name in DEVICE_TOP_DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
        command += ["--bind", str(root / name), f"/{name}"]
    for directory in writable:
        command += ["--bind", str(directory), str(directory)]
    return command + ["--chdir", cwd, "--", *argv]


@functools.cache
def unavailable_reason() -> str | None:
    """None when device shells can be jailed here; otherwise why not (said once in the device's log)."""
    if bwrap_path() is None:
        return "bwrap is not installed (Debian package bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="qnnsuite-jail-probe-") as scratch:
        root = Path(scratch)
        try:
            probe = subprocess.run(jail_argv(root, ["/bin/sh", "-c", "touch /data/probe"], "/data"),
                                   capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap did not run ({error})"
        if probe.returncode != 0 or not (root / "data" / "probe").exists():
            return f"bwrap failed here ({probe.stderr.strip()[:200] or f'exit {probe.returncode}'})"
    return None
