"""Device kinds: everything that differs between an emulated device and a phone, decided here alone.

A kind says what must be pushed before a program can run (payload) and what the device can measure
(capabilities). The rest of the suite asks a device's kind and never looks at ABIs or SDK origins itself.
An attached device is emulated when it runs host (x86_64) binaries: real phones are arm64.
"""
from __future__ import annotations

from pathlib import Path

from harness.device.payload import PayloadFile, emulated_payload, phone_payload
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk

HOST_ABI = "x86_64"


class EmulatedKind:
    name = "emulated"
    # The interposer wraps the host QNN library, so every graph execute is traced with its tensors' addresses.
    has_execute_trace = True

    def payload(self, abi: str, htp_arch: int, runner: Path | None, sdk: QnnSdk) -> list[PayloadFile]:
        return emulated_payload(abi, runner)


class PhoneKind:
    name = "phone"
    has_execute_trace = False  # a phone's libQnnHtp.so is Qualcomm's own

    def payload(self, abi: str, htp_arch: int, runner: Path | None, sdk: QnnSdk) -> list[PayloadFile]:
        # The wheel's SDK tree has host libraries only; a phone needs a full SDK's Android and Hexagon ones.
        return phone_payload(abi, htp_arch, runner, None if sdk.origin == WHEEL_ORIGIN else sdk.root)


DeviceKind = EmulatedKind | PhoneKind
KINDS: dict[str, DeviceKind] = {kind.name: kind for kind in (EmulatedKind(), PhoneKind())}


def kind_for_abi(abi: str) -> str:
    return EmulatedKind.name if abi == HOST_ABI else PhoneKind.name


def of(name: str) -> DeviceKind:
    return KINDS[name]
