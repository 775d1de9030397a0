"""The adb transport, device side: packets, the CNXN/AUTH handshake, and OPENed streams with adb's
flow control, one connection from the adb server at a time (AOSP packages/modules/adb protocol.txt).

What a stream serves is asked of a `find_service` function (harness/emulator/adbd_services.py), and what a
connection needs of its device (its keys, banner, fault switches and link budget) is `LinkedDevice`: the
emulated device itself is harness/emulator/adbd.py."""

from __future__ import annotations

import os
import queue
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Protocol

from harness.emulator.adb_auth import TOKEN_SIZE, PublicKey

A_CNXN, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_AUTH = (
    int.from_bytes(name, "little") for name in (b"CNXN", b"OPEN", b"OKAY", b"CLSE", b"WRTE", b"AUTH")
)
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
# A connection that has not authenticated within this long is hung up on, so idle ones cannot pile up.
HANDSHAKE_TIMEOUT_S = 10.0
MAX_AUTH_ATTEMPTS = 8  # signatures tried on one connection (the server tries each key it has)
MIN_PAYLOAD = 4096
# 0x01000001 is the version from which neither side verifies data checksums, so we send 0.
PROTOCOL_VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
HEADER = struct.Struct("<6I")
FEATURES = "shell_v2,cmd"  # no stat_v2/ls_v2/sendrecv_v2: only the v1 sync requests are served


class MalformedPacket(Exception):
    """A packet no adb server sends (bad magic, oversized): the connection is hung up on."""


class StreamClosed(Exception):
    """The stream (or its whole connection) is gone; the service using it stops."""


Service = Callable[["Stream"], None]  # what serves one OPENed stream, until it returns or the stream closes


class LinkedDevice(Protocol):
    """What a connection asks of the device it serves (harness/emulator/adbd.py Device)."""

    keys: list[PublicKey]
    lock: threading.Lock
    streams: set[Stream]

    def read_faults(self) -> dict[str, Any]: ...

    def take_send_budget(self, size: int) -> tuple[int, bool]: ...

    def banner(self) -> bytes: ...


class Connection:
    """One transport connection from the adb server: authentication, then packets dispatched to streams."""

    def __init__(
        self, device: LinkedDevice, sock: socket.socket, find_service: Callable[[str], Service | None]
    ) -> None:
        """find_service: the service for an OPEN destination, or None to refuse it."""
        self.device = device
        self.find_service = find_service
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.send_lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.next_local_id = 1
        self.max_payload = MAX_PAYLOAD

    def send_packet(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = HEADER.pack(command, arg0, arg1, len(data), 0, command ^ 0xFFFFFFFF)
        with self.send_lock:
            self.sock.sendall(header + data)

    def read_packet(self) -> tuple[int, int, int, bytes]:
        """Next message from the server; EOFError when the connection ends, MalformedPacket for garbage."""
        header = self.reader.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError
        command, arg0, arg1, length, _checksum, magic = HEADER.unpack(header)
        if magic != command ^ 0xFFFFFFFF or length > MAX_PAYLOAD:
            raise MalformedPacket(f"command {command:#x}, magic {magic:#x}, length {length}")
        data = self.reader.read(length)
        if len(data) < length:
            raise EOFError
        return command, arg0, arg1, data

    def drop(self) -> None:
        """Vanish abruptly: reset the TCP connection as an unplugged device would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.shutdown(socket.SHUT_RDWR)

    def serve(self) -> None:
        """Authenticate, then serve packets until the adb server or a fault ends the connection."""
        try:
            self.sock.settimeout(HANDSHAKE_TIMEOUT_S)
            if not self.authenticate():
                return
            self.sock.settimeout(None)
            while True:
                command, arg0, arg1, data = self.read_packet()
                if command == A_CNXN:
                    return  # a new handshake on a live connection: adbd resets it
                if command == A_OPEN:
                    destination = data.rstrip(b"\0")
                    if arg0 == 0 or b"\0" in destination:
                        self.send_packet(A_CLSE, 0, arg0)
                    else:
                        self.open_stream(arg0, destination.decode(errors="replace"))
                elif command in (A_OKAY, A_WRTE, A_CLSE) and arg1 in self.streams:
                    stream = self.streams[arg1]
                    if command == A_OKAY:
                        stream.on_okay()
                    elif command == A_WRTE:
                        if self.device.take_send_budget(len(data))[1]:
                            self.drop()  # drop_after_bytes counts what the host sends too (a push)
                            break
                        stream.on_data(data)
                    else:
                        stream.on_remote_close()
        except (EOFError, OSError, MalformedPacket):
            pass
        finally:
            for stream in list(self.streams.values()):
                stream.on_remote_close()
            self.sock.close()

    def authenticate(self) -> bool:
        """adbd's handshake: CNXN, then AUTH tokens until a signature verifies with a trusted key (True).
        False hangs up: a packet out of order, a key this device does not know, too many tries.
        Faults: `offline` swallows everything; `unauthorized` never accepts and waits, as a phone
        whose user has not answered the prompt."""
        token, signatures = b"", 0
        while signatures <= MAX_AUTH_ATTEMPTS:
            command, arg0, arg1, data = self.read_packet()
            faults = self.device.read_faults()
            if faults.get("offline"):
                self.sock.settimeout(None)
                continue
            if command == A_CNXN:
                self.max_payload = max(MIN_PAYLOAD, min(MAX_PAYLOAD, arg1))
            elif command == A_AUTH and arg0 == AUTH_SIGNATURE and token:
                if not faults.get("unauthorized") and any(key.verifies(token, data) for key in self.device.keys):
                    self.send_packet(A_CNXN, PROTOCOL_VERSION, MAX_PAYLOAD, self.device.banner())
                    return True
                signatures += 1
            elif command == A_AUTH and arg0 == AUTH_RSAPUBLICKEY and faults.get("unauthorized"):
                self.sock.settimeout(None)  # the prompt nobody answers
                continue
            else:
                return False
            token = os.urandom(TOKEN_SIZE)
            self.send_packet(A_AUTH, AUTH_TOKEN, 0, token)
        return False

    def open_stream(self, remote_id: int, destination: str) -> None:
        """Answer OPEN: OKAY and a service thread, or CLSE for services we do not offer."""
        service = self.find_service(destination)
        if service is None:
            self.send_packet(A_CLSE, 0, remote_id)
            return
        local_id, self.next_local_id = self.next_local_id, self.next_local_id + 1
        stream = Stream(self, local_id, remote_id)
        self.send_packet(A_OKAY, local_id, remote_id)
        threading.Thread(target=stream.run, args=(service,), daemon=True, name=destination[:40]).start()


class Stream:
    """One OPENed service stream with adb's one-write-in-flight flow control in both directions."""

    def __init__(self, connection: Connection, local_id: int, remote_id: int) -> None:
        self.connection = connection
        self.local_id, self.remote_id = local_id, remote_id
        self.closed = False
        self.may_write = threading.Event()
        self.may_write.set()
        self.write_lock = threading.Lock()
        self.incoming: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.pending = b""
        self.process: subprocess.Popen[bytes] | None = None
        self.hangup_grace_s = 0.0
        connection.streams[local_id] = self
        with connection.device.lock:
            connection.device.streams.add(self)

    def run(self, service: Service) -> None:
        try:
            service(self)
        except (StreamClosed, OSError, ValueError, struct.error):
            pass  # a broken or hostile request ends its own stream, never the device
        finally:
            self.close()

    def on_okay(self) -> None:
        self.may_write.set()

    def on_data(self, data: bytes) -> None:
        self.incoming.put(data)

    def on_remote_close(self) -> None:
        """The host closed the stream (or the connection died): stop the service and, in time, its command."""
        already_closed, self.closed = self.closed, True
        self.may_write.set()
        self.incoming.put(None)
        self.connection.streams.pop(self.local_id, None)
        with self.connection.device.lock:
            self.connection.device.streams.discard(self)
        if not already_closed:
            self.hang_up_command()

    def hang_up_command(self) -> None:
        """Kill the stream's command now (shell v2) or after the raw-mode grace period."""
        if self.process is None:
            return
        if self.hangup_grace_s:
            hangup = threading.Timer(self.hangup_grace_s, kill_process_group, args=(self.process,))
            hangup.daemon = True
            hangup.start()
        else:
            kill_process_group(self.process)

    def close(self) -> None:
        """Close from the device side."""
        if not self.closed:
            try:
                self.connection.send_packet(A_CLSE, self.local_id, self.remote_id)
            except OSError:
                pass
        self.on_remote_close()

    def write(self, data: bytes) -> None:
        """Send data as WRTE packets, each after the host acknowledged the previous one."""
        with self.write_lock:
            for start in range(0, len(data), self.connection.max_payload):
                self.may_write.wait()
                if self.closed:
                    raise StreamClosed
                self.may_write.clear()
                chunk = data[start : start + self.connection.max_payload]
                allowed, vanish = self.connection.device.take_send_budget(len(chunk))
                if allowed:
                    self.connection.send_packet(A_WRTE, self.local_id, self.remote_id, chunk[:allowed])
                if vanish:
                    self.connection.drop()
                    raise StreamClosed

    def read_chunk(self) -> bytes | None:
        """Next WRTE payload from the host (acknowledged once taken), or None when the stream closed."""
        if self.pending:
            chunk, self.pending = self.pending, b""
            return chunk
        chunk = self.incoming.get()
        if chunk is None:
            self.incoming.put(None)  # keep later readers from blocking
            return None
        if not self.closed:
            self.connection.send_packet(A_OKAY, self.local_id, self.remote_id)
        return chunk

    def read_exact(self, size: int) -> bytes:
        """Exactly `size` bytes of the host's byte stream, whatever the WRTE boundaries (sync, shell v2)."""
        data = b""
        while len(data) < size:
            chunk = self.read_chunk()
            if chunk is None:
                raise StreamClosed
            data += chunk
        data, self.pending = data[:size], data[size:]
        return data


def kill_process_group(process: subprocess.Popen[bytes] | None) -> None:
    """Kill a device command with everything it started (it leads its own process group)."""
    if process is not None and process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
