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
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness import fork_server
from harness.emulator import host_runner

# Imported by the server, never by the launcher that only calls start_server/stop_server.
PRELOADED_MODULES = ("numpy", "torch", "executorch.extension.pybindings.portable_lib")


def spawn_server(socket_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a device's runner server without waiting (fork_server.wait_until_serving waits)."""
    return fork_server.spawn_server(__name__, socket_path, env)


def start_server(socket_path: Path, env: dict[str, str],
                 timeout_s: float = fork_server.START_TIMEOUT_S) -> subprocess.Popen[bytes]:
    """Start a device's runner server; return once it accepts runs. Its log is PATH.log."""
    return fork_server.start_server(__name__, socket_path, env, timeout_s)


def main() -> None:
    fork_server.main(__doc__.splitlines()[0], PRELOADED_MODULES, host_runner.main, host_runner.__file__)


if __name__ == "__main__":
    main()
