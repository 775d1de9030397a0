"""What each device ran the programs with, measured once at the start of a run: the runner's and backend
library's sha256, the QNN build id of the libraries, and whether that is what lowered the programs.

A report must say which bytes produced its numbers: the same runner name can hide another build, and
libraries of another QNN release than the one that lowered the programs explain failures no executorch
change causes. Hashes of pushed files are taken on the device (sha256sum of what landed there), build ids
from the library files' own bytes (harness/qnn/qairt.py). What a device uses without its being pushed (an
emulated device runs on the host's executorch and QNN libraries) is recorded as such, from the host files.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from harness.device import kinds
from harness.device.device import Device, DeviceError, shell_line
from harness.device.payload import RUNNER_NAME, SUITE_RUNNER_BINARY_NAME, SUITE_RUNNER_NAME, PayloadFile
from harness.qnn import qairt
from harness.qnn.sdk import QnnSdk

BACKEND_LIBRARY = "libqnn_executorch_backend.so"
QNN_LIBRARY = re.compile(r"libQnn\w*\.so$")
BUILD_ID_LIBRARY = "libQnnHtp.so"  # the library whose build id is the device's (the others are its parts)


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _build_id(path: Path) -> str | None:
    try:
        return qairt.build_id_of(path)
    except qairt.QairtVersionError:
        return None  # Stub and Skel libraries need not carry one


def _device_hashes(device: Device, remote_paths: list[str]) -> dict[str, str]:
    """sha256 per device path, in one shell command (missing files are left out)."""
    if not remote_paths:
        return {}
    result = device.shell(shell_line(["sha256sum", *remote_paths]) + " 2>/dev/null", timeout_s=120)
    found = {}
    for line in result.output.splitlines():
        digest, _, path = line.strip().partition(" ")
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            found[path.strip().lstrip("*")] = digest
    return found


def file_entry(name: str, local: Path, pushed: bool, device_sha256: str | None = None) -> dict:
    """One file a device runs programs with: its host file's sha256 (and the device's, when pushed) and, for
    a QNN library, the build id in its bytes."""
    entry = {"name": name, "source": str(local), "pushed": pushed, "sha256": _sha256(local)}
    if pushed:
        entry["device_sha256"] = device_sha256
    if QNN_LIBRARY.match(name):
        entry["build_id"] = _build_id(local)
    return entry


def measure(device: Device, kind_name: str, payload: list[PayloadFile], payload_dir: str, sdk: QnnSdk) -> dict:
    """The device's provenance (JSON-shaped): runner, backend, QNN libraries and the device's QNN build id."""
    remote = {item.remote_name: f"{payload_dir}/{item.remote_name}" for item in payload}
    try:
        on_device = _device_hashes(device, list(remote.values()))
    except DeviceError as error:
        on_device, problem = {}, str(error).splitlines()[0]
    else:
        problem = ""
    files = [
        file_entry(item.remote_name, item.local, True, on_device.get(remote[item.remote_name])) for item in payload
    ]
    in_place = kinds.of(kind_name).host_libraries(sdk)
    files += [file_entry(local.name, local, False) for local in in_place.values()]
    by_name = {entry["name"]: entry for entry in files}
    backend = by_name.get(in_place["backend"].name if "backend" in in_place else BACKEND_LIBRARY)
    htp = by_name.get(BUILD_ID_LIBRARY)
    return {
        "kind": kind_name,
        "runner": by_name.get(RUNNER_NAME),
        # The suite's compiled runner, which runs the cases: the binary (emulated devices push it beside the
        # `suite_runner` command that starts it; phones push the binary as `suite_runner`). None: not pushed.
        "suite_runner": by_name.get(SUITE_RUNNER_BINARY_NAME) or by_name.get(SUITE_RUNNER_NAME),
        "backend": backend,
        "qnn_libraries": [entry for entry in files if QNN_LIBRARY.match(entry["name"])],
        "qnn_build_id": htp.get("build_id") if htp else None,
        "problem": problem,
    }


def warnings(provenance: dict[str, dict], host_build_id: str) -> list[str]:
    """One line per difference the harness can tell between what lowered the programs and what ran them."""
    lines = []
    for serial, found in sorted(provenance.items()):
        device_id = found.get("qnn_build_id")
        if device_id and host_build_id and device_id != host_build_id:
            lines.append(
                f"warning: device {serial} runs QNN {device_id} but the programs were lowered with QNN "
                f"{host_build_id}: push the libraries of the SDK that lowers (--qnn-sdk), or lower with "
                f"the device's"
            )
        for entry in [found.get(k) for k in ("runner", "suite_runner", "backend")] + found.get("qnn_libraries", []):
            if entry and entry.get("pushed") and entry.get("device_sha256") not in (None, entry.get("sha256")):
                lines.append(
                    f"warning: device {serial} holds another {entry['name']} than the one pushed "
                    f"(sha256 {entry['device_sha256'][:12]} on the device, {str(entry['sha256'])[:12]} "
                    f"here): check its storage"
                )
    return lines
