"""Device shells in a bubblewrap jail: the sandbox is the device's file system, the host is read-only.

An emulated device runs its commands with the host's /bin/sh. Without a jail a command can write wherever
the suite's user can; in the jail (bwrap: new user, mount, net, ipc and uts namespaces, all capabilities
dropped) the device's top directories are the sandbox's, bound read-write at /data, /sdcard, /system and
/vendor, and the host's other top directories are bound read-only at their own paths, so the venv and the
QNN libraries are still there. Not /proc (its /proc/PID/root would lead back to the host's writable file
system; only /proc/cpuinfo is there, a file that leads nowhere), and neither /run nor /tmp: unix sockets there (an ssh agent, docker, a session bus) accept
connections through a read-only mount, so only the device's own folder (its properties, faults) and
the paths the device's environment names are bound from them.
Measured on the CI machine: bwrap works as root and as an unprivileged user (Debian package bubblewrap);
where it does not, adbd falls back to harness.emulator.shell_paths (quote-proof path rewriting and refusal
of host paths) and says so in its log.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.emulator.device_fs import DEVICE_TOP_DIRS

# Host top directories the jail gets fresh (dev, tmp) or never sees; everything else is bound read-only.
NOT_FROM_HOST = {"proc", "dev", "run", "tmp", "lost+found", *DEVICE_TOP_DIRS}
# The devices a shell needs; bound one by one (bwrap's --dev, a fresh devtmpfs, cost 8 ms per command).
DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# The only /proc files a device command sees, each bound read-only by itself: executorch's thread pool
# (cpuinfo) reads /proc/cpuinfo, and without it the compiled runner's first op outside the delegate crashed
# (SIGSEGV after "cpuinfo initialization failed": measured on ring_gather_written, every quantized dtype).
# A file of /proc, unlike /proc itself, leads nowhere back to the host's file system.
PROC_FILES = ("/proc/cpuinfo",)
# Variables whose paths a device command needs to read even when they lie under /tmp or /run.
NEEDED_PATH_VARIABLES = (
    "QNNSUITE_PYTHON",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "QNN_SDK_ROOT",
    "EMULATED_FAULTS_FILE",
)
PROBE_TIMEOUT_S = 10


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def needed_host_paths(root: Path, env: dict[str, str]) -> list[Path]:
    """Host paths under a hidden top directory that the device reads: its own folder, its Python, and the
    paths named by NEEDED_PATH_VARIABLES (a socket's or a file's folder)."""
    candidates = [root.parent, Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent]
    for name in NEEDED_PATH_VARIABLES:
        for entry in env.get(name, "").split(":"):
            if entry.startswith("/"):
                path = Path(entry)
                candidates.append(path if path.is_dir() else path.parent)
    hidden = [
        path
        for path in candidates  # a folder in them, never all of /tmp or /run
        if len(path.parts) > 2 and path.parts[1] in ("tmp", "run") and path.exists()
    ]
    kept: list[Path] = []
    for path in sorted(set(hidden), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def jail_argv(root: Path, argv: list[str], cwd: str, env: dict[str, str]) -> list[str]:
    """bwrap arguments that run `argv` in `cwd` (a device path) with `root` as the device's file system."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap is not installed")
    # No pid namespace: a device command may outlive its shell (`nohup x &`), as on a phone, and dies with
    # the device (launcher.kill_sandbox_processes); without one no /proc can be mounted.
    command = [
        bwrap,
        "--unshare-user-try",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    for name in sorted(os.listdir("/")):
        host = Path("/", name)
        if name in NOT_FROM_HOST:
            continue
        if host.is_symlink():
            command += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            command += ["--ro-bind", str(host), str(host)]
    for node in DEVICE_NODES:
        command += ["--dev-bind", node, node]
    for name in PROC_FILES:
        if os.path.exists(name):
            command += ["--ro-bind", name, name]
    command += ["--tmpfs", "/tmp", "--dir", "/run"]
    for path in needed_host_paths(root, env):
        command += ["--ro-bind", str(path), str(path)]
    for name in DEVICE_TOP_DIRS:
        (root / name).mkdir(parents=True, exist_ok=True)
        command += ["--bind", str(root / name), f"/{name}"]
    return command + ["--chdir", cwd, "--", *argv]


@functools.cache
def unavailable_reason() -> str | None:
    """None when device shells can be jailed here; otherwise why not (said once in the device's log)."""
    if bwrap_path() is None:
        return "bwrap is not installed (Debian package bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="qnnsuite-jail-probe-") as scratch:
        root = Path(scratch)
        try:
            probe = subprocess.run(
                jail_argv(root, ["/bin/sh", "-c", "touch /data/probe"], "/data", {}),
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap did not run ({error})"
        if probe.returncode != 0 or not (root / "data" / "probe").exists():
            return f"bwrap failed here ({probe.stderr.strip()[:200] or f'exit {probe.returncode}'})"
    return None
