"""The emulated device's qnn_executor_runner, fast path: hand the run to this device's runner server.

    python -m harness.emulator.runner_client --model_path M.pte --input_list_path list.txt ...

Importing torch and executorch costs seconds per run; a runner server (runner_server.py) has them imported
and forks a fresh child per run. This client sends the server its argv, cwd, umask, environment and
stdin/stdout/stderr (harness.fork_client), waits for the child and exits with its status (128+N for a child
killed by signal N, as a shell reports it). Being killed closes the connection, which makes the server kill
the child, so `timeout -s KILL` and a closed adb stream end the run as before.
Without $QNNSUITE_RUNNER_SOCKET, or when the server is not there or turns the run down, it execs
`$QNNSUITE_PYTHON -m harness.emulator.host_runner` itself: the same run, only slower.
Start-up cost is what counts here, so only os, sys, socket and json are imported.
"""
from __future__ import annotations

import os
import sys

from harness.fork_client import STD_FDS, NotStarted, ServerGone, request

SOCKET_ENV = "QNNSUITE_RUNNER_SOCKET"


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
    try:
        return request(path, argv, os.getcwd(), dict(os.environ), {fd: fd for fd in open_std_fds()})
    except ServerGone as gone:
        print(f"runner_client: {gone}", file=sys.stderr, flush=True)
        return 1
    except NotStarted as not_started:
        if not_started.refusal:
            print(f"runner_client: runner server turned the run down ({not_started.refusal}); running it directly",
                  file=sys.stderr, flush=True)
        return None


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
