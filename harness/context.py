"""What one run is made of, decided once by the controller and handed to every xdist worker.

The controller (the only process when xdist is off) resolves the options into devices: it starts
emulated devices or checks real ones, detects their SoCs and makes a run id. Workers receive this
as JSON, so every worker collects the same cases and talks to the same adb server.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.device import discovery
from harness.device.device import DeviceError
from harness.device.pool import DeviceSpec
from harness.options import RunOptions
from harness.qnn import soc as soc_table
from harness.qnn.toolchain import Toolchain


@dataclass(frozen=True)
class RunContext:
    run_id: str
    adb_port: int
    devices: tuple[DeviceSpec, ...]
    emulated_pids: dict[str, int]  # serial -> emulator process (for tests that pull the plug)
    started_pids: tuple[int, ...]  # every process the run started (emulators, adb server)
    work_dir: Path  # host-side scratch of this run (artifacts, pulled outputs)
    lowering_server: Path | None = None  # socket of the run's lowering server (None: each case in a fresh Python)

    def socs(self, soc_filter: tuple[str, ...]) -> list[str]:
        socs = sorted({spec.soc for spec in self.devices})
        return [soc for soc in socs if not soc_filter or soc in soc_filter]

    def to_json(self) -> str:
        data = asdict(self)
        data["work_dir"] = str(self.work_dir)
        data["lowering_server"] = str(self.lowering_server) if self.lowering_server else None
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> "RunContext":
        data = json.loads(text)
        return cls(data["run_id"], data["adb_port"], tuple(DeviceSpec(**spec) for spec in data["devices"]),
                   data["emulated_pids"], tuple(data["started_pids"]), Path(data["work_dir"]),
                   Path(data["lowering_server"]) if data.get("lowering_server") else None)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def real_devices(options: RunOptions, serials: list[str], run_id: str, work_dir: Path) -> RunContext:
    port = discovery.default_server_port()
    devices = discovery.select(discovery.client(port), serials)
    specs = tuple(DeviceSpec(d.serial, d.soc, d.htp_arch, d.abi, d.model, emulated=False) for d in devices)
    return RunContext(run_id, port, specs, {}, (), work_dir)


def emulated_devices(options: RunOptions, toolchain: Toolchain, run_id: str, work_dir: Path):
    """Start a fleet; returns (fleet, context). The caller owns the fleet and must stop it."""
    from harness.emulator.launcher import EmulatorFleet

    socs = [soc for soc in options.emulate if not options.soc_filter or soc in options.soc_filter]
    if not socs:
        raise DeviceError(f"--soc {','.join(options.soc_filter)} leaves no SoC to emulate from "
                          f"{','.join(options.emulate)}: widen --soc or pass --emulate")
    device_env = toolchain.child_env()
    device_env["QNNSUITE_PYTHON"] = sys.executable
    fleet = EmulatorFleet(socs, work_dir / "emulator", device_env=device_env)
    fleet.start()
    for info in fleet.devices:  # fault injection for the reliability tests: {"SOC": {switch: value}}
        faults = json.loads(os.environ.get("QNNSUITE_EMULATOR_FAULTS", "{}")).get(info.soc)
        if faults:
            fleet.set_faults(info.serial, **faults)
    specs = []
    for info in fleet.devices:
        arch = soc_table.lookup(info.soc).htp_arch
        specs.append(DeviceSpec(info.serial, info.soc, arch, "x86_64", f"Emulated {info.soc}", emulated=True))
    context = RunContext(run_id, fleet.adb_port, tuple(specs), {i.serial: i.pid for i in fleet.devices},
                         tuple(fleet.started_pids), work_dir)
    return fleet, context
