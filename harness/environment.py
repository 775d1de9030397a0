"""What a report says about where it ran: versions, QNN build, device and host, per SoC."""
from __future__ import annotations

import platform
import socket
import sys

from harness.context import RunContext
from harness.device.kinds import EmulatedKind
from harness.qnn.toolchain import Toolchain
from harness.versions import package_version


def per_soc(context: RunContext, toolchain: Toolchain | None, started: str, finished: str,
            shard: str | None = None) -> dict[str, dict]:
    """shard: `INDEX/COUNT` of a --shard run, so a merge can check that its parts fit."""
    common = {
        "executorch": package_version("executorch"), "torch": package_version("torch"), "torchao": package_version("torchao"),
        "qnn_build_id": toolchain.probe.build_id if toolchain else "unknown",
        "qnn_sdk": f"{toolchain.sdk.root} ({toolchain.sdk.origin})" if toolchain else "unknown",
        "bridge": ("on" if toolchain.probe.bridge_device_config else "off") if toolchain else "unknown",
        "host": f"{socket.gethostname()} ({platform.machine()}, {platform.system()} {platform.release()})",
        "python": sys.version.split()[0], "run_id": context.run_id, "started": started, "finished": finished,
        **({"shard": shard} if shard else {}),
    }
    environments = {}
    for spec in context.devices:
        entry = environments.setdefault(spec.soc, {**common, "soc": spec.soc, "htp_arch": f"V{spec.htp_arch}",
                                                   "device_serial": spec.label, "device_model": spec.model,
                                                   "emulated": spec.kind == EmulatedKind.name})
        if spec.label not in entry["device_serial"].split(", "):
            entry["device_serial"] += f", {spec.label}"
    return environments
