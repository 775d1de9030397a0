"""What a report says about where it ran: versions, QNN build, device and host, per SoC."""

from __future__ import annotations

import platform
import socket
import sys

from harness.context import RunContext
from harness.device import kinds, provenance
from harness.qnn.toolchain import Toolchain
from harness.versions import package_version


def per_soc(
    context: RunContext, toolchain: Toolchain | None, started: str, finished: str, shard: str | None = None
) -> dict[str, dict]:
    """shard: `INDEX/COUNT` of a --shard run, so a merge can check that its parts fit."""
    common = {
        "executorch": package_version("executorch"),
        "torch": package_version("torch"),
        "torchao": package_version("torchao"),
        "qnn_build_id": toolchain.probe.build_id if toolchain else "unknown",
        "qnn_sdk": f"{toolchain.sdk.root} ({toolchain.sdk.origin})" if toolchain else "unknown",
        "bridge": ("on" if toolchain.probe.bridge_device_config else "off") if toolchain else "unknown",
        "compose_bridge": ("on" if toolchain.probe.bridge_compose_graphs else "off") if toolchain else "unknown",
        # The QNN API the libraries have and the one executorch says it was tested against (its start-up warning):
        # an upstream maintainer reproducing a finding needs the second
        "qnn_api": (toolchain.probe.library_api or "unknown") if toolchain else "unknown",
        "executorch_qnn_api": (toolchain.probe.built_for_api or "unknown") if toolchain else "unknown",
        "host": f"{socket.gethostname()} ({platform.machine()}, {platform.system()} {platform.release()})",
        "python": sys.version.split()[0],
        "run_id": context.run_id,
        "started": started,
        "finished": finished,
        **({"shard": shard} if shard else {}),
    }
    environments = {}
    for spec in context.devices:
        entry = environments.setdefault(
            spec.soc,
            {
                **common,
                "soc": spec.soc,
                "htp_arch": f"V{spec.htp_arch}",
                "device_serial": spec.label,
                "device_model": spec.model,
                "emulated": kinds.of(spec.kind).emulated,
            },
        )
        if spec.label not in entry["device_serial"].split(", "):
            entry["device_serial"] += f", {spec.label}"
    return environments


def provenance_per_soc(context: RunContext, toolchain: Toolchain | None) -> dict[str, dict]:
    """Per SoC: what made the programs on the host, what each device ran them with (measured at the start of
    the run, harness/device/provenance.py), and a line per difference between the two."""
    host_build_id = toolchain.probe.build_id if toolchain else ""
    host = {
        "executorch": package_version("executorch"),
        "torch": package_version("torch"),
        "qnn_build_id": host_build_id,
    }
    per_soc: dict[str, dict] = {}
    for spec in context.devices:
        found = context.provenance.get(
            spec.label, {"serial": spec.serial, "device": spec.label, "soc": spec.soc, "health": "not checked"}
        )
        entry = per_soc.setdefault(spec.soc, {"host": host, "devices": [], "warnings": []})
        entry["devices"].append(found)
        entry["warnings"] += provenance.warnings({spec.label: found}, host_build_id)
    return per_soc
