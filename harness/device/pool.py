"""The devices of a run as one pytest worker sees them: who serves which SoC, exclusive use, losses.

On each device a run has one folder, WORKSPACE_ROOT/<run id>: the payload (runner and libraries) in
`payload/`, pushed once per device per run (the first worker to hold the device pushes it, the others
find the same bytes there and skip them), and one folder of case files per worker. Workers remove their
own folders; the controller removes the run's folder at the end (remove_run_folders).
A device that is lost, or that failed its health check at the start of the run (harness/health.py),
fails its own cases with the line that said so; the rest go on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from adbutils import AdbError
from filelock import Timeout

from harness.device import kinds
from harness.device.adb import AdbClient, AdbServer
from harness.device.device import WORKSPACE_ROOT, Device, DeviceError, DeviceLost, device_label, shell_line
from harness.device.execute import Workspace, prepare_workspace
from harness.device.payload import RUNNER_COMMANDS
from harness.qnn.interposer import REAL_LIBRARY_NAME
from harness.qnn.sdk import QnnSdk

LOCK_POLL_S = 0.2


class DeviceQuarantined(DeviceError):
    """Every device of the SoC failed the health check at the start of the run; the message is its line."""


@dataclass(frozen=True)
class DeviceSpec:
    """What the controller learned about a device, handed to every worker."""

    serial: str
    soc: str
    htp_arch: int
    abi: str
    model: str
    kind: str  # harness.device.kinds: "emulated" or "phone"
    server: str  # the adb server it is attached to, HOST:PORT or localfilesystem:PATH (AdbServer.address)

    @property
    def label(self) -> str:
        """server/serial: the device's name in reports, locks and the pool (serials repeat across servers)."""
        return device_label(self.server, self.serial)

    def client(self) -> AdbClient:
        return AdbClient(server=AdbServer.parse(self.server, "server"))


@dataclass
class DevicePool:
    specs: list[DeviceSpec]
    run_id: str
    worker: str
    sdk: QnnSdk
    runner: Path | None = None
    backend_lib: Path | None = None
    trace_interposer: Path | None = None  # built for phones with --android-ndk
    _devices: dict[str, Device] = field(default_factory=dict)  # by label (server/serial)
    _prepared: dict[str, Workspace] = field(default_factory=dict)  # label -> this worker's workspace
    _lost: dict[str, str] = field(default_factory=dict)  # label -> the line that said so
    quarantined: dict[str, str] = field(default_factory=dict)  # label -> its health check's line (no cases)
    # The provider's hook for an adb server that dropped (harness/providers.py restore_server): given the server
    # and its devices, it waits (bounded) for the server to be back, reconnects them, says so in one line and
    # returns whether they are back. None: a dropped server is only waited for as a dropped device is.
    restore_server: Callable[[str, list[DeviceSpec]], bool] | None = None

    def socs(self) -> list[str]:
        return sorted({spec.soc for spec in self.specs})

    def spec(self, label: str) -> DeviceSpec:
        return next(spec for spec in self.specs if spec.label == label)

    def device(self, label: str) -> Device:
        if label not in self._devices:
            spec = self.spec(label)
            self._devices[label] = Device(spec.serial, spec.client())
        return self._devices[label]

    @contextlib.contextmanager
    def acquire(self, soc: str, holder: str) -> Iterator[tuple[Device, Workspace]]:
        """A device of this SoC for exclusive use, with its prepared workspace.

        With several devices of one SoC the first free one is taken; with one, this simply waits.
        """
        candidates = [spec for spec in self.specs if spec.soc == soc]
        if not candidates:
            raise DeviceError(f"no device for SoC {soc} in this run: attach one or drop it with --soc")
        if all(spec.label in self.quarantined for spec in candidates):
            raise DeviceQuarantined(self.quarantined[candidates[0].label])
        candidates = [spec for spec in candidates if spec.label not in self.quarantined]
        while True:
            alive = [spec for spec in candidates if spec.label not in self._lost]
            if not alive:
                raise DeviceLost(self._lost[candidates[0].label])
            for spec in alive:
                device = self.device(spec.label)
                with contextlib.ExitStack() as hold:
                    try:
                        hold.enter_context(device.exclusive(holder, wait=len(alive) == 1))
                    except Timeout:
                        continue
                    try:
                        workspace = self._workspace(device, spec)
                    except DeviceLost as lost:
                        lost.label = spec.label  # the caller may wait for it and retry
                        raise
                    yield device, workspace
                    return
            time.sleep(LOCK_POLL_S)

    def mark_lost(self, label: str, line: str) -> None:
        """From now on this device's cases fail at once with the line that lost it."""
        self._lost[label] = line

    def back_online(self, label: str, within_s: float) -> bool:
        """Whether a dropped device reconnects (adb retries a dropped TCP/USB link by itself). When its adb
        server is what dropped (gone, or a fresh one on its address that does not list the device), the
        provider's restore_server hook brings the server's devices back first, within its own bound."""
        spec = self.spec(label)
        # its server's devices that this run still uses (a lost or quarantined one is not waited for)
        served = [
            other
            for other in self.specs
            if other.server == spec.server and other.label not in self._lost and other.label not in self.quarantined
        ]
        if self.restore_server is not None and self._server_dropped(spec.client(), served):
            if not self.restore_server(spec.server, served):
                return False
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            try:
                if self.device(label).shell("echo ok", timeout_s=5).output.strip() == "ok":
                    return True
            except DeviceError:
                pass
            time.sleep(0.3)
        return False

    @staticmethod
    def _server_dropped(client: AdbClient, served: list[DeviceSpec]) -> bool:
        """Whether the adb server is gone, or is a fresh one that lists none of the run's devices on it; a
        device unplugged from a server that still lists its other devices is the device's loss, not the server's."""
        try:
            listed = {info.serial for info in client.list()}
        except (AdbError, OSError, EOFError):
            return True
        return not listed & {spec.serial for spec in served}

    def _workspace(self, device: Device, spec: DeviceSpec) -> Workspace:
        """Called with the device held, so no other worker pushes the payload at the same time."""
        if spec.label not in self._prepared:
            payload = f"{WORKSPACE_ROOT}/{self.run_id}/payload"
            device.shell(shell_line(["mkdir", "-p", payload]))
            given = kinds.PayloadInputs(self.sdk, self.runner, self.backend_lib, self.trace_interposer)
            files = kinds.of(spec.kind).payload(spec.abi, spec.htp_arch, given)
            prepare_workspace(device, payload, files)
            traced = any(item.remote_name == REAL_LIBRARY_NAME for item in files)
            runners = tuple(item.remote_name for item in files if item.remote_name in RUNNER_COMMANDS)
            self._prepared[spec.label] = Workspace(
                device.workspace(f"{self.run_id}/{self.worker}"), payload, traced, runners
            )
        return self._prepared[spec.label]

    def close(self, keep: bool) -> list[str]:
        """Remove this worker's workspaces (or list them when kept); returns lines to print."""
        lines = []
        for label, device in self._devices.items():
            if keep:
                lines += [f"kept workspace {label}:{path}" for path in device.workspaces]
                continue
            if label in self._lost:
                continue
            lines += [f"could not remove workspace {label}:{path} (device gone)" for path in device.remove_workspaces()]
        return lines


def remove_run_folders(specs: list[DeviceSpec], run_id: str) -> list[str]:
    """Remove the run's folder (shared payload included) from every device; returns lines for those that
    could not be cleaned (device gone)."""
    lines = []
    for spec in specs:
        try:
            Device(spec.serial, spec.client()).shell(
                shell_line(["rm", "-rf", f"{WORKSPACE_ROOT}/{run_id}"]), timeout_s=30
            )
        except DeviceError:
            lines.append(f"could not remove {spec.label}:{WORKSPACE_ROOT}/{run_id} (device gone)")
    return lines
