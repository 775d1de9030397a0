"""A fork server that accepts a request and never answers must not hang its client: the request is
reported as not started within the start-reply bound, and run() does it the slow way instead."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.process import fork_client


@pytest.fixture
def silent_server(tmp_path: Path):
    """Accepts connections on a Unix socket, reads the request, never replies."""
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(path))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def test_a_server_that_never_replies_is_not_waited_for(silent_server, monkeypatch, tmp_path):
    monkeypatch.setattr(fork_client, "START_REPLY_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(fork_client.NotStarted, match="did not answer in 1 s"):
        fork_client.request(str(silent_server), ["x"], str(tmp_path), {}, {})
    assert time.monotonic() - started < 5


def test_run_falls_back_to_a_fresh_process(silent_server, monkeypatch, tmp_path):
    monkeypatch.setattr(fork_client, "START_REPLY_TIMEOUT_S", 1.0)
    output = tmp_path / "out.txt"
    with open(output, "wb") as out:
        status = fork_client.run(
            str(silent_server),
            "platform",
            [],
            str(tmp_path),
            {"PATH": "/usr/bin:/bin"},
            {1: out.fileno(), 2: out.fileno()},
            timeout_s=60,
            python=sys.executable,
        )
    assert status == 0 and "Linux" in output.read_text()
