"""Device kinds: everything that differs between an emulated device and a phone, decided in this package alone.

A kind (base.py's DeviceKind: emulated.py, phone.py) says what must be pushed before a program can run
(payload), what the device can measure (its traits), the environment its runners start with and how a report
names it. The rest of the suite asks a device's kind (`of(name)`, or `named(name)` for a name read from a
report) and never looks at ABIs, SDK origins or kind names itself.
"""

from __future__ import annotations

from pathlib import Path

from harness.device.device import DeviceError
from harness.device.kinds.base import DeviceKind, PayloadInputs
from harness.device.kinds.emulated import EMULATED_HEAP_PATTERN, HOST_ABI, EmulatedKind, emulated_suite_runner
from harness.device.kinds.phone import PhoneKind
from harness.device.payload import missing_files_line, phone_files_missing, phone_payload
from harness.files import say
from harness.qnn import interposer
from harness.qnn.sdk import QnnSdk
from harness.runner import build as runner_build

__all__ = [
    "EMULATED_HEAP_PATTERN",
    "HOST_ABI",
    "KINDS",
    "DeviceKind",
    "EmulatedKind",
    "PayloadInputs",
    "PhoneKind",
    "emulated_suite_runner",
]

EMULATED = EmulatedKind()
KINDS: dict[str, DeviceKind] = {kind.name: kind for kind in (EMULATED, PhoneKind())}


def kind_for_abi(abi: str) -> str:
    """The kind of an attached device, by the binaries it runs."""
    return EmulatedKind.name if abi == HOST_ABI else PhoneKind.name


def of(name: str) -> DeviceKind:
    return KINDS[name]


def named(name: object) -> DeviceKind | None:
    """The kind a name read from a record or report names; None for none (no device ran, or a report of
    another suite's kind)."""
    return KINDS.get(name) if isinstance(name, str) else None


def simulated(name: object) -> bool:
    """Whether times recorded under this kind name are the HTP simulator's (never compared with a phone's):
    an emulated kind's, and those no known real device measured."""
    kind = named(name)
    return kind is None or kind.emulated


def report_label(name: object) -> str:
    """How a report names the device beside its times: its kind's label ("simulator" when not a real device's)."""
    return EMULATED.label if simulated(name) else KINDS[name].label


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
