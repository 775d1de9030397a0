"""The emulated device's qnn_executor_runner, fast path: hand the run to this device's runner server.

    python -m harness.emulator.runner_client --model_path M.pte --input_list_path list.txt ...

Importing torch and executorch costs seconds per run; a runner server (runner_server.py) has them imported
and forks a fresh child per run. This client sends the server its argv, cwd, umask, environment and
stdin/stdout/stderr (the descriptors themselves, SCM_RIGHTS), waits for the child and exits with its status
(128+N for a child killed by signal N, as a shell reports it). Being killed closes the connection, which
makes the server kill the child, so `timeout -s KILL` and a closed adb stream end the run as before.
Without $QNNSUITE_RUNNER_SOCKET, or when the server is not there or turns the run down, it execs
`$QNNSUITE_PYTHON -m harness.emulator.host_runner` itself: the same run, only slower.
Start-up cost is what counts here, so only os, sys, socket and json are imported.
"""
from __future__ import annotations

import json
import os
import socket
import sys

SOCKET_ENV = "QNNSUITE_RUNNER_SOCKET"
# One request (argv, cwd, environment) is one SOCK_SEQPACKET message; environments are a few KiB.
MAX_MESSAGE_BYTES = 1 << 20
STD_FDS = (0, 1, 2)
# sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_PATH_BYTES = 107


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for bind/connect and a directory fd to close afterwards (None if there is none).

    A path longer than AF_UNIX allows is reached through /proc/self/fd/<its directory>/<name>, so a socket
    deep inside a pytest tmp directory still works.
    """
    if len(os.fsencode(path)) <= MAX_UNIX_PATH_BYTES:
        return path, None
    directory = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}", directory


def open_std_fds() -> list[int]:
    """Which of 0, 1, 2 are open: a closed one stays closed in the runner, as it would after exec."""
    present = []
    for fd in STD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            continue
        present.append(fd)
    return present


def run_through_server(path: str, argv: list[str]) -> int | None:
    """The runner's exit status, or None when the server did not start the run (the caller runs it itself)."""
    umask = os.umask(0)
    os.umask(umask)
    fds = open_std_fds()
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "umask": umask, "env": dict(os.environ),
                          "fds": fds}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        try:
            address, directory = unix_address(path)
            try:
                connection.connect(address)
            finally:
                if directory is not None:
                    os.close(directory)
            socket.send_fds(connection, [request], fds)
            reply = json.loads(connection.recv(MAX_MESSAGE_BYTES) or "{}")
        except OSError:
            return None
        if "started" not in reply:
            if "refused" in reply:
                print(f"runner_client: runner server turned the run down ({reply['refused']}); running it directly",
                      file=sys.stderr, flush=True)
            return None
        # From here on the run has started: it is never run a second time.
        try:
            status = json.loads(connection.recv(MAX_MESSAGE_BYTES) or "{}").get("status")
        except OSError:
            status = None
    if status is None:
        print(f"runner_client: the runner server at {path} went away during the run (its child is killed with it)",
              file=sys.stderr, flush=True)
        return 1
    return int(status)


def exec_host_runner(argv: list[str]) -> None:
    """Today's slow path: a fresh Python that imports everything and runs host_runner."""
    python = os.environ.get("QNNSUITE_PYTHON") or sys.executable
    os.execv(python, [python, "-m", "harness.emulator.host_runner", *argv])


def main(argv: list[str]) -> None:
    path = os.environ.get(SOCKET_ENV)
    status = run_through_server(path, argv) if path else None
    if status is not None:
        sys.exit(status)
    exec_host_runner(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
