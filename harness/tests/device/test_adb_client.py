"""The harness's adb connections end without adbutils' fixed pause, and still end when the server lingers."""

from __future__ import annotations

import socket
import threading
import time

import adbutils
import pytest

from harness.device import adb


def _serve_once(answer_then_close: bool) -> tuple[int, threading.Event, list[bytes]]:
    """A one-connection stand-in for the adb server: it answers OKAY to one request, then closes its side
    (answer_then_close) or keeps it open; `half_closed` is set when it reads the client's end."""
    listener = socket.create_server(("127.0.0.1", 0))
    half_closed, received = threading.Event(), []

    def serve() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                received.append(connection.recv(1024))
                connection.sendall(b"OKAY")
                if answer_then_close:
                    connection.shutdown(socket.SHUT_WR)
                while data := connection.recv(1024):
                    received.append(data)
                half_closed.set()
                threading.Event().wait(0.5)  # lingers on with its side open (when it did not close it)

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], half_closed, received


def _no_pause(seconds: float) -> None:
    raise AssertionError(f"a fixed pause of {seconds} s in close")


def test_a_connection_whose_server_closed_ends_without_waiting(monkeypatch):
    monkeypatch.setattr(adb, "CLOSE_WAIT_S", 30.0)  # a fixed pause of ours would show as 30 s
    monkeypatch.setattr(time, "sleep", _no_pause)  # adbutils' would call it
    port, half_closed, received = _serve_once(answer_then_close=True)
    connection = adb._ServerConnection("127.0.0.1", port)
    connection.send_command("host:version")
    connection.check_okay()
    started = time.monotonic()
    connection.close()
    assert time.monotonic() - started < 5.0
    assert connection.closed
    assert half_closed.wait(5.0), "the server never read the client's end"
    assert received[0].endswith(b"host:version")


def test_a_server_that_keeps_its_side_open_is_waited_for_no_longer_than_the_pause(monkeypatch):
    monkeypatch.setattr(adb, "CLOSE_WAIT_S", 0.05)
    port, half_closed, _ = _serve_once(answer_then_close=False)
    connection = adb._ServerConnection("127.0.0.1", port)
    connection.send_command("host:version")  # its OKAY is never read: drained, not left for a reset
    started = time.monotonic()
    connection.close()
    assert time.monotonic() - started < 5.0
    assert connection.closed
    assert half_closed.wait(5.0)
    with pytest.raises(adbutils.AdbError):
        _ = connection.conn  # adbutils' own check: a closed connection has no socket


def test_a_unix_socket_server_is_reached_over_af_unix_and_a_missing_one_is_an_error(tmp_path):
    """The run's private server listens on a unix socket (localfilesystem:PATH): the client connects there,
    sets no TCP option on it, and never starts a server when nothing listens."""
    path = tmp_path / "adb.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    received = []

    def serve() -> None:
        with listener:
            connection, _ = listener.accept()
            with connection:
                received.append(connection.recv(1024))
                connection.sendall(b"OKAY0004" + b"0029")

    threading.Thread(target=serve, daemon=True).start()
    client = adb.AdbClient(server=adb.AdbServer.unix(path))
    assert client.server_version() == 0x29
    assert received[0] == b"000chost:version"
    missing = adb.AdbClient(server=adb.AdbServer.unix(tmp_path / "none.sock"))
    with pytest.raises(adb.adbutils.AdbError, match="connect to adb server failed"):
        missing.server_version()
