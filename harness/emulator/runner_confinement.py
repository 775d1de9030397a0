"""What the emulated device's runner server runs: host_runner, for requests that stay inside the device.

The server runs on the host, outside the device's jail, started by the launcher with ANDROID_ROOT_SANDBOX:
a device command that talks to the server's socket itself must not make the host-side runner read, write or
load the host's files. So, in each request's child before the runner starts:
- its files (program, input list and the inputs it names, output folder, fault switches) must be named inside
  that device's sandbox (the sandbox is read when the server starts, never from a request; refused with one
  line otherwise), and each is then opened component by component from the sandbox's directory descriptor
  without following any link, and handed to the runner as /proc/self/fd/N: a folder swapped for a symlink
  after the check (issue 29) finds the runner holding the real one, and a link in its place is an error;
- its environment is the server's own (the toolchain's, read at start) plus the REQUEST_VARIABLES alone: a
  request that names a library to load (QNNSUITE_REAL_QNNHTP, LD_PRELOAD, ...) changes nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from harness.emulator import host_runner
from harness.process.fork_server import exit_if_qnn_libraries_mapped

REFUSED_EXIT = 126  # what a shell answers for a command it will not run
SANDBOX_ENV = "ANDROID_ROOT_SANDBOX"
FAULTS_VARIABLE = "EMULATED_FAULTS_FILE"
# The only variables a request's own environment sets in its child, and why: the rest is the server's.
REQUEST_VARIABLES = {
    "EMULATED_STORAGE_FULL": "adbd's storage-full fault switch, set per command",
    FAULTS_VARIABLE: "the device's fault switches, a file in the sandbox (opened as the other files)",
}


class Escape(ValueError):
    """A request's file that is not inside the sandbox, or reached through a link."""


def paths_outside(argv: list[str], root: Path) -> list[str]:
    """The paths a runner invocation would touch outside the device sandbox `root` (relative ones from cwd)."""
    arguments = host_runner.parse_args(argv)
    named = [os.getcwd(), arguments.model_path, arguments.input_list_path, arguments.output_folder_path]
    named += [arguments.etdump_path] if arguments.etdump_path else []
    try:
        named += Path(arguments.input_list_path).read_text().split()
    except (OSError, UnicodeError):
        pass  # the runner reports a missing list itself
    return [path for path in named if not Path(path).resolve().is_relative_to(root)]


def open_beneath(root_fd: int, root: Path, path: str, cwd: str, directory: bool = False) -> int:
    """A descriptor of `path` (relative ones from `cwd`), opened from the sandbox's descriptor one component
    at a time with O_NOFOLLOW, so no link, present or swapped in later, leads out; `directory`: a folder,
    created where missing. Escape names the path otherwise."""
    lexical = Path(os.path.normpath(os.path.join(cwd, path)))
    if not lexical.is_relative_to(root):
        raise Escape(f"{path} is outside this device's sandbox {root}")
    parts = lexical.relative_to(root).parts
    fd = os.dup(root_fd)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if directory:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if not last or directory else 0)
            following = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = following
        return fd
    except OSError as error:
        os.close(fd)
        raise Escape(
            f"{path}: {error.strerror} (a link on the way, or not there); a runner's files are "
            f"opened inside the sandbox without following links"
        ) from error


def pinned(argv: list[str], root: Path, root_fd: int) -> list[str]:
    """argv with every file the runner reads or writes replaced by /proc/self/fd/N of its descriptor opened
    beneath the sandbox; the input list becomes a memfd naming the inputs so. Escape if one cannot be."""
    arguments = host_runner.parse_args(argv)
    cwd = os.getcwd()

    def fd_path(fd: int) -> str:
        return f"/proc/self/fd/{fd}"

    model = open_beneath(root_fd, root, arguments.model_path, cwd)
    output = open_beneath(root_fd, root, arguments.output_folder_path, cwd, directory=True)
    with os.fdopen(open_beneath(root_fd, root, arguments.input_list_path, cwd), "r", errors="replace") as listing:
        lines = listing.read().splitlines()
    pinned_lines = [
        " ".join(fd_path(open_beneath(root_fd, root, name, cwd)) for name in line.split())
        for line in lines
        if line.strip()
    ]
    input_list = os.memfd_create("input_list", os.MFD_CLOEXEC)
    os.write(input_list, "".join(f"{line}\n" for line in pinned_lines).encode())
    replaced = {
        "--model_path": fd_path(model),
        "--output_folder_path": fd_path(output),
        "--input_list_path": fd_path(input_list),
    }
    result, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        name = word.partition("=")[0]
        if name in replaced:
            result += [name, replaced[name]]
            skip = "=" not in word
            continue
        result.append(word)
    return result


def request_environment(request: dict[str, str], server: dict[str, str], root: Path, root_fd: int) -> dict[str, str]:
    """The child's environment: the server's, plus the request's REQUEST_VARIABLES (its faults file pinned as
    the runner's files are, or dropped if it is not in the sandbox)."""
    env = dict(server)
    for name in REQUEST_VARIABLES:
        env.pop(name, None)
        if name in request:
            env[name] = request[name]
    if FAULTS_VARIABLE in env:
        try:
            env[FAULTS_VARIABLE] = f"/proc/self/fd/{open_beneath(root_fd, root, env[FAULTS_VARIABLE], '/')}"
        except Escape:
            del env[FAULTS_VARIABLE]
    return env


def confined(root: Path | None, server_env: dict[str, str] | None = None) -> Callable[[list[str]], object]:
    """host_runner.main for requests that stay inside `root` (None: a server of no device, unconfined), in
    the environment request_environment makes from the server's start-time `server_env`."""

    def entry(argv: list[str]) -> object:
        if root is None:
            return host_runner.main(argv)
        outside = paths_outside(argv, root)
        try:
            if outside:
                raise Escape(f"{', '.join(outside[:3])} is outside this device's sandbox {root}")
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            env = request_environment(dict(os.environ), server_env or {}, root, root_fd)
            argv = pinned(argv, root, root_fd)
        except (Escape, OSError, SystemExit) as error:
            print(f"runner server: refused, {error}", file=sys.stderr, flush=True)
            return REFUSED_EXIT
        os.environ.clear()
        os.environ.update(env)
        return host_runner.main(argv)

    return entry


def server_entry() -> Callable[[list[str]], object]:
    """Called once when the server starts: the entry point for this device's sandbox, with ExecuTorch's runtime
    extension imported for every run and the server's environment kept for every child."""
    host_runner.runtime()
    exit_if_qnn_libraries_mapped("importing ExecuTorch's runtime")  # as after the service's preloaded imports
    root = os.environ.get(SANDBOX_ENV)
    return confined(Path(root).resolve() if root else None, dict(os.environ))
