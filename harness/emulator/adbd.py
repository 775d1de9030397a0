"""Device side of the adb transport protocol: one emulated Android device per OS process.

A real adb server accepts it after `adb connect 127.0.0.1:PORT`, once it has proved to hold the private key
whose public half the device was given (CNXN, then AUTH as real adbd does; anything else is hung up on).
Commands run on the host inside a sandbox directory that stands in for the device file system (jailed with
bubblewrap where it works: harness.emulator.jail), so the harness drives it exactly like a phone.
Protocol references: AOSP packages/modules/adb protocol.txt, SYNC.TXT, shell_protocol.h, file_sync_protocol.h.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import posixpath
import queue
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.emulator import device_log, jail, shell_paths
from harness.emulator.adb_auth import TOKEN_SIZE, PublicKey, load_keys
from harness.emulator.device_fs import AFTER_PROGRAMS, active_faults
from harness.emulator.shell_paths import rewrite_device_paths
from harness.files import write_atomically
from harness.runner import contract as runner_contract

A_CNXN, A_OPEN, A_OKAY, A_CLSE, A_WRTE, A_AUTH = (
    int.from_bytes(name, "little") for name in (b"CNXN", b"OPEN", b"OKAY", b"CLSE", b"WRTE", b"AUTH")
)
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
# A connection that has not authenticated within this long is hung up on, so idle ones cannot pile up.
HANDSHAKE_TIMEOUT_S = 10.0
MAX_AUTH_ATTEMPTS = 8  # signatures tried on one connection (the server tries each key it has)
MIN_PAYLOAD = 4096
# A device shell's environment is a device's, never the run's (a CI host's credentials must not reach a
# shell that other code, or another account through a server, may run): these fixed values, and from adbd's
# own environment (the launcher's device_env) only what the device's commands need to find the runner and
# its toolchain: the suite's own QNNSUITE_* variables, and the loader, Python, SDK and heap settings the
# runner (or its fresh-process fallback) starts with.
DEVICE_ENVIRONMENT = {
    "HOME": "/data",
    "TMPDIR": "/data/local/tmp",
    "ANDROID_DATA": "/data",
    "ANDROID_ROOT": "/system",
    "EXTERNAL_STORAGE": "/sdcard",
    "ANDROID_STORAGE": "/storage",
    "LANG": "C.UTF-8",
    "SHELL": "/bin/sh",
}
DEVICE_PATH = "/usr/local/bin:/usr/bin:/bin"  # the host commands a device shell runs, after /system/bin
PASSED_VARIABLES = (
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "QNN_SDK_ROOT",
    "MALLOC_PERTURB_",
    "GLIBC_TUNABLES",
    "ADSP_LIBRARY_PATH",
)
PASSED_PREFIX = "QNNSUITE_"


def device_environment(host: dict[str, str]) -> dict[str, str]:
    """The environment a device shell starts from: DEVICE_ENVIRONMENT plus the passed variables of `host`."""
    passed = {name: value for name, value in host.items() if name in PASSED_VARIABLES or name.startswith(PASSED_PREFIX)}
    return {**passed, **DEVICE_ENVIRONMENT}


MAX_SYNC_PATH = 1024  # adbd's limit for a sync request's path
ACCEPT_RETRY_S = 0.1  # after accept() failed (EMFILE: too many open files), try again this much later
# 0x01000001 is the version from which neither side verifies data checksums, so we send 0.
PROTOCOL_VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
SYNC_DATA_MAX = 64 * 1024
HEADER = struct.Struct("<6I")
FEATURES = "shell_v2,cmd"  # no stat_v2/ls_v2/sendrecv_v2: only the v1 sync requests are served

# Without the shell protocol a host hang-up is also the end of stdin: input sent just before it still reaches
# the command (`adb exec-in 'cat > f' < f`), which gets this long to finish before its process group is killed.
RAW_HANGUP_GRACE_S = 2.0
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN = 0, 1, 2, 3, 4
JAIL_ENV = "QNNSUITE_DEVICE_JAIL"  # "off": device shells without bubblewrap (to test the fallback)


class SandboxEscape(ValueError):
    """A device path that cannot be served: it resolves outside the device's root directory, or holds a NUL."""


class MalformedPacket(Exception):
    """A packet no adb server sends (bad magic, oversized): the connection is hung up on."""


class StreamClosed(Exception):
    """The stream (or its whole connection) is gone; the service using it stops."""


def device_to_host(device_path: str, root: Path) -> Path:
    """Map a device path to its host path under `root`; symlinks may not lead out of the sandbox."""
    if "\0" in device_path:
        raise SandboxEscape(f"{device_path!r}: a path cannot hold a NUL byte")
    relative = posixpath.normpath("/" + device_path).lstrip("/")
    host_path = root / relative if relative else root
    if not host_path.resolve().is_relative_to(root.resolve()):
        raise SandboxEscape(f"{device_path}: outside the device sandbox")
    return host_path


class Device:
    """State shared by all connections to one emulated device: sandbox, properties, faults, live streams."""

    def __init__(
        self,
        root: Path,
        props_file: Path,
        banner_name: str | None,
        keys: list[PublicKey],
        private: tuple[Path, ...] = (),
    ) -> None:
        """private: host folders the jail hides from this device's commands (the run's work folder)."""
        self.root = root.resolve()
        self.private = private
        self.keys = keys  # the only hosts this device lets in
        self.props_file = props_file.resolve()
        self.faults_file = self.root / ".faults.json"
        self.banner_name = banner_name
        self.streams: set[Stream] = set()
        self.lock = threading.Lock()
        self.drop_budget: int | None = None
        self.programs = 0  # .pte files pushed to this device since it started
        for directory in ("data/local/tmp", "system/bin", "sdcard"):
            (self.root / directory).mkdir(parents=True, exist_ok=True)
        getprop = self.root / "system/bin/getprop"
        getprop.write_text(GETPROP_SCRIPT.format(python=sys.executable, props_file=str(self.props_file)))
        getprop.chmod(0o755)
        df = self.root / "system/bin/df"
        df.write_text(DF_SCRIPT)
        df.chmod(0o755)
        logcat = self.root / "system/bin/logcat"
        logcat.write_text(
            LOGCAT_SCRIPT.format(
                python=shlex.quote(sys.executable), repo=shlex.quote(str(Path(__file__).resolve().parents[2]))
            )
        )
        logcat.chmod(0o755)
        (self.root / device_log.LOG_PATH.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        self.jail_problem = "switched off" if os.environ.get(JAIL_ENV) == "off" else jail.unavailable_reason()
        if self.jail_problem:
            print(
                f"adbd: device shells are not jailed ({self.jail_problem}); paths are rewritten and host paths "
                f"refused instead",
                file=sys.stderr,
                flush=True,
            )

    def raw_faults(self) -> dict[str, Any]:
        """The faults file as it is now, dormant switches included; missing or half-edited means no faults."""
        try:
            return json.loads(self.faults_file.read_text()) or {}
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def load_faults(self) -> dict[str, Any]:
        """The fault switches in force now (none while `after_programs` holds them back)."""
        return active_faults(self.raw_faults())

    def count_program(self) -> None:
        """A program is being pushed: past the first `after_programs` ones, held-back faults arm (device_fs)."""
        with self.lock:
            self.programs += 1
            faults = self.raw_faults()
            exempt = faults.get(AFTER_PROGRAMS)
            if isinstance(exempt, int) and 0 < exempt < self.programs:
                write_atomically(self.faults_file, json.dumps({**faults, AFTER_PROGRAMS: 0}))

    def read_faults(self) -> dict[str, Any]:
        """Re-read the fault switches (a test flips them from another process); arms a pending drop."""
        faults = self.load_faults()
        with self.lock:
            if self.drop_budget is None and isinstance(faults.get("drop_after_bytes"), int):
                self.drop_budget = faults["drop_after_bytes"]
        return faults

    def take_send_budget(self, size: int) -> tuple[int, bool]:
        """How many of `size` bytes may still cross the link (either way), and whether the device
        must vanish after them."""
        with self.lock:
            if self.drop_budget is None:
                return size, False
            allowed = min(size, self.drop_budget)
            self.drop_budget -= allowed
            if self.drop_budget > 0:
                return allowed, False
            self.drop_budget = None
            write_atomically(self.faults_file, json.dumps({**self.raw_faults(), "drop_after_bytes": None}))
            return allowed, True

    def banner(self) -> bytes:
        """The CNXN banner adb shows in `adb devices -l`."""
        props = json.loads(self.props_file.read_text())
        name = self.banner_name or props.get("ro.product.name", "emulated")
        fields = (
            f"ro.product.name={name}",
            f"ro.product.model={props.get('ro.product.model', name)}",
            f"ro.product.device={props.get('ro.product.device', name)}",
            f"features={FEATURES}",
        )
        return ("device::" + ";".join(fields)).encode()

    def start_command(self, command: str, separate_stderr: bool) -> subprocess.Popen[bytes]:
        """Run a device command with the host shell in its own process group, inside the sandbox: jailed,
        or (without bubblewrap) with its device paths rewritten and any host path refused."""
        env = dict(
            device_environment(dict(os.environ)),
            ANDROID_ROOT_SANDBOX=str(self.root),
            EMULATED_FAULTS_FILE=str(self.faults_file),
        )
        if self.read_faults().get("storage_full"):
            env["EMULATED_STORAGE_FULL"] = "1"
        env[device_log.LOG_ENV] = (
            device_log.LOG_PATH if not self.jail_problem else str(device_to_host(device_log.LOG_PATH, self.root))
        )
        if not self.jail_problem:
            env.update(PATH=f"/system/bin:{DEVICE_PATH}")
            argv = jail.jail_argv(self.root, ["/bin/sh", "-c", command], "/data/local/tmp", env, self.private)
        else:
            env.update(
                PATH=f"{self.root}/system/bin:{DEVICE_PATH}",
                HOME=str(self.root / "data"),
                TMPDIR=str(self.root / "data/local/tmp"),
            )
            refused = shell_paths.refusal(command, self.root)
            argv = (
                ["/bin/sh", "-c", 'echo "$1" >&2; exit 126', "refused", refused]
                if refused
                else ["/bin/sh", "-c", rewrite_device_paths(command, self.root)]
            )
        return subprocess.Popen(
            argv,
            cwd=self.root / "data/local/tmp",
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT,
            start_new_session=True,
        )

    def vanish_if(self, stage: str, connection: Connection) -> bool:
        """Fault `freeze_on` = push | run | pull: the device process stops itself (SIGSTOP) at that stage.
        Fault `vanish_on` = push | run | pull: the device disappears at that stage (once). With
        `vanish_permanently` the device process dies (unplugged for good); otherwise only the link
        drops and adb reconnects, as after a flaky cable. Returns True if it vanished."""
        faults = self.read_faults()
        if faults.get("freeze_on") == stage:  # keeps its link but answers nothing more, as a wedged phone
            write_atomically(self.faults_file, json.dumps({**faults, "freeze_on": None}))
            os.kill(os.getpid(), signal.SIGSTOP)
        if faults.get("vanish_on") != stage:
            return False
        write_atomically(self.faults_file, json.dumps({**faults, "vanish_on": None}))
        if faults.get("vanish_permanently"):
            self.shutdown()
            os._exit(1)
        connection.drop()
        return True

    def shutdown(self) -> None:
        """Close every stream, which kills the commands they run."""
        with self.lock:
            streams = list(self.streams)
        for stream in streams:
            stream.on_remote_close()
            kill_process_group(stream.process)


GETPROP_SCRIPT = """#!{python} -S
import json, sys
props = json.load(open({props_file!r}))
if len(sys.argv) > 1:
    print(props.get(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
else:
    for key in sorted(props):
        print(f"[{{key}}]: [{{props[key]}}]")
"""


# With the storage_full fault the device's df agrees with its failing pushes: nothing available.
DF_SCRIPT = """#!/bin/sh
if [ -n "$EMULATED_STORAGE_FULL" ]; then
  echo "Filesystem     1K-blocks    Used Available Use% Mounted on"
  echo "/dev/block/dm-5 1000000 1000000         0 100% /data"
else
  exec /bin/df "$@"
fi
"""


# The device's logcat reads the device log buffer (harness/emulator/device_log.py, logcat.py).
LOGCAT_SCRIPT = """#!/bin/sh
PYTHONPATH={repo}"${{PYTHONPATH:+:$PYTHONPATH}}" exec {python} -S -m harness.emulator.logcat "$@"
"""


class Connection:
    """One transport connection from the adb server: authentication, then packets dispatched to streams."""

    def __init__(self, device: Device, sock: socket.socket) -> None:
        self.device = device
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
        service = find_service(destination)
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

    def run(self, service: Callable[[Stream], None]) -> None:
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


def find_service(destination: str) -> Callable[[Stream], None] | None:
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


def kill_process_group(process: subprocess.Popen[bytes] | None) -> None:
    """Kill a device command with everything it started (it leads its own process group)."""
    if process is not None and process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


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


def serve(device: Device, port_file: Path) -> None:
    """Accept adb server connections on a loopback port until SIGTERM/SIGINT."""
    listener = socket.create_server(("127.0.0.1", 0))
    write_atomically(port_file, str(listener.getsockname()[1]))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError as error:  # EMFILE and friends lose one connection, not the device
                print(f"adbd: accept failed ({error}); retrying", file=sys.stderr, flush=True)
                time.sleep(ACCEPT_RETRY_S)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=Connection(device, sock).serve, daemon=True).start()
            except (OSError, RuntimeError) as error:  # no thread or file left for it
                print(f"adbd: dropped a connection ({error})", file=sys.stderr, flush=True)
                sock.close()
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        device.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="host directory standing in for the device's /")
    parser.add_argument("--props-file", type=Path, required=True, help="JSON object of system properties")
    parser.add_argument("--port-file", type=Path, required=True, help="receives the listening port")
    parser.add_argument("--banner-name", help="product name shown by `adb devices -l`")
    parser.add_argument(
        "--adb-key",
        type=Path,
        required=True,
        help="adbkey.pub of the adb server allowed in (adb_keys format, one key a line)",
    )
    parser.add_argument(
        "--private",
        type=Path,
        action="append",
        default=[],
        help="a host folder the device's commands must never see (repeatable): the run's work folder",
    )
    arguments = parser.parse_args()
    try:
        keys = load_keys(arguments.adb_key)
    except (OSError, ValueError) as error:
        parser.exit(2, f"adbd: cannot read --adb-key: {error}\n")
    device = Device(arguments.root, arguments.props_file, arguments.banner_name, keys, tuple(arguments.private))
    serve(device, arguments.port_file)


if __name__ == "__main__":
    main()
