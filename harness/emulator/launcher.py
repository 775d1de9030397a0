"""An emulated fleet: a private real adb server on a unix socket plus one emulated device per SoC.

The private server listens on `localfilesystem:WORKDIR/adb-server/adb.sock` (adb's `-L`), in a folder only
this user may enter: an adb server authenticates no client, so a loopback port would hand every local
account root shells on the devices. The harness's client reaches it through
harness/device/adb.py; the stock adb client with `ADB_SERVER_SOCKET=localfilesystem:PATH`.

Or, for `python -m harness emulate` (harness/emulator/serve.py), the user's own TCP adb server when the user
names one (started as a child of ours when none answers on its port): the devices then trust exactly that
server's keys, the user's ~/.android/adbkey and ADB_VENDOR_KEYS (adb_auth.user_server_keys), never anyone's.

Each device is a `harness.emulator.adbd` process listening on a loopback port, connected to the server with
`adb connect`, so stock adb tooling sees ordinary `127.0.0.1:PORT` devices. Any local account can open that
port, but the device answers only after the adb handshake's AUTH verifies with the one server key it trusts
(adbd.py), so the port gives nothing but a hang-up. (adb can `connect localfilesystem:PATH` too, but such a
serial holds slashes, which the `SERVER/SERIAL` device labels cannot carry.) The server gets a key pair of its
own in the fleet's folder (its HOME and ADB_VENDOR_KEYS), and each device trusts exactly that public key.
Everything started is owned by PID and dies with the process that started it, even if that one is SIGKILLed
(harness/process/lifetime.py). A server that comes back on the fleet's socket mid-run knows no device:
reconnect_devices connects them again, and the fleet's stop ends whichever server is on its socket then.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.device.adb import SOCKET_PATH_MAX, AdbServer
from harness.emulator import adb_auth, phone
from harness.files import write_atomically
from harness.process.lifetime import die_with_parent
from harness.qnn import soc as soc_table
from harness.user_state import UnsafeStateDir, checked_dir, state_dir

PROJECT_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
GENERIC_PLATFORM = "emulated"  # ro.board.platform of an emulated (x86) device whose SoC has no codename
# No USB scan, no emulator port probing, no mDNS: the private server only knows the devices we connect.
ADB_SERVER_ENV = {"ADB_USB": "0", "ADB_EMU": "0", "ADB_MDNS": "0"}
# Where adb would otherwise look for keys and its home: the private server must use only its own.
ADB_ENV_DROPPED = ("ANDROID_USER_HOME", "ANDROID_SDK_HOME", "ANDROID_PREFS_ROOT", "ADB_VENDOR_KEYS")


_CONNECTED = re.compile(r"[A-Za-z0-9._-]+:[0-9]+")  # the serial of a device `adb connect` attached: HOST:PORT


class FleetError(RuntimeError):
    """The emulated fleet could not be started or used."""


@dataclass(frozen=True)
class EmulatedDeviceInfo:
    """One emulated device as the rest of the harness sees it."""

    soc: str
    serial: str
    root: Path
    pid: int
    faults_file: Path


def device_properties(soc: str, name: str, as_phone: bool = False, index: int = 0) -> dict[str, str]:
    """System properties of an emulated device of the given SoC; `as_phone`: as the index-th phone shows them
    (harness/emulator/phone.py), else with ro.soc.model and the host ABI (commands are host binaries)."""
    codename = next((name for name, socs in soc_table.PLATFORM_CODENAMES.items() if socs == (soc,)), GENERIC_PLATFORM)
    identity = phone.soc_properties(soc, index) if as_phone else {"ro.soc.model": soc, "ro.board.platform": codename}
    return {
        **identity,
        "ro.soc.manufacturer": "QTI",
        "ro.product.model": f"Emulated {soc}",
        "ro.product.name": name,
        "ro.product.device": name,
        "ro.product.manufacturer": "QUALCOMM",
        "ro.product.cpu.abi": phone.PHONE_ABI if as_phone else "x86_64",
        "ro.build.version.sdk": "35",
        "ro.serialno": f"emulated-{name}",
    }


def server_socket(server: AdbServer | int, timeout: float) -> socket.socket:
    """A connected socket to the server (an int: a loopback TCP port)."""
    if isinstance(server, int):
        return socket.create_connection(("127.0.0.1", server), timeout=timeout)
    if not server.path:
        return socket.create_connection((server.host, server.port), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(server.path)
    except OSError:
        sock.close()
        raise
    return sock


def host_request(server: AdbServer | int, service: str, timeout: float = 10.0) -> str:
    """One request to the adb server's host protocol over a raw socket (`server` an int: a loopback port).

    Used instead of adbutils for server control because adbutils starts a server on the default port when
    it cannot reach the one it was given.
    """
    with server_socket(server, timeout) as sock:
        encoded = service.encode()
        sock.sendall(b"%04x" % len(encoded) + encoded)
        reply = sock.makefile("rb")
        status = reply.read(4)
        if status == b"OKAY" and service == "host:kill":
            return ""
        length_text = reply.read(4)
        payload = reply.read(int(length_text, 16)).decode(errors="replace") if length_text else ""
        if status != b"OKAY":
            raise FleetError(f"adb server refused {service!r}: {payload or status!r}")
        return payload


def private_socket_path(workdir: Path) -> Path:
    """Where the fleet's own server listens: in a 0700 folder of `workdir`, or, when that path is longer than
    a unix socket's address may be, in the user's 0700 state folder (harness/user_state.py) under a name of
    its own."""
    path = workdir / "adb-server" / "adb.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    try:
        folder = state_dir("adb-servers")
    except UnsafeStateDir as error:
        raise FleetError(str(error)) from error
    path = folder / f"{os.getpid()}-{secrets.token_hex(4)}" / "adb.sock"
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        raise FleetError(
            f"no private place for the adb server's socket: {workdir} and the state folder {folder} are "
            f"too deep for a unix socket's {SOCKET_PATH_MAX} bytes; set XDG_RUNTIME_DIR to a shorter folder"
        )
    return path


def server_environment(workdir: Path) -> dict[str, str]:
    """The environment of the fleet in `workdir`'s own adb server: a private HOME keeps the server's key and its
    per-port marker files out of the user's ~/.android, and the key there is the one the devices trust. A
    server started again on the fleet's socket by another tool with this environment signs with that key, so
    the devices accept it when it connects them again (reconnect_devices)."""
    home = Path(workdir).resolve() / "adb-home"
    env = {key: value for key, value in os.environ.items() if key not in ADB_ENV_DROPPED}
    env.update(ADB_SERVER_ENV, HOME=str(home), ADB_VENDOR_KEYS=str(home / ".android" / "adbkey"))
    return env


def reconnect_devices(server: AdbServer, serials: list[str], within_s: float) -> dict[str, str] | None:
    """Wait at most `within_s` for a server to answer on `server` and list these devices as `device`,
    sending `host:connect:` again for each HOST:PORT one it does not list: a server started afresh on the
    socket knows no device until then (an emulated adbd accepts it when it signs with the key the device
    trusts: server_environment); a USB device comes back by itself. Returns the states last seen
    (serial -> state, "absent" when unlisted), or None when no server answered."""
    deadline = time.monotonic() + within_s
    states: dict[str, str] | None = None
    while True:
        try:
            listed = dict(
                line.split("\t", 1) for line in host_request(server, "host:devices", 2.0).splitlines() if "\t" in line
            )
            states = {serial: listed.get(serial, "absent") for serial in serials}
            if all(state == "device" for state in states.values()):
                return states
            for serial in [
                serial for serial, state in states.items() if state == "absent" and _CONNECTED.fullmatch(serial)
            ]:
                left = deadline - time.monotonic()
                if left > 0:  # adb answers `connect` after the handshake (or its own failure), so bounded too
                    host_request(server, f"host:connect:{serial}", timeout=max(1.0, min(10.0, left)))
        except (OSError, FleetError, ValueError):  # no server (yet), or one that went away while asked
            pass
        if time.monotonic() >= deadline:
            return states
        time.sleep(0.2)


def free_port() -> int:
    """A loopback port nobody listens on now, from the ephemeral range (so never adb's default 5037)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kill_sandbox_processes(root: Path) -> None:
    """Kill leftover device commands (they carry ANDROID_ROOT_SANDBOX=root), as a vanished device loses them."""
    marker = f"ANDROID_ROOT_SANDBOX={root.resolve()}".encode()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def end_process(process: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
    """Signal a child we started and reap it, escalating to SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class EmulatorFleet:
    """A private adb server and emulated devices; a context manager that cleans up everything it started."""

    def __init__(
        self,
        socs: list[str],
        workdir: Path,
        device_env: dict[str, str] | None = None,
        as_phone: bool = False,
        user_server: AdbServer | None = None,
        private_dirs: tuple[Path, ...] = (),
    ) -> None:
        """device_env: the environment device commands run in (the QNN toolchain's, for the runners: the suite's
        compiled runner and the pybindings one, each a fresh process in the device's jail).
        user_server: serve the devices on the user's TCP adb server there (started if none answers on its
        loopback port); without it the fleet's own server listens on a unix socket in `workdir`.
        private_dirs: host folders, besides `workdir`, that the devices' jails hide (the run's work folder)."""
        self.socs = list(socs)
        self.device_env = device_env
        self.as_phone = as_phone
        self.user_server = user_server
        self.workdir = Path(workdir).resolve()
        self.private_dirs = (self.workdir, *(Path(folder).resolve() for folder in private_dirs))
        self.server = user_server or AdbServer.unix(private_socket_path(self.workdir))
        self.devices: list[EmulatedDeviceInfo] = []
        self._server: subprocess.Popen[bytes] | None = None
        self._device_processes: dict[str, subprocess.Popen[bytes]] = {}
        self.server_public_key = self.workdir / "adb-home" / ".android" / "adbkey.pub"

    @property
    def adb_port(self) -> int:
        """The TCP port of a user's server (0 for the fleet's own unix socket server)."""
        return self.server.port

    @property
    def started_pids(self) -> list[int]:
        """Every process this fleet started (the adb server first), kept after stop() for leak checks."""
        processes = [self._server] if self._server else []
        processes += list(self._device_processes.values())
        return [process.pid for process in processes]

    def __enter__(self) -> EmulatorFleet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> EmulatorFleet:
        """Start the server and one device per SoC; on any failure stop what was started and re-raise."""
        atexit.register(self.stop)
        try:
            self._start_server()
            for soc in self.socs:
                self._add_device(soc, {})
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self) -> None:
        import adbutils  # the wheel bundles the adb binary

        adb = os.environ.get("ADBUTILS_ADB_PATH") or adbutils.adb_path()
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.user_server is not None:
            self._use_user_server(adb, self.user_server.port)
            return
        try:  # only this user may reach the socket: its folder is a 0700 directory of ours, checked
            checked_dir(Path(self.server.path).parent)
        except UnsafeStateDir as error:
            raise FleetError(str(error)) from error
        private_key = self.server_public_key.with_suffix("")
        private_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = server_environment(self.workdir)
        if not private_key.exists():
            keygen = subprocess.run([adb, "keygen", str(private_key)], env=env, capture_output=True, text=True)
            if keygen.returncode != 0 or not self.server_public_key.exists():
                raise FleetError(
                    f"`adb keygen {private_key}` failed ({keygen.stderr.strip()[:200]}): "
                    f"check that {private_key.parent} is writable"
                )
        log = open(self.workdir / "adb-server.log", "wb")
        self._server = subprocess.Popen(
            [adb, "-L", self.server.address, "server", "nodaemon"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
        log.close()
        self._wait_for("the adb server to answer", self._server_answers)

    def _use_user_server(self, adb: str, port: int) -> None:
        """The user's adb server on `port` (started, as our child, with the user's own environment and keys,
        when none answers); the devices will trust that server's public keys and no other."""
        if not self._answers_on(port):
            log = open(self.workdir / "adb-server.log", "wb")
            self._server = subprocess.Popen(
                [adb, "-P", str(port), "server", "nodaemon"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
            log.close()
            self._wait_for("the adb server to answer", self._server_answers)
            self._wait_for(
                "the adb server's key (adb makes ~/.android/adbkey when it starts)",
                lambda: any(path.is_file() for path in adb_auth.user_key_files(dict(os.environ))),
            )
        try:
            keys = adb_auth.user_server_keys(adb, dict(os.environ))
        except adb_auth.AdbKeyError as error:
            raise FleetError(str(error)) from error
        self.server_public_key = self.workdir / "trusted_adb_keys"
        write_atomically(self.server_public_key, "".join(f"{key}\n" for key in keys))

    @staticmethod
    def _answers_on(port: int) -> bool:
        try:
            return bool(host_request(port, "host:version", timeout=1.0))
        except (OSError, FleetError):
            return False

    def _server_answers(self) -> bool:
        assert self._server is not None
        if self._server.poll() is not None:
            log = self.workdir / "adb-server.log"
            lines = (
                [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
            )
            raise FleetError(
                f"adb server exited with {self._server.returncode} ({lines[-1].strip()[:200] if lines else 'no output'}); "
                f"see {log}"
            )
        try:
            return bool(host_request(self.server, "host:version", timeout=1.0))
        except OSError:
            return False

    def add_device(self, soc: str, **faults: Any) -> EmulatedDeviceInfo:
        """Start one more device, with faults already set (e.g. unauthorized=True), and connect it."""
        return self._add_device(soc, faults)

    def _add_device(self, soc: str, faults: dict[str, Any]) -> EmulatedDeviceInfo:
        name, index = soc.lower(), 1
        while name in self._device_processes:  # a second device of one SoC gets its own directory
            index += 1
            name = f"{soc.lower()}-{index}"
        device_dir = self.workdir / name
        root, props_file, port_file = device_dir / "root", device_dir / "props.json", device_dir / "port"
        root.mkdir(parents=True, exist_ok=True)
        port_file.unlink(missing_ok=True)
        properties = device_properties(soc, name, self.as_phone, index=len(self._device_processes))
        write_atomically(props_file, json.dumps(properties, indent=1))
        faults_file = root / ".faults.json"
        write_atomically(faults_file, json.dumps(faults))
        env = self.device_env
        log = open(device_dir / "adbd.log", "wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.emulator.adbd",
                "--root",
                str(root),
                "--props-file",
                str(props_file),
                "--port-file",
                str(port_file),
                "--banner-name",
                name,
                "--adb-key",
                str(self.server_public_key),
                *[word for folder in self.private_dirs for word in ("--private", str(folder))],
            ],
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=die_with_parent,
        )
        log.close()
        self._device_processes[name] = process

        def port_written() -> bool:
            if process.poll() is not None:
                raise FleetError(f"emulated {soc} exited with {process.returncode}; see {device_dir / 'adbd.log'}")
            return port_file.exists()

        self._wait_for(f"emulated {soc} to listen", port_written)
        serial = f"127.0.0.1:{int(port_file.read_text())}"
        expected = "offline" if faults.get("offline") else "unauthorized" if faults.get("unauthorized") else "device"
        # The server answers `connect` only after the handshake, which an offline device never gives.
        try:
            host_request(self.server, f"host:connect:{serial}", timeout=1.0 if expected == "offline" else 10.0)
        except TimeoutError:
            if expected != "offline":
                raise
        self._wait_for(f"{serial} to be {expected}", lambda: self.device_states().get(serial) == expected)
        info = EmulatedDeviceInfo(
            soc=soc, serial=serial, root=root.resolve(), pid=process.pid, faults_file=faults_file.resolve()
        )
        self.devices.append(info)
        return info

    def device_states(self) -> dict[str, str]:
        """serial -> state (device, offline, unauthorized, ...) as the adb server lists them."""
        listing = host_request(self.server, "host:devices")
        return dict(line.split("\t", 1) for line in listing.splitlines() if "\t" in line)

    def device(self, serial: str) -> EmulatedDeviceInfo:
        """The live device with this serial; FleetError names the known ones otherwise."""
        for info in self.devices:
            if info.serial == serial:
                return info
        raise FleetError(f"no emulated device {serial!r}; known: {[info.serial for info in self.devices]}")

    def set_faults(self, serial: str, **faults: Any) -> None:
        """Merge fault switches into the device's faults file (None switches one off); seen at the next request."""
        faults_file = self.device(serial).faults_file
        current = json.loads(faults_file.read_text()) if faults_file.exists() else {}
        write_atomically(faults_file, json.dumps({**current, **faults}))

    def stop_device(self, serial: str) -> None:
        """SIGKILL the device process and the commands it ran: the device vanishes as if unplugged."""
        info = self.device(serial)
        end_process(self._device_processes[info.root.parent.name], signal.SIGKILL)
        kill_sandbox_processes(info.root)
        self.devices.remove(info)

    def stop(self) -> None:
        """Stop every device, then the adb server; idempotent."""
        for name, process in self._device_processes.items():
            end_process(process)
            kill_sandbox_processes(self.workdir / name / "root")
        if self.user_server is not None and self._server is None:  # the user's server goes on, without them
            for info in self.devices:
                try:
                    host_request(self.server, f"host:disconnect:{info.serial}", timeout=STOP_TIMEOUT_S)
                except (OSError, FleetError):
                    pass
        self.devices.clear()
        if self._server is not None:
            # On the private socket, a server started again by another tool (reconnect_devices) is ended too:
            # it served this run's devices, and its socket goes now.
            if self._server.poll() is None or self.user_server is None:
                try:
                    host_request(self.server, "host:kill", timeout=STOP_TIMEOUT_S)
                except (OSError, FleetError, ValueError):
                    pass
            end_process(self._server)
            if self.server.path:  # its socket (and, in the state folder, the socket's own folder) goes too
                Path(self.server.path).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    Path(self.server.path).parent.rmdir()
        atexit.unregister(self.stop)

    def _wait_for(self, what: str, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not condition():
            if time.monotonic() > deadline:
                raise FleetError(f"timed out after {START_TIMEOUT_S:.0f} s waiting for {what}")
            time.sleep(0.05)

    def describe(self) -> dict[str, Any]:
        """JSON-ready description: the adb server (as ADB_SERVER_SOCKET names it) and every device."""
        return {
            "adb_server": self.server.address,
            "devices": [
                {key: str(value) if isinstance(value, Path) else value for key, value in asdict(info).items()}
                for info in self.devices
            ],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soc", action="append", required=True, help="SoC of one device (repeatable)")
    parser.add_argument("--workdir", type=Path, required=True, help="directory for device roots and logs")
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with EmulatorFleet(arguments.soc, arguments.workdir) as fleet:
        print(json.dumps(fleet.describe()), flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
