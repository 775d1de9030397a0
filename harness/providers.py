"""Where a run's devices come from, behind one contract (in the spirit of Mobly's controllers).

A provider owns start and stop: `EmulatedFleet` starts a private adb server (on a unix socket in the run's
0700 work folder: no other local account reaches it) and one emulated device per SoC for the run and stops all of it; `AttachedDevices` checks devices already on an adb server (phones,
or emulated devices served by `python -m harness emulate`) and leaves them as they were. Each device's
kind (harness/device/kinds/) then owns its payload and capabilities. `provider_for` picks one from the
options, as pytest-embedded's factory picks a device service. `restore_server` is the providers' side of a
dropped adb server: the device layer (harness/device/pool.py) calls it from any worker, and it waits (bounded)
for the server and connects again the devices `adb connect` had attached.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from harness.device import discovery, kinds
from harness.device.adb import AdbServer
from harness.device.device import DeviceError
from harness.device.pool import DeviceSpec
from harness.files import say
from harness.options import RunOptions
from harness.qnn import soc as soc_table
from harness.qnn.toolchain import Toolchain

FAULTS_ENV = "QNNSUITE_EMULATOR_FAULTS"  # reliability tests: {"SOC": {switch: value}} for emulated devices
# How long a dropped adb server is waited for: an emulated fleet's is restarted in seconds when it is
# restarted at all; a user's server with phones may need someone to plug or authorize them again.
RESTORE_EMULATED_S = 20.0
RESTORE_PHONES_S = 60.0


@dataclass(frozen=True)
class ProvidedDevices:
    devices: tuple[DeviceSpec, ...]  # each names its adb server
    emulated_pids: dict[str, int] = field(default_factory=dict)  # serial -> emulator process (tests pull plugs)
    started_pids: tuple[int, ...] = ()  # every process the provider started


class DeviceProvider(Protocol):
    # The SoCs its devices will have, where known before start (the run then prepares for them meanwhile).
    expected_socs: tuple[str, ...]

    def start(self) -> ProvidedDevices: ...

    def stop(self) -> None: ...


class AttachedDevices:
    """Devices already attached to the user's adb server, or to several hosts' servers (--adb-server);
    nothing to start or stop. A server that does not answer is one line, and the others are used."""

    expected_socs: tuple[str, ...] = ()  # known once the devices answer

    def __init__(self, serials: list[str], servers: list[AdbServer]) -> None:
        self._serials, self._servers = serials, servers

    def start(self) -> ProvidedDevices:
        clients = discovery.reachable(self._servers)
        specs = tuple(
            DeviceSpec(d.serial, d.soc, d.htp_arch, d.abi, d.model, kinds.kind_for_abi(d.abi), d.server)
            for d in discovery.select_across(clients, self._serials)
        )
        return ProvidedDevices(specs)

    def stop(self) -> None:
        pass


class EmulatedFleet:
    """A private adb server and one emulated device per SoC, started for this run and stopped with it."""

    def __init__(self, options: RunOptions, toolchain: Toolchain, work_dir: Path) -> None:
        self.expected_socs = tuple(
            soc for soc in options.emulate if not options.soc_filter or soc in options.soc_filter
        )
        if not self.expected_socs:
            raise DeviceError(
                f"--soc {','.join(options.soc_filter)} leaves no SoC to emulate from "
                f"{','.join(options.emulate)}: widen --soc or pass --emulate"
            )
        self._toolchain, self._work_dir = toolchain, work_dir
        self._fleet = None

    def start(self) -> ProvidedDevices:
        from harness.emulator.launcher import EmulatorFleet

        # Every device command, each runner included, starts with it: MALLOC_* (the heap pattern) there.
        device_env = kinds.EmulatedKind.heap_environment(self._toolchain.child_env())
        device_env["QNNSUITE_PYTHON"] = sys.executable
        self._fleet = fleet = EmulatorFleet(
            list(self.expected_socs), self._work_dir / "emulator", device_env=device_env, private_dirs=(self._work_dir,)
        )
        fleet.start()
        faults_by_soc = json.loads(os.environ.get(FAULTS_ENV, "{}"))
        for info in fleet.devices:
            if faults_by_soc.get(info.soc):
                fleet.set_faults(info.serial, **faults_by_soc[info.soc])
        server = fleet.server.address
        specs = tuple(
            DeviceSpec(
                info.serial,
                info.soc,
                soc_table.lookup(info.soc).htp_arch,
                kinds.HOST_ABI,
                f"Emulated {info.soc}",
                kinds.EmulatedKind.name,
                server,
            )
            for info in fleet.devices
        )
        return ProvidedDevices(specs, {i.serial: i.pid for i in fleet.devices}, tuple(fleet.started_pids))

    def stop(self) -> None:
        if self._fleet is not None:
            self._fleet.stop()


def restore_server(server: str, specs: list[DeviceSpec]) -> bool:
    """The device layer's hook (DevicePool.restore_server) when the adb server `server` dropped: killed,
    restarted or replaced on its address by another tool. Waits for a server there (bounded: phones longer)
    and its devices, connecting again the ones `adb connect` had attached (the emulated ones: a fresh server
    knows none); says in one line what came of it and returns whether every device is back."""
    from harness.emulator.launcher import reconnect_devices

    phones = any(not kinds.of(spec.kind).emulated for spec in specs)
    within_s = RESTORE_PHONES_S if phones else RESTORE_EMULATED_S
    if phones:
        say(f"adb server {server} dropped: waiting up to {within_s:.0f} s for it and its devices to be back")
    started = time.monotonic()
    states = reconnect_devices(AdbServer.parse(server, "adb server"), [spec.serial for spec in specs], within_s)
    if states is None:
        say(
            f"adb server {server} did not come back within {within_s:.0f} s: its devices' cases are "
            f"infrastructure errors; start it again (emulated devices: with the run's adb home, see docs/FAULTS.md)"
        )
        return False
    missing = {serial: state for serial, state in states.items() if state != "device"}
    if missing:
        serial, state = next(iter(missing.items()))
        fix = (  # an emulated device hangs up on (and is offline for) a server whose key it does not trust
            "check the device and `adb devices`"
            if phones
            else "the server now there may sign with another key than the run's: start it with the run's adb "
            "home (harness/emulator/launcher.py server_environment)"
        )
        say(f"adb server {server} is back but {serial} is {state} after {within_s:.0f} s: {fix}")
        return False
    say(
        f"adb server {server} restored: {len(states)} device(s) connected again after "
        f"{time.monotonic() - started:.1f} s; the case is retried"
    )
    return True


def provider_for(options: RunOptions, toolchain: Toolchain, work_dir: Path) -> DeviceProvider:
    """Attached devices when serials are given (--device or ANDROID_SERIAL) or servers named (--adb-server:
    then every ready device of theirs unless --device narrows), else an emulated fleet."""
    serials = discovery.requested_serials(list(options.device_options))
    if not serials and not options.adb_servers:
        return EmulatedFleet(options, toolchain, work_dir)
    return AttachedDevices(serials or ["all"], list(options.adb_servers) or [discovery.default_server()])
