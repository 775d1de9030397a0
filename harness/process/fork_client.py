"""The client side of harness.process.fork_server: hand one request (argv, cwd, umask, the stdin/stdout/stderr
descriptors, the run's secret from beside the socket, and the environment, which the server only compares
with its own) to a server and wait for the child's exit status; or, when no server takes it, run the same
request the slow way, in a fresh Python (`run`).

Imported by the emulated runner on every invocation, where start-up cost is what counts: only os, socket
and json at import.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable

# One request (argv, cwd, environment) is one SOCK_SEQPACKET message; environments are a few KiB.
MAX_MESSAGE_BYTES = 1 << 20
STD_FDS = (0, 1, 2)
# sun_path holds 108 bytes including the terminating NUL.
MAX_UNIX_PATH_BYTES = 107
# The server answers "started" as soon as it has forked; a server that accepts and says nothing is hung.
START_REPLY_TIMEOUT_S = 30.0


class NotStarted(Exception):
    """The server did not start the request (none there, or it turned the request down): run it yourself.

    refusal: the server's reason when it answered and said no; None when there was no server to ask."""

    def __init__(self, message: str, refusal: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


class ServerGone(Exception):
    """The server accepted the request and went away before its child ended (the child dies with it)."""


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for bind/connect and a directory fd to close afterwards (None if there is none).

    A path longer than AF_UNIX allows is reached through /proc/self/fd/<its directory>/<name>, so a socket
    deep inside a pytest tmp directory still works.
    """
    if len(os.fsencode(path)) <= MAX_UNIX_PATH_BYTES:
        return path, None
    directory = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}", directory


def key_file_of(socket_path: str) -> str:
    """Where the run's secret for the server at socket_path is: beside it, in the run's private work folder."""
    return socket_path + ".key"


def read_key(socket_path: str) -> str:
    """The secret a request to the server at socket_path carries ("" when there is none: it is refused)."""
    try:
        with open(key_file_of(socket_path), "rb") as key:
            return key.read(256).decode("ascii", "replace").strip()
    except OSError:
        return ""


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def request(
    path: str, argv: list[str], cwd: str, env: dict[str, str], fds: dict[int, int], timeout_s: float | None = None
) -> int:
    """The child's exit status (128+N when signal N killed it).

    fds maps the child's 0/1/2 to descriptors of this process (a missing one stays closed in the child).
    NotStarted when the server did not start it; ServerGone when the server went away during the run;
    TimeoutError past timeout_s, after which the connection is closed, which makes the server kill the child."""
    message = json.dumps(
        {
            "argv": argv,
            "cwd": cwd,
            "umask": current_umask(),
            "env": env,
            "fds": sorted(fds),
            "secret": read_key(path),
        }
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        try:
            address, directory = unix_address(path)
            try:
                connection.connect(address)
            finally:
                if directory is not None:
                    os.close(directory)
            socket.send_fds(connection, [message], [fds[target] for target in sorted(fds)])
            connection.settimeout(START_REPLY_TIMEOUT_S)  # closing on a timeout makes a live server kill the child
            reply = json.loads(connection.recv(MAX_MESSAGE_BYTES) or "{}")
        except TimeoutError as error:
            raise NotStarted(f"the server at {path} did not answer in {START_REPLY_TIMEOUT_S:.0f} s") from error
        except OSError as error:
            raise NotStarted(f"no server at {path} ({error.strerror or error})") from error
        if "started" not in reply:
            refusal = reply.get("refused")
            raise NotStarted(f"the server at {path} did not start the request ({refusal or 'it hung up'})", refusal)
        # From here on the request has started: it is never run a second time.
        connection.settimeout(timeout_s)
        try:
            status = json.loads(connection.recv(MAX_MESSAGE_BYTES) or "{}").get("status")
        except TimeoutError:
            raise
        except OSError:
            status = None
    if status is None:
        raise ServerGone(f"the server at {path} went away during the run (its child is killed with it)")
    return int(status)


Request = tuple[list[str], str, dict[str, str]]  # argv, cwd, environment


def run(
    socket_path: str | None,
    module: str,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    fds: dict[int, int],
    timeout_s: float | None = None,
    python: str | None = None,
    replace: bool = False,
    for_server: Callable[[list[str], str, dict[str, str]], Request] | None = None,
) -> int:
    """The request's exit status, through the server at socket_path when it takes the request, else as
    `python -m module ARGV`, a fresh process with the same cwd, environment and descriptors.

    replace=True execs the fresh process in place of this one (never returns): a runner must, so that a
    `timeout -s KILL` of this process reaches it. A server that turns the request down says why on the
    request's stderr. ServerGone and TimeoutError as `request` raises them; a fresh process past timeout_s
    is killed and TimeoutError raised. for_server: how the request reads from the server's side (e.g. a
    jailed device's paths as the host sees them); the fresh process gets it as given."""
    if socket_path:
        try:
            return request(
                socket_path, *(for_server(argv, cwd, env) if for_server else (argv, cwd, env)), fds, timeout_s
            )
        except NotStarted as not_started:
            if not_started.refusal and 2 in fds:
                os.write(
                    fds[2],
                    f"fork client: the server turned the request down ({not_started.refusal}); "
                    f"running it in a fresh process\n".encode(),
                )
    command = [python or sys.executable, "-m", module, *argv]
    if replace:
        os.chdir(cwd)
        os.execve(command[0], command, env)
    import subprocess  # only the slow path pays for it

    try:
        return subprocess.run(
            command,
            cwd=cwd,
            env=env,
            stdin=fds.get(0, subprocess.DEVNULL),
            stdout=fds.get(1, subprocess.DEVNULL),
            stderr=fds.get(2, subprocess.DEVNULL),
            timeout=timeout_s,
        ).returncode
    except subprocess.TimeoutExpired as expired:
        raise TimeoutError(f"{module} killed after {timeout_s} s") from expired
