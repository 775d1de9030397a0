"""The emulated device's adb services: `shell:`/`exec:` commands (shell protocol v2 or raw) and the
`sync:` file service, over a stream of harness/emulator/adbd_transport.py, on the sandbox folder that stands
in for the device's file system (AOSP SYNC.TXT, shell_protocol.h, file_sync_protocol.h)."""

from __future__ import annotations

import io
import os
import posixpath
import struct
import subprocess
import threading
from pathlib import Path

from harness.emulator.adbd_transport import Service, Stream, StreamClosed, kill_process_group
from harness.runner import contract as runner_contract

MAX_SYNC_PATH = 1024  # adbd's limit for a sync request's path
SYNC_DATA_MAX = 64 * 1024

# Without the shell protocol a host hang-up is also the end of stdin: input sent just before it still reaches
# the command (`adb exec-in 'cat > f' < f`), which gets this long to finish before its process group is killed.
RAW_HANGUP_GRACE_S = 2.0
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN = 0, 1, 2, 3, 4


class SandboxEscape(ValueError):
    """A device path that cannot be served: it resolves outside the device's root directory, or holds a NUL."""


def device_to_host(device_path: str, root: Path) -> Path:
    """Map a device path to its host path under `root`; symlinks may not lead out of the sandbox."""
    if "\0" in device_path:
        raise SandboxEscape(f"{device_path!r}: a path cannot hold a NUL byte")
    relative = posixpath.normpath("/" + device_path).lstrip("/")
    host_path = root / relative if relative else root
    if not host_path.resolve().is_relative_to(root.resolve()):
        raise SandboxEscape(f"{device_path}: outside the device sandbox")
    return host_path


def find_service(destination: str) -> Service | None:
    """The service for an OPEN destination, or None to refuse it (interactive shells too)."""
    name, _, command = destination.partition(":")
    if name == "sync" and not command:
        return serve_sync
    if not command:
        return None
    if name == "exec":
        return lambda stream: run_command(stream, command, shell_v2=False)
    if name == "shell" or name.startswith("shell,"):
        return lambda stream: run_command(stream, command, shell_v2="v2" in name.split(",")[1:])
    return None


def run_command(stream: Stream, command: str, shell_v2: bool) -> None:
    """Run a command; v2 frames stdin/stdout/stderr/exit in packets, v1 and exec stream raw combined output."""
    stream.hangup_grace_s = 0.0 if shell_v2 else RAW_HANGUP_GRACE_S
    process = stream.process = stream.connection.device.start_command(command, separate_stderr=shell_v2)
    if stream.closed:  # the host hung up while we were starting it
        stream.hang_up_command()
    if runner_contract.runs_a_program(command) and stream.connection.device.vanish_if("run", stream.connection):
        return

    def pump_output(pipe: io.BufferedReader, packet_id: int) -> None:
        try:
            while chunk := pipe.read1(SYNC_DATA_MAX):
                stream.write(struct.pack("<BI", packet_id, len(chunk)) + chunk if shell_v2 else chunk)
        except (StreamClosed, OSError):
            kill_process_group(process)  # output with nowhere to go: what SIGPIPE does on a device

    pumps = [threading.Thread(target=pump_output, args=(process.stdout, SHELL_STDOUT), daemon=True)]
    if shell_v2:
        pumps.append(threading.Thread(target=pump_output, args=(process.stderr, SHELL_STDERR), daemon=True))
    threading.Thread(target=feed_stdin, args=(stream, process, shell_v2), daemon=True).start()
    for pump in pumps:
        pump.start()
    for pump in pumps:
        pump.join()
    exit_code = process.wait()
    if shell_v2:
        stream.write(struct.pack("<BIB", SHELL_EXIT, 1, (128 - exit_code if exit_code < 0 else exit_code) & 0xFF))


def feed_stdin(stream: Stream, process: subprocess.Popen[bytes], shell_v2: bool) -> None:
    """Forward the host's stdin to the command until the host closes it."""
    assert process.stdin is not None
    try:
        while True:
            if shell_v2:
                packet_id, length = struct.unpack("<BI", stream.read_exact(5))
                data = stream.read_exact(length)
                if packet_id == SHELL_CLOSE_STDIN:
                    break
                if packet_id != SHELL_STDIN:
                    continue  # window-size changes mean nothing without a pty
            elif (data := stream.read_chunk()) is None:
                break
            process.stdin.write(data)
            process.stdin.flush()
    except (StreamClosed, OSError):
        pass
    finally:
        try:
            process.stdin.close()
        except OSError:
            pass


def sync_status(request_id: bytes, *values: int) -> bytes:
    """A sync reply: 4-byte id followed by little-endian 32-bit fields."""
    return request_id + struct.pack(f"<{len(values)}I", *values)


def sync_fail(message: str) -> bytes:
    encoded = message.encode()
    return b"FAIL" + struct.pack("<I", len(encoded)) + encoded


def serve_sync(stream: Stream) -> None:
    """The `sync:` file service (v1 requests): STAT, LIST, SEND, RECV, QUIT."""
    device = stream.connection.device
    while True:
        request_id, length = struct.unpack("<4sI", stream.read_exact(8))
        if length > MAX_SYNC_PATH:
            stream.write(sync_fail(f"sync request of {length} bytes: longer than {MAX_SYNC_PATH}"))
            return
        argument = stream.read_exact(length).decode(errors="surrogateescape")
        if request_id == b"SEND" and argument.split(",")[0].endswith(".pte"):
            device.count_program()
        faults = device.read_faults()
        if request_id == b"QUIT":
            return
        if request_id == b"STAT":
            try:
                info = device_to_host(argument, device.root).lstat()
                stream.write(sync_status(b"STAT", info.st_mode, info.st_size & 0xFFFFFFFF, int(info.st_mtime)))
            except (OSError, SandboxEscape):
                stream.write(sync_status(b"STAT", 0, 0, 0))
        elif request_id == b"LIST":
            stream.write(list_directory(argument, device.root) + sync_status(b"DONE", 0, 0, 0, 0))
        elif request_id == b"SEND":
            if argument.split(",")[0].endswith(".pte") and device.vanish_if("push", stream.connection):
                return
            reply = receive_file(stream, argument, device.root, bool(faults.get("storage_full")))
            if faults.get("corrupt_pte") and argument.split(",")[0].endswith(".pte"):
                truncate_half(device_to_host(argument.rpartition(",")[0], device.root))
            stream.write(reply)
        elif request_id == b"RECV":
            if "/outputs/" in argument and device.vanish_if("pull", stream.connection):
                return
            send_file(stream, argument, device.root)
        else:
            stream.write(sync_fail(f"unknown sync request {request_id!r}"))
            return


def truncate_half(path: Path) -> None:
    """Fault `corrupt_pte`: a program arrives truncated, as after a bad transfer or a full disk."""
    if path.exists():
        os.truncate(path, path.stat().st_size // 2)


def list_directory(device_path: str, root: Path) -> bytes:
    """DENT records of a directory (empty when it is missing, as adbd does)."""
    entries = b""
    try:
        with os.scandir(device_to_host(device_path, root)) as scan:
            for entry in scan:
                info, name = entry.stat(follow_symlinks=False), entry.name.encode(errors="surrogateescape")
                entries += (
                    sync_status(b"DENT", info.st_mode, info.st_size & 0xFFFFFFFF, int(info.st_mtime), len(name)) + name
                )
    except (OSError, SandboxEscape):
        pass
    return entries


def receive_file(stream: Stream, argument: str, root: Path, storage_full: bool) -> bytes:
    """Read a SEND's DATA chunks up to DONE, store them, and return the OKAY or FAIL reply."""
    device_path, _, mode_text = argument.rpartition(",") if "," in argument else (argument, "", "")
    error = "No space left on device" if storage_full else None
    output = None
    try:
        host_path = device_to_host(device_path, root)
        if not error:
            host_path.parent.mkdir(parents=True, exist_ok=True)
            output = open(host_path, "wb")
    except (OSError, SandboxEscape) as problem:
        error = f"{device_path}: {getattr(problem, 'strerror', None) or problem}"
    try:
        while True:  # always drain the data, even when failing, so the stream stays in step
            chunk_id, value = struct.unpack("<4sI", stream.read_exact(8))
            if chunk_id == b"DONE":
                modification_time = value
                break
            if chunk_id != b"DATA" or value > SYNC_DATA_MAX:
                raise StreamClosed(f"bad SEND chunk {chunk_id!r}")
            data = stream.read_exact(value)
            if output is not None:
                output.write(data)
    finally:
        if output is not None:
            output.close()
    if error:
        return sync_fail(error)
    host_path.chmod(int(mode_text) & 0o7777 if mode_text.isdigit() else 0o644)
    os.utime(host_path, (modification_time, modification_time))
    return sync_status(b"OKAY", 0)


def send_file(stream: Stream, device_path: str, root: Path) -> None:
    """Answer RECV: DATA chunks then DONE, or FAIL with the reason.

    Sent in packets as full as the connection allows, as adbd's socket reads batch them: a DONE in a packet
    of its own made the host side wait out a delayed ACK on every pull (about 40 ms on loopback)."""
    packet = stream.connection.max_payload
    reply = b""
    try:
        with open(device_to_host(device_path, root), "rb") as source:
            while chunk := source.read(SYNC_DATA_MAX):
                reply += sync_status(b"DATA", len(chunk)) + chunk
                full = len(reply) - len(reply) % packet
                if full:
                    stream.write(reply[:full])
                    reply = reply[full:]
    except (OSError, SandboxEscape) as problem:
        stream.write(reply + sync_fail(f"{device_path}: {getattr(problem, 'strerror', None) or problem}"))
        return
    stream.write(reply + sync_status(b"DONE", 0))
