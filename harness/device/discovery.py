"""Turning `--adb-server` and `--device` options into checked Device objects, over one or many adb servers.

A device is known by its server and serial (`HOST:PORT/SERIAL`, or `localfilesystem:/PATH/SERIAL` for a
server on a unix socket, as the run's private one is): two hosts' servers may each have a phone of one serial
(the same model flashed alike, or `emulator-5554` on both), so a serial found on two servers must be written
with its server.
"""

from __future__ import annotations

import os
import socket
import sys

import adbutils

from harness.device.adb import AdbClient, AdbServer, split_label
from harness.device.device import Device, DeviceError

STATE_ADVICE = {
    "offline": "reconnect it (unplug and replug, or `adb reconnect offline`)",
    "unauthorized": "unlock it and accept the USB debugging prompt",
    "no permissions": "fix the udev rules for this device (see `adb devices -l`)",
    "recovery": "boot it into Android",
    "bootloader": "boot it into Android",
}


DEFAULT_PORT = 5037


def default_server() -> AdbServer:
    """The server adb itself would use: ADB_SERVER_SOCKET (tcp:HOST:PORT or localfilesystem:PATH), else
    ANDROID_ADB_SERVER_PORT, else 5037."""
    try:
        if socket_spec := os.environ.get("ADB_SERVER_SOCKET"):
            return AdbServer.parse(socket_spec, "ADB_SERVER_SOCKET")
        return AdbServer.parse(
            f"127.0.0.1:{os.environ.get('ANDROID_ADB_SERVER_PORT', DEFAULT_PORT)}", "ANDROID_ADB_SERVER_PORT"
        )
    except ValueError as error:
        raise DeviceError(f"{error} (or unset it)") from error


def server_listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def unix_server_listening(path: str) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            sock.connect(path)
            return True
    except OSError:
        return False


def client(server: AdbServer) -> AdbClient:
    if server.path:
        if not unix_server_listening(server.path):
            raise DeviceError(
                f"no adb server answers on {server.address}: start it with `adb -L {server.address} "
                f"server nodaemon` (or fix ADB_SERVER_SOCKET / --adb-server)"
            )
        return AdbClient(server=server)
    if not server_listening(server.port, server.host):
        raise DeviceError(f"no adb server answers on {server.address}: {_start_hint(server)}")
    return AdbClient(host=server.host, port=server.port)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _start_hint(server: AdbServer) -> str:
    """How to start the missing server, naming only what the user chose: a loopback server on this host (no
    other host reaches it), and a network-listening one (`adb -a`) only where the user named another host."""
    if server.host in LOOPBACK_HOSTS:
        start = f"start it with `adb -P {server.port} start-server` (it listens on loopback only)"
        if server != default_server():
            return f"{start}, or fix --adb-server {server.address}"
        return f"{start}, or fix ADB_SERVER_SOCKET" if os.environ.get("ADB_SERVER_SOCKET") else start
    return (
        f"start it on {server.host} with `adb -a -P {server.port} server nodaemon` (it then listens on that host's "
        f"network: only on a lab network you trust, see README's Security), or fix --adb-server {server.address}"
    )


def requested_serials(options: list[str]) -> list[str]:
    """`--device` values, else ANDROID_SERIAL; an empty list means: use emulated devices."""
    serials = [value.strip() for option in options for value in option.split(",") if value.strip()]
    if not serials and os.environ.get("ANDROID_SERIAL"):
        serials = [os.environ["ANDROID_SERIAL"]]
    seen = set()
    for serial in serials:
        if serial in seen:
            raise DeviceError(
                f"device {serial} is given twice: pass each --device once (one worker per device "
                f"is already enforced by its lock)"
            )
        seen.add(serial)
    return serials


def reachable(servers: list[AdbServer]) -> list[AdbClient]:
    """Clients of the servers that answer; each one that does not is one line on stderr, and the run goes
    on with the others unless none is left."""
    clients, unreachable = [], []
    for server in servers:
        try:
            clients.append(client(server))
        except DeviceError as error:
            unreachable.append(error)
    if not clients:  # one line for the run's end, whatever the number of servers
        if len(unreachable) == 1:
            raise unreachable[0]
        raise DeviceError(
            f"none of the adb servers {', '.join(s.address for s in servers)} answers: start them "
            f"(`adb -a -P PORT server nodaemon` on each host) or fix --adb-server"
        )
    for error in unreachable:
        print(f"qnnsuite: {error}; going on without it", file=sys.stderr)
    return clients


def select_across(clients: list[AdbClient], requested: list[str]) -> list[Device]:
    """Checked devices for `SERIAL` or `HOST:PORT/SERIAL` values (or `all`) over every server's devices."""
    listings = {address_of(adb): {info.serial: info.state for info in adb.list()} for adb in clients}
    if requested == ["all"]:
        ready = {server: [s for s, state in states.items() if state == "device"] for server, states in listings.items()}
        if not any(ready.values()):
            raise DeviceError(
                f"--device all: no device is attached and ready on {', '.join(listings)}: check `adb devices`"
            )
        return [device for adb in clients for device in select(adb, ready[address_of(adb)])]
    by_server: dict[str, list[str]] = {}
    for value in requested:
        server, serial = _locate(listings, value)
        by_server.setdefault(server, []).append(serial)
    return [device for adb in clients for device in select(adb, by_server.get(address_of(adb), []))]


def address_of(adb: adbutils.AdbClient) -> str:
    return (getattr(adb, "server", None) or AdbServer(adb.host, adb.port)).address


def _locate(listings: dict[str, dict[str, str]], value: str) -> tuple[str, str]:
    """(server address, serial) of one --device value; a bare serial must be on exactly one server."""
    server, serial = split_label(value)
    if server:
        if server not in listings:
            raise DeviceError(
                f"--device {value}: {server} is not a reachable adb server of this run; "
                f"name it with --adb-server {server}"
            )
        return server, serial
    holding = [server for server, states in listings.items() if value in states]
    if len(holding) > 1:
        raise DeviceError(
            f"device {value} is on {len(holding)} adb servers ({', '.join(holding)}): write it as "
            f"{holding[0]}/{value} to say which"
        )
    if not holding and len(listings) > 1:
        attached = ", ".join(f"{server}/{s} ({st})" for server, states in listings.items() for s, st in states.items())
        raise DeviceError(f"unknown device serial {value}: attached are {attached or 'none'}; check `adb devices`")
    return (holding or list(listings))[0], value


def select(adb: adbutils.AdbClient, serials: list[str]) -> list[Device]:
    """Checked devices for these serials of one server (`all` is resolved over every server: select_across)."""
    states = {info.serial: info.state for info in adb.list()}
    devices = []
    for serial in serials:
        state = states.get(serial)
        if state is None:
            attached = ", ".join(f"{s} ({st})" for s, st in states.items()) or "none"
            raise DeviceError(f"unknown device serial {serial}: attached are {attached}; check `adb devices`")
        if state != "device":
            raise DeviceError(f"device {serial} is {state}: {STATE_ADVICE.get(state, 'check `adb devices`')}")
        devices.append(Device(serial, adb))
    return devices
