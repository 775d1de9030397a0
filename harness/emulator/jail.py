"""Device shells in a bubblewrap jail: the sandbox is the device's file system; of the host, only what a
shell and the runner need, read-only.

An emulated device runs its commands with the host's /bin/sh. Without a jail a command can write wherever
the suite's user can; in the jail (bwrap: new user, pid, mount, net, ipc and uts namespaces, a new session,
all capabilities dropped) the device's top directories are the sandbox's, bound read-write at /data,
/sdcard, /system and /vendor, and of the host only this is there, read-only:
- the system folders a shell and a Python need (SYSTEM_DIRS, the few files of /etc in ETC_FILES);
- the paths the device's commands run from: its Python, the checkout, and the folders its environment names
  (NEEDED_PATH_VARIABLES: the runner's Python, the QNN libraries and where their links lead), never `/` or a
  folder that holds a home folder;
- the device's own folder (its properties and faults).
Nothing else of the host: no home folder, no /var, /tmp or /run (unix sockets there, an ssh agent, a gpg
agent, docker, accept connections through a read-only mount), and the private folders the launcher names
(the run's work folder, with its lowering server's and adb server's sockets and the adb key; the user's state
folder; the temporary folder) are hidden by an empty tmpfs even when a needed path holds them, wherever
TMPDIR put them. Not /proc (its /proc/PID/root would lead back to the host's writable file system; only
/proc/cpuinfo is there, a file that leads nowhere). Each command has a pid namespace of its own: it sees and
signals only its own processes, and when its shell ends, or the device dies (--die-with-parent), whatever
it started there dies with it (`setsid sleep 1000 &` included).
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
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.emulator.device_fs import DEVICE_TOP_DIRS
from harness.paths import REPO_ROOT

# Host top directories a shell and the runner need, bound read-only (or as the links they are: merged /usr).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Of /etc, only what the loader, a shell's `id` and Python read: the rest (ssh host keys, shadow, a CI's
# credentials) is the host's private state.
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ld.so.preload",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "alternatives",
    "os-release",
)
# The devices a shell needs; bound one by one (bwrap's --dev, a fresh devtmpfs, cost 8 ms per command).
DEVICE_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# The only /proc files a device command sees, each bound read-only by itself: executorch's thread pool
# (cpuinfo) reads /proc/cpuinfo, and without it the compiled runner's first op outside the delegate crashed
# (SIGSEGV after "cpuinfo initialization failed": measured on ring_gather_written, every quantized dtype).
# A file of /proc, unlike /proc itself, leads nowhere back to the host's file system.
PROC_FILES = ("/proc/cpuinfo",)
# Variables naming host paths (files, folders, search paths) a device command reads.
NEEDED_PATH_VARIABLES = (
    "QNNSUITE_PYTHON",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "QNN_SDK_ROOT",
    "QNNSUITE_EMULATED_PHONE",
)
# Of those, the library folders whose links (the QNN overlay's, to the SDK's libraries) are followed one step.
LIBRARY_VARIABLES = ("LD_LIBRARY_PATH", "QNN_SDK_ROOT", "QNNSUITE_EMULATED_PHONE")
PROBE_TIMEOUT_S = 10


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths none of the others holds, shortest first."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(parent) for parent in kept):
            kept.append(path)
    return kept


def _home_folders() -> list[Path]:
    """Folders that hold users' private files (keys, agent sockets): never bound whole, nor a folder above them."""
    homes = {Path("/root"), Path("/home"), Path.home()}
    return [home for home in homes if home.is_absolute()]


def default_private_dirs() -> list[Path]:
    """Host folders of this user's a device must never see, whatever a needed path holds: the temporary
    folder (every run's work folder by default) and the suite's state folders (harness/user_state.py)."""
    private = [Path(tempfile.gettempdir()), Path(tempfile.gettempdir()) / f"qnnsuite-{os.getuid()}"]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        private.append(Path(runtime))
    return private


def _link_targets(folder: Path) -> list[Path]:
    """Where the links directly in `folder` lead (the QNN overlay links each library to the SDK's)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    return [Path(entry.path).resolve().parent for entry in entries if entry.is_symlink()]


@functools.lru_cache(maxsize=16)
def _needed(named: tuple[tuple[str, str], ...]) -> tuple[Path, ...]:
    """Host paths a device command reads (the checkout's harness, the Python, the paths `named`: variable,
    entry), outermost only, none of them `/` or a folder holding a home folder (cached: every command asks
    with the same)."""
    candidates = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent, REPO_ROOT]
    for variable, entry in named:
        path = Path(entry)
        if not path.is_absolute() or not path.exists():
            continue
        folder = path if path.is_dir() else path.parent
        if folder.name == "bin" and (folder.parent / "pyvenv.cfg").exists():  # a venv's Python: the whole venv
            folder = folder.parent
        target = path.resolve()  # a Python's binary is a link into its base installation
        candidates += [folder, target if target.is_dir() else target.parent]
        if variable in LIBRARY_VARIABLES:
            candidates += [*_link_targets(folder), *_link_targets(folder / "lib")]
    homes = _home_folders()
    usable = [
        shown  # as named (a link on the way stays a way in) and as resolved
        for path in candidates
        for shown in (Path(os.path.abspath(path)), path.resolve())
        if len(shown.parts) > 1
        and shown.parts[1] not in SYSTEM_DIRS  # there already
        and shown.exists()
        and not any(home.is_relative_to(shown) for home in homes)
    ]
    return tuple(_outermost(usable))


def host_binds(root: Path, env: dict[str, str], private: Sequence[Path]) -> list[str]:
    """bwrap arguments for the host paths a device command needs, with the private folders among them hidden."""
    named = tuple(
        (name, entry)
        for name in NEEDED_PATH_VARIABLES
        for entry in env.get(name, "").split(":")
        if entry.startswith("/")
    )
    needed = _needed(named)
    command: list[str] = []
    for path in needed:
        command += ["--ro-bind", str(path), str(path)]
    hidden = {
        shown
        for folder in private
        if Path(folder).is_absolute()
        for shown in (Path(os.path.abspath(folder)), Path(os.path.realpath(folder)))
        if any(shown.is_relative_to(path) for path in needed)
    }
    for folder in _outermost(hidden):
        command += ["--tmpfs", str(folder)]
    return command + ["--ro-bind", str(root.parent), str(root.parent)]  # the device's own folder


def jail_argv(root: Path, argv: list[str], cwd: str, env: dict[str, str], private: Sequence[Path] = ()) -> list[str]:
    """bwrap arguments that run `argv` in `cwd` (a device path) with `root` as the device's file system;
    `private`: host folders hidden from it even where a needed path holds them (with default_private_dirs)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap is not installed")
    command = [
        bwrap,
        "--unshare-user-try",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    for name in SYSTEM_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            command += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            command += ["--ro-bind", str(host), str(host)]
    for name in ETC_FILES:
        if os.path.lexists(f"/etc/{name}"):
            command += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for node in DEVICE_NODES:
        command += ["--dev-bind", node, node]
    for name in PROC_FILES:
        if os.path.exists(name):
            command += ["--ro-bind", name, name]
    command += ["--tmpfs", "/tmp", "--dir", "/run"]
    command += host_binds(root.resolve(), env, [*private, *default_private_dirs()])
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
        root = Path(scratch) / "device" / "root"
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
