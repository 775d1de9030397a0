"""The adbutils client the harness talks through, with two per-request costs removed and no server started.

adbutils opens a fresh TCP connection to the adb server for every shell, stat, push and pull, and
(1) asks the server its version before each transport is opened (a second connection per request),
(2) leaves Nagle's algorithm on, so its split writes (a sync DATA header, then the chunk) wait for the
peer's delayed ACK: measured on loopback, a 100-byte push took 68 ms and 12 ms without both.
The server's version cannot change under a running server, so it is asked once per client.
(3) sleeps 10 ms in every close, after its half-close, so that the server takes the shutdown before the
socket goes. A request whose answer was read to its end finds the server's own close already there, so
here a close waits for that instead, never longer than adbutils' pause: a case's two shells and two sync
sessions paid 40 ms of pauses (measured: a jailed `adb shell true` on an emulated device, 24 -> 13 ms).
adbutils also runs `adb start-server` when it finds no server, which starts one on 5037 whatever port the
client was given: a run whose private server died would then talk to (or start) the user's. Here a
missing server is an error, and connections time out instead of waiting forever.
"""
from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import adbutils
from adbutils._proto import ShellReturnRaw

from harness.device import shell_v2

CONNECT_TIMEOUT_S = 10.0  # a request's own timeout, when it has none
CLOSE_WAIT_S = 0.01  # adbutils' pause in every close: the longest a close here waits for the server's
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")  # a name, an IPv4 address or a bracketed IPv6 one


@dataclass(frozen=True, order=True)
class AdbServer:
    """One adb server a run takes devices from: the local one, or another host's (`adb -a` listens on all)."""

    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, option: str) -> AdbServer:
        """`HOST:PORT` (also `tcp:HOST:PORT`, as ADB_SERVER_SOCKET spells it); ValueError names option."""
        host, _, port = text.strip().removeprefix("tcp:").rpartition(":")
        if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{option} {text!r}: write the adb server as HOST:PORT, e.g. 192.168.1.20:5037")
        return cls(host.strip("[]"), int(port))


class _ServerConnection(adbutils.AdbConnection):
    def _safe_connect(self):
        """The connection to the given server only: never start one (adbutils would start it on 5037)."""
        return self._create_socket()

    def close(self) -> None:
        """Half-close, then close once the server has closed its side (at most CLOSE_WAIT_S later); bytes
        still unread are drained meanwhile, so the close is not a reset."""
        if self.closed:
            return
        sock = self.conn
        deadline = time.monotonic() + CLOSE_WAIT_S
        try:
            sock.shutdown(socket.SHUT_WR)
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                if not sock.recv(65536):
                    break  # the server's close
        except OSError:  # the wait ran out (a timeout is one), or the connection is gone already
            pass
        sock.close()
        self._AdbConnection__conn = None  # adbutils' own close forgets the socket so (name-mangled there)


class AdbClient(adbutils.AdbClient):
    def __init__(self, host: str = "127.0.0.1", port: int = 5037) -> None:
        super().__init__(host=host, port=port, socket_timeout=CONNECT_TIMEOUT_S)
        self._server_version: int | None = None
        self._opened_here = threading.local()  # per thread: the list opened_connections() collects into

    @contextlib.contextmanager
    def opened_connections(self) -> Iterator[list[socket.socket]]:
        """The sockets this thread opens to the server meanwhile, so that a watchdog in another thread can cut
        them: adbutils gives no handle on the connection a blocking shell2 or sync call reads from."""
        self._opened_here.sockets = sockets = []
        try:
            yield sockets
        finally:
            self._opened_here.sockets = None

    def device(self, serial: Optional[str] = None, transport_id: Optional[int] = None) -> adbutils.AdbDevice:
        return _Device(self, serial=serial, transport_id=transport_id)

    def server_version(self) -> int:
        if self._server_version is None:
            self._server_version = super().server_version()
        return self._server_version

    def make_connection(self, timeout: Optional[float] = None) -> adbutils.AdbConnection:
        try:
            connection = _ServerConnection(self.host, self.port)
        except TimeoutError as error:
            raise adbutils.AdbTimeout("connect to adb server timeout") from error
        connection.conn.settimeout(timeout or CONNECT_TIMEOUT_S)
        connection.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        collecting = getattr(self._opened_here, "sockets", None)
        if collecting is not None:
            collecting.append(connection.conn)
        return connection


class _Device(adbutils.AdbDevice):
    """adbutils' device with every request bounded: its own requests (`features`, asked before a first shell,
    `get-state`, ...) default to a 600 s timeout, which a wedged server holds in full; and a command's output
    is kept to its last shell_v2.OUTPUT_KEEP_BYTES per stream, not in full."""

    def open_transport(self, command: Optional[str] = None, timeout: Optional[float] = None) -> adbutils.AdbConnection:
        return super().open_transport(command, timeout)  # None: the client's CONNECT_TIMEOUT_S

    def _shell_v2(self, cmdargs: str, timeout: Optional[float] = None) -> ShellReturnRaw:
        connection = self.open_transport(timeout=timeout)
        try:
            connection.send_command(f"shell,v2:{cmdargs}")
            connection.check_okay()
            return shell_v2.read(connection, cmdargs)
        finally:
            connection.close()
