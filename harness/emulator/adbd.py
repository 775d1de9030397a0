"""One emulated Android device per OS process: the device itself (its sandbox file system, properties,
fault switches, and the jailed commands it starts) and its entry point (`python -m harness.emulator.adbd`).

A real adb server accepts it after `adb connect 127.0.0.1:PORT`, once it has proved to hold the private key
whose public half the device was given (CNXN, then AUTH as real adbd does; anything else is hung up on).
Commands run on the host inside a sandbox directory that stands in for the device file system (jailed with
bubblewrap where it works: harness.emulator.jail), so the harness drives it exactly like a phone.
The adb wire protocol (packets, handshake, streams) is harness/emulator/adbd_transport.py; the services a
stream opens (shell, exec, sync) are harness/emulator/adbd_services.py.
Protocol references: AOSP packages/modules/adb protocol.txt, SYNC.TXT, shell_protocol.h, file_sync_protocol.h.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.emulator import device_log, jail, shell_paths
from harness.emulator.adb_auth import PublicKey, load_keys
from harness.emulator.adbd_services import device_to_host, find_service
from harness.emulator.adbd_transport import FEATURES, Connection, Stream, kill_process_group
from harness.emulator.device_fs import AFTER_PROGRAMS, active_faults
from harness.emulator.shell_paths import rewrite_device_paths
from harness.files import write_atomically

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


ACCEPT_RETRY_S = 0.1  # after accept() failed (EMFILE: too many open files), try again this much later
JAIL_ENV = "QNNSUITE_DEVICE_JAIL"  # "off": device shells without bubblewrap (to test the fallback)


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
                threading.Thread(target=Connection(device, sock, find_service).serve, daemon=True).start()
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
