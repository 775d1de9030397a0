"""Device kinds: everything that differs between an emulated device and a phone, decided here alone.

A kind says what must be pushed before a program can run (payload) and what the device can measure
(capabilities). The rest of the suite asks a device's kind and never looks at ABIs or SDK origins itself.
An attached device is emulated when it runs host (x86_64) binaries: real phones are arm64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from harness.device.device import DeviceError
from harness.device.payload import (
    PayloadFile,
    PhoneFiles,
    emulated_payload,
    missing_files_line,
    phone_files_missing,
    phone_payload,
)
from harness.files import say
from harness.qnn import interposer
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk
from harness.runner import build as runner_build, contract as runner_contract

HOST_ABI = "x86_64"
# The byte every fresh heap allocation of an emulated device's runner holds: a delegated buffer that is
# never initialised (docs/FINDINGS.md#F1) then reads the same value on every run, 0x40404040 = 3.0039 as
# float32, so the known defect has an exact signature. Non-zero, finite in every float width, and far
# from the cards' registered values.
EMULATED_HEAP_PATTERN = 0x40


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


class EmulatedKind:
    name = "emulated"
    # The interposer wraps the host QNN library, so every graph execute is traced with its tensors' addresses.
    has_execute_trace = True
    heap_pattern: int | None = EMULATED_HEAP_PATTERN

    def payload(self, abi: str, htp_arch: int, given: PayloadInputs) -> list[PayloadFile]:
        return emulated_payload(abi, given.runner, emulated_suite_runner()[0])

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        """What the device's runner uses without its being pushed (its provenance): the host executorch's QNN
        backend library and the host SDK's libQnnHtp.so, by role ("backend") or file name."""
        backend = Path(
            str(metadata.distribution("executorch").locate_file("executorch/lib/libexecutorch_backend_qnn.so"))
        )
        return {"backend": backend, "libQnnHtp.so": sdk.htp_library}

    @staticmethod
    def heap_environment(env: dict[str, str]) -> dict[str, str]:
        """env plus what makes every heap allocation start as heap_pattern, and huge pages for large blocks (the
        device commands' environment: every runner starts with it; the one body is the runner contract's)."""
        return runner_contract.heap_environment(env, EMULATED_HEAP_PATTERN)


@functools.cache
def emulated_suite_runner() -> tuple[Path | None, str]:
    """The suite's runner built for the host, which emulated devices run programs with, or None and the one
    line that says why it cannot be built (they then run them through the pybindings qnn_executor_runner).
    Built once (cached by content: harness/runner/build.py), so every worker after the controller finds it."""
    try:
        return runner_build.build(), ""
    except runner_build.RunnerBuildError as error:
        return None, str(error)


class PhoneKind:
    name = "phone"
    # A phone's libQnnHtp.so is Qualcomm's own: traced only when the interposer built with --android-ndk is
    # pushed in front of it (then the run's outputs hold trace.jsonl).
    has_execute_trace = False
    heap_pattern: int | None = None  # Android's allocator has no fill switch a runner could be started with

    @staticmethod
    def host_libraries(sdk: QnnSdk) -> dict[str, Path]:
        return {}  # a phone uses only what was pushed to it

    def payload(self, abi: str, htp_arch: int, given: PayloadInputs) -> list[PayloadFile]:
        return phone_payload(abi, htp_arch, given.phone_files())


DeviceKind = EmulatedKind | PhoneKind
KINDS: dict[str, DeviceKind] = {kind.name: kind for kind in (EmulatedKind(), PhoneKind())}


def kind_for_abi(abi: str) -> str:
    return EmulatedKind.name if abi == HOST_ABI else PhoneKind.name


def of(name: str) -> DeviceKind:
    return KINDS[name]


def payload_inputs(
    sdk: QnnSdk,
    runner: Path | None,
    backend_lib: Path | None,
    android_ndk: Path | None,
    executorch_android_build: Path | None = None,
) -> PayloadInputs:
    """The run's payload inputs; with an NDK, the interposer is built for phones, and with the user's executorch
    Android build too the suite's runner (each once: they are cached by content)."""
    android_runner = None
    if android_ndk and executorch_android_build:
        android_runner = build_android_runner(android_ndk, executorch_android_build)
    return PayloadInputs(
        sdk,
        runner,
        backend_lib,
        interposer.build_for_android(android_ndk) if android_ndk else None,
        android_runner,
    )


def build_android_runner(ndk: Path, folder: Path) -> runner_build.AndroidRunner:
    """The suite's runner for phones, built with the NDK's clang++ at the interposer's API level; a build that
    cannot be made is one DeviceError line (the run's start reports it)."""
    try:
        return runner_build.build_for_android(Path(f"{interposer.android_clang(ndk)}++"), folder)
    except (runner_build.RunnerBuildError, interposer.InterposerBuildError) as error:
        raise DeviceError(str(error)) from None


def check_payloads(devices: list[tuple[str, str, int]], given: PayloadInputs) -> None:
    """Once at the start of a run, for (kind, abi, htp arch) of every device: one DeviceError naming every
    file missing for any of them, not one error per case later; then each phone's payload is checked whole
    (runner given, for its ABI, a full SDK). With an emulated device, the suite's runner is built here (once,
    in the controller; the workers find it cached), or one line says why not and what runs instead."""
    if any(kind == EmulatedKind.name for kind, _, _ in devices):
        built, problem = emulated_suite_runner()
        if built is None:
            say(f"qnnsuite: emulated devices run programs through the pybindings qnn_executor_runner: {problem}")
    phones = sorted({(abi, htp_arch) for kind, abi, htp_arch in devices if kind == PhoneKind.name})
    files = given.phone_files()
    missing: list[str] = []
    for _abi, htp_arch in phones:
        missing += [path for path in phone_files_missing(htp_arch, files) if path not in missing]
    if missing and files.runner is not None and files.sdk_root is not None:
        raise DeviceError(missing_files_line(missing))
    for abi, htp_arch in phones:
        phone_payload(abi, htp_arch, files)
