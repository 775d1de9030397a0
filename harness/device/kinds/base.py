"""The contract every device kind keeps, and what a kind's payload is made from.

A kind is one unit: its module in this package (emulated.py, phone.py) says what it pushes, what it can
measure, the environment its runners start with and how reports name it. No module outside this package
compares a kind's name (harness/tests/device/test_kinds.py reads every module to hold that); each asks its kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.device.payload import PayloadFile, PhoneFiles
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk
from harness.runner import build as runner_build


@dataclass(frozen=True)
class PayloadInputs:
    """Everything a kind's payload is made from: the run's options and SDK (the same for every device)."""

    sdk: QnnSdk
    runner: Path | None = None
    backend_lib: Path | None = None
    trace_interposer: Path | None = None  # built for aarch64-android with --android-ndk
    # The suite's runner for phones (--android-ndk with --executorch-android-build): phones run it as
    # `suite_runner`, the user's qnn_executor_runner stays the reference (runner_parity).
    android_runner: runner_build.AndroidRunner | None = None

    def phone_files(self) -> PhoneFiles:
        # The wheel's SDK tree has host libraries only; a phone needs a full SDK's Android and Hexagon ones.
        built = self.android_runner
        return PhoneFiles(
            self.runner,
            None if self.sdk.origin == WHEEL_ORIGIN else self.sdk.root,
            self.backend_lib,
            self.trace_interposer,
            built.binary if built else None,
            built.libraries if built else (),
        )


class DeviceKind(Protocol):
    """What a kind of device is to the suite. Its traits are also what the checks read of it
    (harness/outcome.py's DeviceTraits: name, has_execute_trace, heap_pattern, suite_runner_hint)."""

    name: str  # the one spelling, in DeviceSpec.kind, records (timing.device_kind) and report.json
    label: str  # how a report names a device of the kind beside its times: "simulator" or "phone"
    # A device of the suite's own making, on the host: its times are the HTP simulator's, never a phone's NPU's;
    # its adb address changes every run; a dropped server gets it back in seconds.
    emulated: bool
    has_execute_trace: bool  # every graph execute is traced with its tensors' addresses
    heap_pattern: int | None  # the byte its runners' fresh heap allocations hold (None: cannot be set)
    suite_runner_hint: str  # how a device of the kind gets the suite's compiled runner ("" when only a build can)

    def payload(self, abi: str, htp_arch: int, given: PayloadInputs) -> list[PayloadFile]:
        """What must be pushed before a program can run."""
        ...

    def host_libraries(self, sdk: QnnSdk) -> dict[str, Path]:
        """What its runner uses without its being pushed (its provenance), by role or file name."""
        ...

    def heap_environment(self, env: dict[str, str]) -> dict[str, str]:
        """env plus what its runners' heap needs (the device commands' environment)."""
        ...
