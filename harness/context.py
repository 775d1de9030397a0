"""What one run is made of, decided once by the controller and handed to every xdist worker.

The controller (the only process when xdist is off) resolves the options into devices through a device
provider (harness/providers.py) and makes a run id (harness/session.py). Workers receive this as JSON,
so every worker collects the same cases and talks to the same adb server.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.device.pool import DeviceSpec


@dataclass(frozen=True)
class RunContext:
    run_id: str
    devices: tuple[DeviceSpec, ...]  # each names its adb server (a run may use several hosts' servers)
    emulated_pids: dict[str, int]  # serial -> emulator process (for tests that pull the plug)
    started_pids: tuple[int, ...]  # every process the run started (emulators, adb server)
    work_dir: Path  # host-side scratch of this run (artifacts, pulled outputs)
    lowering_server: Path | None = None  # socket of the run's lowering server (None: each case in a fresh Python)
    # From the health checks at the start (harness/health.py): serial -> the line that quarantined it
    # (its cases are infrastructure errors), and serial -> what it runs programs with (harness/device/provenance.py).
    quarantined: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, dict] = field(default_factory=dict)
    # The lowering server's process, once the controller started it (None: the run needed none, or not yet)
    lowering_server_pid: int | None = None

    def socs(self, soc_filter: tuple[str, ...]) -> list[str]:
        socs = sorted({spec.soc for spec in self.devices})
        return [soc for soc in socs if not soc_filter or soc in soc_filter]

    def to_json(self) -> str:
        data = asdict(self)
        data["work_dir"] = str(self.work_dir)
        data["lowering_server"] = str(self.lowering_server) if self.lowering_server else None
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RunContext:
        data = json.loads(text)
        return cls(
            data["run_id"],
            tuple(DeviceSpec(**spec) for spec in data["devices"]),
            data["emulated_pids"],
            tuple(data["started_pids"]),
            Path(data["work_dir"]),
            Path(data["lowering_server"]) if data.get("lowering_server") else None,
            data.get("quarantined") or {},
            data.get("provenance") or {},
            data.get("lowering_server_pid"),
        )


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
