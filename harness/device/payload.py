"""What must be on a device before a .pte can run there, per device kind.

A phone gets the user's Android runner and the QNN libraries for its HTP arch (as upstream's
scripts push them); an emulated device gets the emulated runner, since its QNN libraries are the
host's. Which one a device is, is decided in harness/device/kinds.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.device.device import DeviceError

EMULATED_RUNNER = Path(__file__).resolve().parent.parent / "emulator" / "qnn_executor_runner"
RUNNER_NAME = "qnn_executor_runner"
ELF_MACHINES = {183: "arm64-v8a", 62: "x86_64", 40: "armeabi-v7a", 3: "x86"}


@dataclass(frozen=True)
class PayloadFile:
    local: Path
    remote_name: str
    mode: int = 0o644


def elf_abi(path: Path) -> str | None:
    """The Android ABI an ELF binary is built for; None for scripts and other files."""
    header = path.read_bytes()[:20]
    if header[:4] != b"\x7fELF":
        return None
    return ELF_MACHINES.get(int.from_bytes(header[18:20], "little"), f"machine {int.from_bytes(header[18:20], 'little')}")


def _checked_runner(runner: Path, abi: str) -> PayloadFile:
    if not runner.is_file():
        raise DeviceError(f"--runner {runner} does not exist: pass the path of your Android qnn_executor_runner build")
    runner_abi = elf_abi(runner)
    if runner_abi is not None and runner_abi != abi:
        raise DeviceError(f"--runner {runner} is built for {runner_abi} but the device is {abi}: "
                          f"build qnn_executor_runner for {abi}")
    return PayloadFile(runner, RUNNER_NAME, 0o755)


def emulated_payload(abi: str, runner: Path | None) -> list[PayloadFile]:
    """An emulated device runs host binaries: the emulated runner, or the user's host-built one."""
    return [_checked_runner(runner, abi)] if runner is not None else [PayloadFile(EMULATED_RUNNER, RUNNER_NAME, 0o755)]


def phone_payload(abi: str, htp_arch: int, runner: Path | None, sdk_root: Path | None) -> list[PayloadFile]:
    """A phone gets the user's Android runner and the QNN libraries of its HTP arch, as upstream pushes them.

    sdk_root: a full QNN SDK (None: only the host libraries are at hand, which a phone cannot use)."""
    if runner is None:
        raise DeviceError(f"a {abi} device needs its Android qnn_executor_runner: pass --runner PATH "
                          f"(built from executorch's examples/qualcomm/executor_runner)")
    files = [_checked_runner(runner, abi)]
    if sdk_root is None:
        raise DeviceError("pushing to a phone needs a full QNN SDK for its libraries: pass --qnn-sdk or set QNN_SDK_ROOT")
    wanted = [
        sdk_root / "lib" / "aarch64-android" / "libQnnHtp.so",
        sdk_root / "lib" / "aarch64-android" / f"libQnnHtpV{htp_arch}Stub.so",
        sdk_root / "lib" / "aarch64-android" / "libQnnHtpPrepare.so",
        sdk_root / "lib" / "aarch64-android" / "libQnnSystem.so",
        sdk_root / "lib" / f"hexagon-v{htp_arch}" / "unsigned" / f"libQnnHtpV{htp_arch}Skel.so",
        runner.parent / "libqnn_executorch_backend.so",
    ]
    missing = [str(path) for path in wanted if not path.is_file()]
    if missing:
        raise DeviceError(f"files to push for HTP v{htp_arch} are missing: {', '.join(missing)}: "
                          f"use a QNN SDK with Android libraries and put libqnn_executorch_backend.so beside the runner")
    return files + [PayloadFile(path, path.name) for path in wanted]
