"""A phone: Qualcomm's own QNN libraries and the user's runner, pushed from the SDK and build given."""

from __future__ import annotations

from pathlib import Path

from harness.device.kinds.base import PayloadInputs
from harness.device.payload import PayloadFile, phone_payload
from harness.qnn.sdk import QnnSdk


class PhoneKind:
    name = "phone"
    label = "phone"
    emulated = False
    # A phone's libQnnHtp.so is Qualcomm's own: traced only when the interposer built with --android-ndk is
    # pushed in front of it (then the run's outputs hold trace.jsonl).
    has_execute_trace = False
    heap_pattern: int | None = None  # Android's allocator has no fill switch a runner could be started with
    suite_runner_hint = "build it for phones with --android-ndk PATH and --executorch-android-build DIR"

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        return {}  # a phone uses only what was pushed to it

    @staticmethod
    def heap_environment(env: dict[str, str]) -> dict[str, str]:
        return dict(env)  # the runner's heap is Android's: nothing to set

    def payload(self, abi: str, htp_arch: int, given: PayloadInputs) -> list[PayloadFile]:
        return phone_payload(abi, htp_arch, given.phone_files())
