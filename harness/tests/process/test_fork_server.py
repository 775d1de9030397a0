"""The fork server's own protocol, apart from either service: a client gets the code its child declared
without waiting for the child's teardown, and one that died without declaring is reported by its end; a
request's preparation in the server that starts a thread breaks the server (its forked children would lack
the thread), one that fails is only logged. Served requests end to end are in test_runner_server.py and
test_lower_server.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.paths import REPO_ROOT
from harness.process.fork_server import EXITED, ForkServer


@pytest.fixture
def server(tmp_path: Path) -> ForkServer:
    return ForkServer(tmp_path / "x.sock", lambda argv: 0, "x", secret="s")


@pytest.fixture
def child():
    """A live process and its pidfd; killed and reaped afterwards."""
    process = subprocess.Popen(["sleep", "60"])
    pidfd = os.pidfd_open(process.pid)
    yield process, pidfd
    process.kill()
    process.wait()
    os.close(pidfd)


@pytest.fixture
def ends():
    """What the server waits on besides the child: the pipe the child declares its code on (read end,
    write end) and the client's connection (client side, server side)."""
    declared, declare = os.pipe()
    client, served = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield SimpleNamespace(declared=declared, declare=declare, client=client, served=served)
    for fd in (declared, declare):
        try:
            os.close(fd)
        except OSError:
            pass  # closed by the test
    client.close()
    served.close()


def test_a_declared_code_is_reported_while_the_child_is_still_alive(server, child, ends):
    process, pidfd = child
    os.write(ends.declare, bytes([3]))
    started = time.monotonic()
    assert server.end_of(ends.served, pidfd, ends.declared) == 3
    assert time.monotonic() - started < 5 and process.poll() is None


def test_a_child_that_ends_without_declaring_is_reported_by_its_end(server, child, ends):
    process, pidfd = child
    os.close(ends.declare)  # as a crashed child's end of the pipe closes
    process.send_signal(signal.SIGSEGV)
    assert server.end_of(ends.served, pidfd, ends.declared) == EXITED


def test_a_client_that_hangs_up_first_is_told_apart(server, child, ends):
    _, pidfd = child
    ends.client.close()
    assert server.end_of(ends.served, pidfd, ends.declared) is None


def test_a_preparation_that_fails_is_logged_and_the_request_still_runs(tmp_path, capsys):
    def prepare(argv: list[str]) -> None:
        raise ValueError(f"cannot prepare {argv}")

    server = ForkServer(tmp_path / "x.sock", lambda argv: 0, "x", prepare, secret="s")
    server.prepare_request(["request.json"])
    assert "ValueError: cannot prepare ['request.json']" in capsys.readouterr().err
    assert server.broken is None and server.refusal({"env": {}, "cwd": str(tmp_path)}) is None


PREPARING = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from harness.process.fork_server import ForkServer

    torch.set_num_threads(2)
    elements = int(sys.argv[1])  # past the parallel grain, torch starts its OpenMP pool
    server = ForkServer(Path("x.sock"), lambda argv: 0, "x", lambda argv: torch.ones(elements).mul_(2), secret="s")
    server.prepare_request([])
    print(server.refusal({"env": {}, "cwd": "/"}))
""")


@pytest.mark.child_python
@pytest.mark.parametrize("elements, refused", [(8, False), (1 << 22, True)], ids=["tiny-op", "thread-pool"])
def test_a_preparation_that_starts_a_thread_breaks_the_server(elements, refused):
    """In a fresh Python, whose torch has no thread pool yet: a preparation whose tensor op is below the
    parallel grain starts no thread and the server goes on; one above it starts the pool, and every later
    request is turned down (its clients run it in a fresh process)."""
    completed = subprocess.run(
        [sys.executable, "-c", PREPARING, str(elements)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    said = completed.stdout.strip().splitlines()[-1]
    if refused:
        assert "preparing a request in the fork server started" in said and "thread(s)" in said, completed.stdout
    else:
        assert said == "None", completed.stdout
