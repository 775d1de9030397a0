"""The host QNN toolchain of a run: SDK, interposer overlay, versions and whether the bridges are on.

`prepare()` is what the plugin, the doctor and the set-up call; `Toolchain.child_env()` is the
environment every process that loads QNN gets (lowering jobs, the emulated host runner).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

from harness.files import read_state, write_atomically
from harness.paths import REPO_ROOT, state_dir
from harness.qnn import compose_probe, interposer, qnnlog
from harness.qnn.sdk import QnnSdk, resolve

PROBE_TIMEOUT_S = 300


class ToolchainError(RuntimeError):
    """The QNN toolchain cannot be made to work; the message is one line naming the fix."""


@dataclass(frozen=True)
class Probe:
    """What starting a backend taught us about this ExecuTorch + library pair."""

    build_id: str
    bridge_device_config: bool
    library_api: str | None
    built_for_api: str | None
    without_bridge: str  # "ok" or the first error line
    with_bridge: str | None
    # docs/FINDINGS.md#F19: composeGraphs' by-value interface re-laid by the system bridge (system_bridge.c),
    # on only where an online-prepared program crashes at load without it and runs correctly with it
    bridge_compose_graphs: bool = False
    compose_probe: str = ""  # what the online-prepared probe program did, without the bridge and with it


@dataclass(frozen=True)
class Toolchain:
    sdk: QnnSdk
    overlay_root: Path
    interposer: Path
    probe: Probe

    @property
    def overlay_lib_dir(self) -> Path:
        return self.overlay_root / "lib" / "x86_64-linux-clang"

    def child_env(self, trace: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a process that lowers or runs on the HTP simulator."""
        env = dict(os.environ if base is None else base)
        env["QNN_SDK_ROOT"] = str(self.overlay_root)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(self.overlay_lib_dir)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        )
        env["QNNSUITE_BRIDGE_DEVICE_CONFIG"] = "1" if self.probe.bridge_device_config else "0"
        env["QNNSUITE_BRIDGE_COMPOSE_GRAPHS"] = "1" if self.probe.bridge_compose_graphs else "0"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        if trace is not None:
            env["QNNSUITE_TRACE"] = str(trace)
        else:
            env.pop("QNNSUITE_TRACE", None)
        return env

    def describe(self) -> dict[str, object]:
        return {
            "sdk_root": str(self.sdk.root),
            "sdk_origin": self.sdk.origin,
            "overlay_root": str(self.overlay_root),
            "interposer": str(self.interposer),
            **asdict(self.probe),
        }


def executorch_version() -> str:
    try:
        return metadata.version("executorch")
    except metadata.PackageNotFoundError as missing:
        raise ToolchainError("executorch is not installed in this Python: run the README's set-up command") from missing


def prepare(qnn_sdk: str | None = None) -> Toolchain:
    """Resolve the SDK, build the interposer, lay out the overlay and probe (cached)."""
    sdk = resolve(qnn_sdk)
    try:
        library = interposer.build()
    except interposer.InterposerBuildError as error:
        raise ToolchainError(str(error)) from error
    overlay_root = interposer.overlay(sdk, library)
    return Toolchain(sdk, overlay_root, library, _cached_probe(sdk, overlay_root, library))


def _cached_probe(sdk: QnnSdk, overlay_root: Path, library: Path) -> Probe:
    real = sdk.htp_library.resolve()
    stat = real.stat()
    executorch_dir = metadata.distribution("executorch").locate_file("executorch")
    key_source = "|".join(
        [
            executorch_version(),
            str(executorch_dir),
            str(real),
            str(stat.st_size),
            str(stat.st_mtime_ns),
            library.parent.name,
            sys.executable,
        ]
    )
    cache = state_dir() / "probe" / (hashlib.sha256(key_source.encode()).hexdigest()[:16] + ".json")
    if (cached := read_state(cache, "probe cache", lambda data: Probe(**data))) is not None:
        return cached
    probe = _measure(overlay_root)
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(cache, json.dumps(asdict(probe), indent=1))
    return probe


def _measure(overlay_root: Path) -> Probe:
    """Both probes, in order: does the backend start (device-config bridge), then does an online-prepared
    program load (composeGraphs bridge), which needs the first one's answer."""
    probe = _probe(overlay_root)
    return replace(probe, **_compose_probe(overlay_root, probe))


def _probe_child(module: str, overlay_root: Path, probe: Probe) -> subprocess.CompletedProcess:
    """A probe module run in a child with the overlay and the bridges `probe` says (a draft toolchain's env)."""
    draft = Toolchain(QnnSdk(overlay_root, "probe"), overlay_root, Path(), probe)
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=REPO_ROOT,
        env=draft.child_env(),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
    )


def _run_probe(overlay_root: Path, bridge: bool) -> tuple[dict, str]:
    completed = _probe_child("harness.qnn.probe", overlay_root, Probe("", bridge, None, None, "", None))
    log = completed.stdout + completed.stderr
    for line in completed.stdout.splitlines():
        if line.startswith("QNNSUITE_PROBE "):
            return json.loads(line.removeprefix("QNNSUITE_PROBE ")), log
    return {"ok": False, "build_id": "", "error": f"probe exited {completed.returncode}"}, log


def _first_problem(outcome: dict, log: str) -> str:
    if outcome["ok"]:
        return "ok"
    errors = qnnlog.error_lines(log)
    return errors[0].strip() if errors else outcome["error"]


def _probe(overlay_root: Path) -> Probe:
    """Start a backend without the bridge; only if the device config is rejected, try with it."""
    plain, plain_log = _run_probe(overlay_root, bridge=False)
    library_api, built_for_api = qnnlog.api_versions(plain_log)
    without = _first_problem(plain, plain_log)
    if plain["ok"]:
        return Probe(plain["build_id"], False, library_api, built_for_api, without, None)
    if "custom config" not in plain_log and "14001" not in plain_log:
        raise ToolchainError(
            f"QNN backend does not start ({without}); it is not the known device-config "
            f"layout gap, so the bridge cannot help: check the SDK with `python -m harness doctor`"
        )
    bridged, bridged_log = _run_probe(overlay_root, bridge=True)
    with_bridge = _first_problem(bridged, bridged_log)
    if not bridged["ok"]:
        raise ToolchainError(
            f"QNN backend does not start even with the device-config bridge ({with_bridge}): "
            f"try a QNN SDK matching the ExecuTorch build, via --qnn-sdk or QNN_SDK_ROOT"
        )
    library_api, built_for_api = (
        qnnlog.api_versions(bridged_log) if library_api is None else (library_api, built_for_api)
    )
    return Probe(bridged["build_id"], True, library_api, built_for_api, without, with_bridge)


def _run_compose_probe(overlay_root: Path, device_config: bool, compose: bool) -> tuple[dict | None, str]:
    """The online-prepared probe program in a child (None: it died, e.g. SIGSEGV at load) and how it ended."""
    probe = Probe("", device_config, None, None, "", None, bridge_compose_graphs=compose)
    completed = _probe_child("harness.qnn.compose_probe", overlay_root, probe)
    for line in completed.stdout.splitlines():
        if line.startswith(compose_probe.PREFIX):
            outcome = json.loads(line.removeprefix(compose_probe.PREFIX))
            return outcome, "ok" if outcome["ok"] else (outcome["error"] or f"gave {outcome['value']}, not 2")
    signal_name = f" ({signal.Signals(-completed.returncode).name})" if completed.returncode < 0 else ""
    return None, f"died with exit {completed.returncode}{signal_name}"


def _compose_probe(overlay_root: Path, probe: Probe) -> dict[str, object]:
    """Load an online-prepared program without the system bridge; only if that kills the process, try with it,
    and keep the bridge only if the program then runs correctly (docs/FINDINGS.md#F19)."""
    plain, without = _run_compose_probe(overlay_root, probe.bridge_device_config, compose=False)
    if plain is not None:
        return {"bridge_compose_graphs": False, "compose_probe": f"without the bridge: {without}"}
    bridged, with_bridge = _run_compose_probe(overlay_root, probe.bridge_device_config, compose=True)
    said = f"without the bridge: {without}; with it: {with_bridge}"
    return {"bridge_compose_graphs": bool(bridged and bridged["ok"]), "compose_probe": said}
