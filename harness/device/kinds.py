"""Device kinds: everything that differs between an emulated device and a phone, decided here alone.

A kind says what must be pushed before a program can run (payload) and what the device can measure
(capabilities). The rest of the suite asks a device's kind and never looks at ABIs or SDK origins itself.
An attached device is emulated when it runs host (x86_64) binaries: real phones are arm64.
"""
from __future__ import annotations

from importlib import metadata
from pathlib import Path

from harness.device.payload import PayloadFile, emulated_payload, phone_payload
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk

HOST_ABI = "x86_64"
# The byte every fresh heap allocation of an emulated device's runner holds: a delegated buffer that is
# never initialised (docs/FINDINGS.md#F1) then reads the same value on every run, 0x40404040 = 3.0039 as
# float32, so the known defect has an exact signature. Non-zero, finite in every float width, and far
# from the cards' registered values.
EMULATED_HEAP_PATTERN = 0x40
# glibc fills malloc'd memory with MALLOC_PERTURB_ ^ 0xff, except chunks handed out from the per-thread
# cache (they keep a freed chunk's bytes): the cache is switched off. Read at process start only.
_NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"


class EmulatedKind:
    name = "emulated"
    # The interposer wraps the host QNN library, so every graph execute is traced with its tensors' addresses.
    has_execute_trace = True
    heap_pattern: int | None = EMULATED_HEAP_PATTERN

    def payload(self, abi: str, htp_arch: int, runner: Path | None, sdk: QnnSdk) -> list[PayloadFile]:
        return emulated_payload(abi, runner)

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        """What the device's runner uses without its being pushed (its provenance): the host executorch's QNN
        backend library and the host SDK's libQnnHtp.so, by role ("backend") or file name."""
        backend = Path(str(metadata.distribution("executorch").locate_file("executorch/lib/libexecutorch_backend_qnn.so")))
        return {"backend": backend, "libQnnHtp.so": sdk.htp_library}

    @staticmethod
    def heap_environment(env: dict[str, str]) -> dict[str, str]:
        """env plus what makes every heap allocation start as heap_pattern (for the runner server's start)."""
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.tcache_count=")]
        return {**env, "MALLOC_PERTURB_": str(EMULATED_HEAP_PATTERN ^ 0xFF),
                "GLIBC_TUNABLES": ":".join([*tunables, _NO_THREAD_CACHE])}


class PhoneKind:
    name = "phone"
    has_execute_trace = False  # a phone's libQnnHtp.so is Qualcomm's own
    heap_pattern: int | None = None  # Android's allocator has no fill switch a runner could be started with

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        return {}  # a phone uses only what was pushed to it

    def payload(self, abi: str, htp_arch: int, runner: Path | None, sdk: QnnSdk) -> list[PayloadFile]:
        # The wheel's SDK tree has host libraries only; a phone needs a full SDK's Android and Hexagon ones.
        return phone_payload(abi, htp_arch, runner, None if sdk.origin == WHEEL_ORIGIN else sdk.root)


DeviceKind = EmulatedKind | PhoneKind
KINDS: dict[str, DeviceKind] = {kind.name: kind for kind in (EmulatedKind(), PhoneKind())}


def kind_for_abi(abi: str) -> str:
    return EmulatedKind.name if abi == HOST_ABI else PhoneKind.name


def of(name: str) -> DeviceKind:
    return KINDS[name]
