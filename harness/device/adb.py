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

adbutils only knows TCP servers. The run's private server listens on a unix socket in the user's 0700
state folder instead (any local account can talk to a loopback port, and adb servers authenticate no
client), so `_ServerConnection` opens an AF_UNIX socket for a `localfilesystem:PATH` server: hand-written
because no kept library speaks the adb host protocol over a unix socket.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import adbutils
from adbutils._proto import ShellReturnRaw
from adbutils.errors import AdbConnectionError

from harness.device import shell_v2

CONNECT_TIMEOUT_S = 10.0  # a request's own timeout, when it has none
CLOSE_WAIT_S = 0.01  # adbutils' pause in every close: the longest a close here waits for the server's
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")  # a name, an IPv4 address or a bracketed IPv6 one


UNIX_PREFIX = "localfilesystem:"  # adb's ADB_SERVER_SOCKET / -L spelling of a unix socket server
# An absolute socket path without control characters (it is also part of device labels, SERVER/SERIAL; it
# reaches adb as one argv word, never a shell).
_SOCKET_PATH = re.compile(r"/[^\x00-\x1f\x7f]*")
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with its NUL


@dataclass(frozen=True, order=True)
class AdbServer:
    """One adb server a run takes devices from: the local one, another host's (`adb -a` listens on all), or
    one on a unix socket (`localfilesystem:PATH`, the run's private server: no other local account reaches it)."""

    host: str
    port: int
    path: str = ""  # the unix socket of a `localfilesystem:` server (host and port are then "" and 0)

    @property
    def address(self) -> str:
        """How the server is written: `HOST:PORT`, `[V6]:PORT` or `localfilesystem:PATH` (a label never both)."""
        if self.path:
            return f"{UNIX_PREFIX}{self.path}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def environment(self) -> dict[str, str]:
        """The variables that make the stock adb client (and this suite) use this server."""
        return {"ADB_SERVER_SOCKET": self.address if self.path else f"tcp:{self.address}"}

    @classmethod
    def unix(cls, path: str | os.PathLike[str], option: str = "unix socket") -> AdbServer:
        """A server on a unix socket; ValueError names `option` when the path cannot be one."""
        text = os.fspath(path)
        if (
            not _SOCKET_PATH.fullmatch(text)
            or "//" in text
            or text.endswith("/")
            or len(text.encode()) > SOCKET_PATH_MAX
            or "/../" in f"{text}/"
            or "/./" in f"{text}/"
        ):
            raise ValueError(
                f"{option} {UNIX_PREFIX}{text!r}: write a unix socket server as localfilesystem:/ABSOLUTE/PATH "
                f"(no control characters, at most {SOCKET_PATH_MAX} bytes, no . or .. parts)"
            )
        return cls("", 0, text)

    @classmethod
    def parse(cls, text: str, option: str) -> AdbServer:
        """`HOST:PORT` (also `tcp:HOST:PORT`, as ADB_SERVER_SOCKET spells it), or `localfilesystem:PATH`;
        ValueError names option."""
        text = text.strip()
        if text.startswith(UNIX_PREFIX):
            return cls.unix(text.removeprefix(UNIX_PREFIX), option)
        host, _, port = text.removeprefix("tcp:").rpartition(":")
        if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{option} {text!r}: write the adb server as HOST:PORT, e.g. 192.168.1.20:5037, "
                f"or as localfilesystem:/PATH/OF/SOCKET"
            )
        return cls(host.strip("[]"), int(port))


def split_label(label: str) -> tuple[str, str]:
    """(server address, serial) of a `SERVER/SERIAL` device label or --device value ("" server: a bare serial).

    A unix socket server's address holds slashes, so it ends at the label's last one (serials hold none)."""
    if label.startswith(UNIX_PREFIX):
        server, _, serial = label.rpartition("/")
        return server, serial
    server, slash, serial = label.partition("/")
    return (server, serial) if slash else ("", label)


UNIX_CONNECT_TIMEOUT_S = 3  # as adbutils' own connect


def _connect_unix(sock: socket.socket, path: str, deadline: float) -> None:
    """connect(2) to a unix socket server, again while its listen backlog is full: a TCP connect waits in
    the kernel's queue, but a unix one with a timeout set fails at once with EAGAIN (seen under load when a
    device's streams open together); TimeoutError once the deadline passes."""
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the adb server on {path} accepted no connection in time") from None
            time.sleep(0.01)


class _ServerConnection(adbutils.AdbConnection):
    def __init__(self, host: str, port: int, path: str = "") -> None:
        self._unix_path = path
        super().__init__(host, port)

    def _create_socket(self) -> socket.socket:
        """adbutils' TCP socket, or an AF_UNIX one for a `localfilesystem:` server."""
        if not self._unix_path:
            return super()._create_socket()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(UNIX_CONNECT_TIMEOUT_S)
            _connect_unix(sock, self._unix_path, time.monotonic() + UNIX_CONNECT_TIMEOUT_S)
        except TimeoutError as error:
            sock.close()
            raise adbutils.AdbTimeout("connect to adb server timeout") from error
        except OSError as error:
            sock.close()
            raise AdbConnectionError(f"connect to adb server failed: {error}") from error
        sock.settimeout(None)
        return sock

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
    def __init__(self, host: str = "127.0.0.1", port: int = 5037, server: AdbServer | None = None) -> None:
        """A client of `server`, else of the TCP server at host:port."""
        self.server = server or AdbServer(host, port)
        super().__init__(host=self.server.host, port=self.server.port, socket_timeout=CONNECT_TIMEOUT_S)
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

    def device(self, serial: str | None = None, transport_id: int | None = None) -> adbutils.AdbDevice:
        return _Device(self, serial=serial, transport_id=transport_id)

    def server_version(self) -> int:
        if self._server_version is None:
            self._server_version = super().server_version()
        return self._server_version

    def make_connection(self, timeout: float | None = None) -> adbutils.AdbConnection:
        try:
            connection = _ServerConnection(self.host, self.port, self.server.path)
        except TimeoutError as error:
            raise adbutils.AdbTimeout("connect to adb server timeout") from error
        connection.conn.settimeout(timeout or CONNECT_TIMEOUT_S)
        if not self.server.path:
            connection.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        collecting = getattr(self._opened_here, "sockets", None)
        if collecting is not None:
            collecting.append(connection.conn)
        return connection


class _Device(adbutils.AdbDevice):
    """adbutils' device with every request bounded: its own requests (`features`, asked before a first shell,
    `get-state`, ...) default to a 600 s timeout, which a wedged server holds in full; and a command's output
    is kept to its last shell_v2.OUTPUT_KEEP_BYTES per stream, not in full."""

    def open_transport(self, command: str | None = None, timeout: float | None = None) -> adbutils.AdbConnection:
        return super().open_transport(command, timeout)  # None: the client's CONNECT_TIMEOUT_S

    def _shell_v2(self, cmdargs: str, timeout: float | None = None) -> ShellReturnRaw:
        connection = self.open_transport(timeout=timeout)
        try:
            connection.send_command(f"shell,v2:{cmdargs}")
            connection.check_okay()
            return shell_v2.read(connection, cmdargs)
        finally:
            connection.close()
