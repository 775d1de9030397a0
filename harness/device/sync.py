"""Many files over one adb sync session (the `sync:` service), which adbutils does not offer.

adbutils opens a new connection to the adb server for every file, and a second one to stat the target
first; each close then sleeps 10 ms. A case moves a dozen small files each way, so that was most of
its device time (measured: 33 connections and 0.57 s per case on an emulated device). The sync protocol
lets one session carry any number of SEND, RECV and LIST requests, as `adb push DIR` uses it; this
module speaks that protocol (v1) over a transport that adbutils opened.
"""

from __future__ import annotations

import stat
import struct
import time
from pathlib import Path

import adbutils

DATA_CHUNK = 64 * 1024  # the largest DATA payload adbd accepts
STATUS = struct.Struct("<4sI")
DIRENT = struct.Struct("<4sIIII")


class SyncRefused(Exception):
    """The device answered FAIL; the message is its reason (e.g. "No space left on device")."""


class SyncProtocolError(ConnectionError):
    """The device answered something the protocol does not allow: the session cannot go on."""


class Oversized(Exception):
    """A file on the device is larger than its reader expects (a runaway writer): refused before it is pulled
    whole, or while it is pulled (a v1 listing's size is 32 bits), so that it cannot fill the host's memory or disk."""

    def __init__(self, name: str, size: int, limit: int, listed: bool = True) -> None:
        super().__init__(f"{name} is {size} bytes{'' if listed else ' or more'}, expected {limit}")
        self.name, self.size, self.limit = name, size, limit


class SyncSession:
    """One `sync:` session on a device; a context manager that ends it with QUIT."""

    def __init__(self, device: adbutils.AdbDevice, timeout_s: float) -> None:
        self.current = ""  # the device path of the request under way, for error messages
        self._connection = device.open_transport(timeout=timeout_s)
        try:
            self._connection.send_command("sync:")
            self._connection.check_okay()
        except BaseException:
            self._connection.close()
            raise

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._request(b"QUIT", "")
        except OSError:
            pass
        self._connection.close()

    def push(self, local: Path, remote: str, mode: int = 0o644) -> int:
        """Send one file; returns its size. SyncRefused when the device refuses it."""
        self._request(b"SEND", f"{remote},{stat.S_IFREG | mode}")
        size = 0
        with open(local, "rb") as source:
            while chunk := source.read(DATA_CHUNK):
                self._connection.conn.sendall(STATUS.pack(b"DATA", len(chunk)) + chunk)
                size += len(chunk)
        self._connection.conn.sendall(STATUS.pack(b"DONE", int(time.time())))
        kind, value = self._status()
        if kind == b"FAIL":
            raise SyncRefused(self._text(value))
        if kind != b"OKAY":
            raise SyncProtocolError(f"SEND of {remote} answered {kind!r}")
        return size

    def pull(self, remote: str, local: Path, max_bytes: int | None = None) -> int:
        """Receive one file; returns its size. SyncRefused when the device cannot send it; Oversized (and the
        session is over) as soon as more than max_bytes arrive."""
        size = 0
        self._request(b"RECV", remote)
        with open(local, "wb") as target:
            while True:
                kind, value = self._status()
                if kind == b"DONE":
                    return size
                if kind == b"FAIL":
                    raise SyncRefused(self._text(value))
                if kind != b"DATA":
                    raise SyncProtocolError(f"RECV of {remote} answered {kind!r}")
                if max_bytes is not None and size + value > max_bytes:
                    raise Oversized(remote.rpartition("/")[2], size + value, max_bytes, listed=False)
                target.write(self._connection.read_exact(value))
                size += value

    def list_sizes(self, remote: str) -> dict[str, int]:
        """{name: size} of the regular files in a directory (none when it does not exist, as adbd answers; a v1
        size: modulo 4 GiB, so a pull is bounded on its own too)."""
        self._request(b"LIST", remote)
        sizes = {}
        while True:
            kind, mode, size, _mtime, name_length = DIRENT.unpack(self._connection.read_exact(DIRENT.size))
            if kind == b"DONE":
                return sizes
            if kind != b"DENT":
                raise SyncProtocolError(f"LIST of {remote} answered {kind!r}")
            name = self._connection.read_exact(name_length).decode(errors="surrogateescape")
            if stat.S_ISREG(mode):
                sizes[name] = size

    def _request(self, kind: bytes, argument: str) -> None:
        self.current = argument.rpartition(",")[0] if kind == b"SEND" else argument
        encoded = argument.encode()
        self._connection.conn.sendall(STATUS.pack(kind, len(encoded)) + encoded)

    def _status(self) -> tuple[bytes, int]:
        return STATUS.unpack(self._connection.read_exact(STATUS.size))

    def _text(self, length: int) -> str:
        return self._connection.read_exact(length).decode(errors="replace")


def check_sizes(sizes: dict[str, int], limits: dict[str, int]) -> None:
    """Oversized for the first listed file larger than its limit (before anything is pulled)."""
    for name, size in sizes.items():
        if size > limits[name]:
            raise Oversized(name, size, limits[name])
