"""The emulated device's qnn_executor_runner, fast path: hand the run to this device's runner server.

    python -m harness.emulator.runner_client --model_path M.pte --input_list_path list.txt ...

Importing torch and executorch costs seconds per run; the device's runner server (harness/process/services.py)
has them imported and forks a fresh child per run. This client sends the server its argv, cwd, umask,
environment and stdin/stdout/stderr (harness.process.fork_client), waits for the child and exits with its
status (128+N for a child killed by signal N, as a shell reports it). Being killed closes the connection,
which makes the server kill the child, so `timeout -s KILL` and a closed adb stream end the run as before.
Without $QNNSUITE_RUNNER_SOCKET, or when the server is not there or turns the run down, it execs
`$QNNSUITE_PYTHON -m harness.emulator.host_runner` itself: the same run, only slower.
In a jailed device shell (harness.emulator.jail) the device's paths (/data/...) exist only inside the jail,
while the server runs on the host: the cwd, path arguments and library paths sent are the sandbox's host
paths of what the device command named (the server refuses anything outside its device's sandbox).
Its stderr also goes, line by line, into the device log that the device's logcat reads (device_log.tee),
as a phone's runner logs through liblog; the copy is made here, outside the runner's child, so a runner
that crashes loses none of its last words.
On an emulated phone ($QNNSUITE_EMULATED_PHONE) the run is always a fresh process whose loader finds the
pushed QNN libraries (harness/emulator/phone_runtime.py).
Start-up cost is what counts here, so only os, sys, socket, json, re, time and threading are imported.
"""

from __future__ import annotations

import os
import sys

from harness.emulator import device_log
from harness.emulator.device_fs import host_path
from harness.emulator.phone_runtime import PHONE_ENV, NoQnnLibrary, runner_environment
from harness.process.fork_client import STD_FDS, ServerGone, run

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (device_log.py)
if TYPE_CHECKING:
    from threading import Thread

SOCKET_ENV = "QNNSUITE_RUNNER_SOCKET"
HOST_RUNNER = "harness.emulator.host_runner"  # the runner service's entry (harness/process/services.py RUNNER)
SANDBOX_ENV = "ANDROID_ROOT_SANDBOX"
PATH_LIST_VARIABLES = ("LD_LIBRARY_PATH", "ADSP_LIBRARY_PATH")
TEE_DRAIN_S = 5.0  # the runner has ended: what it wrote is in the pipe already


def for_host(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[list[str], str, dict[str, str]]:
    """argv, cwd and environment with device paths turned into their host paths in the sandbox."""
    root = env.get(SANDBOX_ENV)
    if not root:
        return argv, cwd, env

    def argument(value: str) -> str:
        flag, equals, path = value.partition("=")
        return f"{flag}={host_path(path, root)}" if equals and flag.startswith("--") else host_path(value, root)

    env = dict(env)
    for name in PATH_LIST_VARIABLES:
        if name in env:
            env[name] = ":".join(host_path(entry, root) for entry in env[name].split(":"))
    return [argument(value) for value in argv], host_path(cwd, root), env


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


def logged_stderr(fds: dict[int, int]) -> tuple[dict[int, int], Thread | None, int | None]:
    """fds with the runner's stderr through a pipe that device_log.tee copies to our stderr and the device
    log; returns (fds, the tee's thread, our end of the pipe to close). Unchanged fds and no thread without
    a device log, or when it cannot be opened: the run itself must not depend on its log."""
    from threading import Thread

    log_path = os.environ.get(device_log.LOG_ENV)
    if not log_path or 2 not in fds:
        return fds, None, None
    try:
        log = open(log_path, "a", encoding="utf-8", errors="backslashreplace")
    except OSError:
        return fds, None, None
    read_end, write_end = os.pipe()
    thread = Thread(target=device_log.tee, args=(read_end, fds[2], log, os.getpid()), daemon=True)
    thread.start()
    return {**fds, 2: write_end}, thread, write_end


def main(argv: list[str]) -> None:
    env, socket_path = dict(os.environ), os.environ.get(SOCKET_ENV)
    if PHONE_ENV in env:  # an emulated phone: a fresh runner that loads the pushed libraries (phone_runtime)
        try:
            env, socket_path = runner_environment(env), None
        except NoQnnLibrary as missing:
            print(f"qnn_executor_runner: {missing}", file=sys.stderr, flush=True)
            sys.exit(1)
    fds, tee, write_end = logged_stderr({fd: fd for fd in open_std_fds()})
    try:
        status = run(
            socket_path,
            HOST_RUNNER,
            argv,
            os.getcwd(),
            env,
            fds,
            python=os.environ.get("QNNSUITE_PYTHON"),
            replace=True,
            for_server=for_host,
        )
    except ServerGone as gone:
        print(f"runner_client: {gone}", file=sys.stderr, flush=True)
        status = 1
    if tee is not None:  # the child has ended: its copy of the pipe is closed, so the tee reaches EOF
        os.close(write_end)
        tee.join(TEE_DRAIN_S)
    sys.exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
