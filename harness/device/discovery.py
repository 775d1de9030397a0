"""Turning `--device` options into checked Device objects on a given adb server."""
from __future__ import annotations

import os
import socket

import adbutils

from harness.device.adb import AdbClient
from harness.device.device import Device, DeviceError

STATE_ADVICE = {
    "offline": "reconnect it (unplug and replug, or `adb reconnect offline`)",
    "unauthorized": "unlock it and accept the USB debugging prompt",
    "no permissions": "fix the udev rules for this device (see `adb devices -l`)",
    "recovery": "boot it into Android",
    "bootloader": "boot it into Android",
}


def default_server_port() -> int:
    return int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))


def server_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, port)) == 0


def client(port: int) -> AdbClient:
    if not server_listening(port):
        raise DeviceError(f"no adb server on 127.0.0.1:{port}: start one with `adb -P {port} start-server` "
                          f"(or set ANDROID_ADB_SERVER_PORT to the port yours uses)")
    return AdbClient(host="127.0.0.1", port=port)


def requested_serials(options: list[str]) -> list[str]:
    """`--device` values, else ANDROID_SERIAL; an empty list means: use emulated devices."""
    serials = [value.strip() for option in options for value in option.split(",") if value.strip()]
    if not serials and os.environ.get("ANDROID_SERIAL"):
        serials = [os.environ["ANDROID_SERIAL"]]
    seen = set()
    for serial in serials:
        if serial in seen:
            raise DeviceError(f"device {serial} is given twice: pass each --device once (one worker per device "
                              f"is already enforced by its lock)")
        seen.add(serial)
    return serials


def select(adb: adbutils.AdbClient, serials: list[str]) -> list[Device]:
    """Checked devices for the serials (or every ready device for `all`)."""
    states = {info.serial: info.state for info in adb.list()}
    if serials == ["all"]:
        serials = [serial for serial, state in states.items() if state == "device"]
        if not serials:
            raise DeviceError("--device all: no device is attached and ready: check `adb devices`")
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
