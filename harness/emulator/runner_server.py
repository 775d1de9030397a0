"""A runner server per emulated device: torch and executorch imported once, a fresh forked child per run.

    python -m harness.emulator.runner_server --socket PATH

Why: a fresh `python -m harness.emulator.host_runner` spends 4-5 s importing torch and executorch before it
runs anything. This is harness.fork_server with host_runner.main as the entry point: each connection from
runner_client.py forks a child that runs one host_runner invocation with the client's argv, cwd,
environment and descriptors (see harness.fork_server for what a child inherits and why each run still
loads its own QNN backend).

Wiring, one server per emulated device (start_server returns once the socket accepts runs):

    server = start_server(device_dir / "runner.sock", device_env)          # log: runner.sock.log
    device_env["QNNSUITE_RUNNER_SOCKET"] = str(device_dir / "runner.sock")  # for that device's commands
    ...
    fork_server.stop_server(server)

Start it with the device commands' environment: the dynamic loader finds QNN through the LD_LIBRARY_PATH
the server started with.

Started by the launcher with ANDROID_ROOT_SANDBOX, a server runs only requests whose cwd and files (program,
input list and the inputs it names, output folder) are inside that device's sandbox: a device command
that talks to the socket itself cannot make the host-side runner read or write the host's files.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from harness import fork_server
from harness.emulator import host_runner

REFUSED_EXIT = 126  # what a shell answers for a command it will not run

# Imported by the server, never by the launcher that only calls start_server/stop_server.
PRELOADED_MODULES = ("numpy", "torch", "executorch.extension.pybindings.portable_lib")


def spawn_server(socket_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a device's runner server without waiting (fork_server.wait_until_serving waits)."""
    return fork_server.spawn_server(__name__, socket_path, env)


def start_server(socket_path: Path, env: dict[str, str],
                 timeout_s: float = fork_server.START_TIMEOUT_S) -> subprocess.Popen[bytes]:
    """Start a device's runner server; return once it accepts runs. Its log is PATH.log."""
    return fork_server.start_server(__name__, socket_path, env, timeout_s)


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


def confined(root: Path | None) -> Callable[[list[str]], object]:
    """The server's entry point: host_runner.main, for requests that stay inside the sandbox."""
    def entry(argv: list[str]) -> object:
        outside = paths_outside(argv, root) if root is not None else []
        if outside:
            print(f"runner server: refused, {', '.join(outside[:3])} is outside this device's sandbox {root}",
                  file=sys.stderr, flush=True)
            return REFUSED_EXIT
        return host_runner.main(argv)
    return entry


def main() -> None:
    root = os.environ.get("ANDROID_ROOT_SANDBOX")
    fork_server.main(__doc__.splitlines()[0], PRELOADED_MODULES, confined(Path(root).resolve() if root else None),
                     host_runner.__file__)


if __name__ == "__main__":
    main()
