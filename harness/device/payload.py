"""What must be on a device before a .pte can run there, per device kind.

A phone gets the user's Android runner, executorch's QNN backend library and the QNN libraries for its
HTP arch, the same seven files upstream's scripts push (SimpleADB in executorch's
backends/qualcomm/export_utils.py); with a trace interposer built for Android (--android-ndk), that
interposer is pushed as libQnnHtp.so and Qualcomm's library beside it as libQnnHtp.real.so, as the host
overlay does (harness/qnn/interposer.py). An emulated device gets the emulated runner, since its QNN
libraries are the host's. Which one a device is, is decided in harness/device/kinds/.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.device.device import DeviceError
from harness.qnn.interposer import REAL_LIBRARY_NAME
from harness.runner import contract as runner_contract

EMULATED_RUNNER = Path(__file__).resolve().parent.parent / "emulator" / "qnn_executor_runner"
# The emulated device's suite_runner command, and the compiled runner it starts, pushed beside it
# (harness/emulator/compiled_runner.py).
EMULATED_SUITE_RUNNER = EMULATED_RUNNER.with_name("suite_runner")
SUITE_RUNNER_BINARY_NAME = "suite_runner.bin"
RUNNER_NAME = runner_contract.EXECUTOR_RUNNER
# The suite's compiled runner (harness/runner/suite_runner.cpp): a step plan in one process, per-step times.
SUITE_RUNNER_NAME = runner_contract.SUITE_RUNNER
# The payload's runner commands, the names run_case's `runner` takes.
RUNNER_COMMANDS = (SUITE_RUNNER_NAME, RUNNER_NAME)
BACKEND_LIBRARY = "libqnn_executorch_backend.so"
# Where a standard executorch Android build (BUILD/) puts the runner and the backend library.
RUNNER_BUILD_DIR = ("examples", "qualcomm", "executor_runner")
BACKEND_BUILD_DIR = Path("backends") / "qualcomm"
ELF_MACHINES = {183: "arm64-v8a", 62: "x86_64", 40: "armeabi-v7a", 3: "x86"}


@dataclass(frozen=True)
class PayloadFile:
    local: Path
    remote_name: str
    mode: int = 0o644


@dataclass(frozen=True)
class PhoneFiles:
    """What the user gave for phones: --runner, --backend-lib, a full QNN SDK, the interposer built for Android."""

    runner: Path | None
    sdk_root: Path | None  # None: only the host libraries are at hand, which a phone cannot use
    backend_lib: Path | None = None  # --backend-lib; else found from the runner's place
    trace_interposer: Path | None = None  # harness.qnn.interposer.build_for_android (--android-ndk)
    # The suite's runner built for phones (harness.runner.build.build_for_android: --android-ndk with
    # --executorch-android-build) and the shared libraries of the user's Android build it links.
    suite_runner: Path | None = None
    suite_runner_libraries: tuple[Path, ...] = ()


def elf_abi(path: Path) -> str | None:
    """The Android ABI an ELF binary is built for; None for scripts and other files."""
    header = path.read_bytes()[:20]
    if header[:4] != b"\x7fELF":
        return None
    return ELF_MACHINES.get(
        int.from_bytes(header[18:20], "little"), f"machine {int.from_bytes(header[18:20], 'little')}"
    )


def _checked_runner(runner: Path, abi: str) -> PayloadFile:
    if not runner.is_file():
        raise DeviceError(f"--runner {runner} does not exist: pass the path of your Android qnn_executor_runner build")
    runner_abi = elf_abi(runner)
    if runner_abi is not None and runner_abi != abi:
        raise DeviceError(
            f"--runner {runner} is built for {runner_abi} but the device is {abi}: build qnn_executor_runner for {abi}"
        )
    return PayloadFile(runner, RUNNER_NAME, 0o755)


def backend_library_candidates(runner: Path) -> list[Path]:
    """Beside the runner, then BUILD/backends/qualcomm/ when the runner is in BUILD/examples/qualcomm/executor_runner/."""
    candidates = [runner.parent / BACKEND_LIBRARY]
    if runner.parent.parts[-len(RUNNER_BUILD_DIR) :] == RUNNER_BUILD_DIR:
        candidates.append(runner.parents[len(RUNNER_BUILD_DIR)] / BACKEND_BUILD_DIR / BACKEND_LIBRARY)
    return candidates


def emulated_payload(abi: str, runner: Path | None, suite_runner: Path | None = None) -> list[PayloadFile]:
    """An emulated device runs host binaries: the emulated (pybindings) runner, or the user's host-built one,
    and, when the suite's runner was built for the host (suite_runner: the binary), its command and binary."""
    files = [_checked_runner(runner, abi)] if runner is not None else [PayloadFile(EMULATED_RUNNER, RUNNER_NAME, 0o755)]
    if suite_runner is not None:
        files += [
            PayloadFile(EMULATED_SUITE_RUNNER, SUITE_RUNNER_NAME, 0o755),
            PayloadFile(suite_runner, SUITE_RUNNER_BINARY_NAME, 0o755),
        ]
    return files


def _sdk_libraries(sdk_root: Path, htp_arch: int) -> list[Path]:
    android = sdk_root / "lib" / "aarch64-android"
    return [
        android / "libQnnHtp.so",
        android / f"libQnnHtpV{htp_arch}Stub.so",
        android / "libQnnHtpPrepare.so",
        android / "libQnnSystem.so",
        sdk_root / "lib" / f"hexagon-v{htp_arch}" / "unsigned" / f"libQnnHtpV{htp_arch}Skel.so",
    ]


def phone_files_missing(htp_arch: int, given: PhoneFiles) -> list[str]:
    """Every file a phone of this HTP arch needs that is not there, each with where it was looked for."""
    missing = []
    if given.sdk_root is not None:
        missing += [str(path) for path in _sdk_libraries(given.sdk_root, htp_arch) if not path.is_file()]
    if given.backend_lib is not None:
        if not given.backend_lib.is_file():
            missing.append(f"{given.backend_lib} (--backend-lib)")
    elif given.runner is not None and not any(path.is_file() for path in backend_library_candidates(given.runner)):
        missing.append(" or ".join(str(path) for path in backend_library_candidates(given.runner)))
    if given.trace_interposer is not None and not given.trace_interposer.is_file():
        missing.append(f"{given.trace_interposer} (the interposer built with --android-ndk)")
    return missing


def missing_files_line(missing: list[str]) -> str:
    """The one line that names every missing file and the fix."""
    return (
        f"files to push to the phones are missing: {'; '.join(missing)}: use a QNN SDK with Android and "
        f"Hexagon libraries (--qnn-sdk), and pass --backend-lib PATH unless {BACKEND_LIBRARY} is beside the "
        f"runner or in BUILD/{BACKEND_BUILD_DIR}/ of the runner's build folder"
    )


def phone_payload(abi: str, htp_arch: int, given: PhoneFiles) -> list[PayloadFile]:
    """A phone gets the user's Android runner, the backend library and the QNN libraries of its HTP arch,
    as upstream pushes them (plus the trace interposer in front of libQnnHtp.so when there is one)."""
    if given.runner is None:
        raise DeviceError(
            f"a {abi} device needs its Android qnn_executor_runner: pass --runner PATH "
            f"(built from executorch's examples/qualcomm/executor_runner)"
        )
    files = [_checked_runner(given.runner, abi)]
    if given.sdk_root is None:
        raise DeviceError(
            "pushing to a phone needs a full QNN SDK for its libraries: pass --qnn-sdk or set QNN_SDK_ROOT"
        )
    missing = phone_files_missing(htp_arch, given)
    if missing:
        raise DeviceError(missing_files_line(missing))
    backend = given.backend_lib or next(path for path in backend_library_candidates(given.runner) if path.is_file())
    libraries = [PayloadFile(path, path.name) for path in _sdk_libraries(given.sdk_root, htp_arch)]
    if given.trace_interposer is not None:
        real = libraries[0]
        libraries[0:1] = [
            PayloadFile(given.trace_interposer, real.remote_name),
            PayloadFile(real.local, REAL_LIBRARY_NAME),
        ]
    return files + libraries + [PayloadFile(backend, BACKEND_LIBRARY)] + suite_runner_payload(abi, given)


def suite_runner_payload(abi: str, given: PhoneFiles) -> list[PayloadFile]:
    """The suite's runner built for phones, pushed as `suite_runner`, and the shared libraries it links, each
    under its own name (the backend library again when the build names it otherwise: the runner links it by
    the build's name)."""
    if given.suite_runner is None:
        return []
    runner_abi = elf_abi(given.suite_runner)
    if runner_abi is not None and runner_abi != abi:
        raise DeviceError(
            f"the suite's runner {given.suite_runner} is built for {runner_abi} but the device is {abi}: "
            f"pass an NDK whose clang targets {abi} with --android-ndk"
        )
    return [PayloadFile(given.suite_runner, SUITE_RUNNER_NAME, 0o755)] + [
        PayloadFile(path, path.name) for path in given.suite_runner_libraries if path.name != BACKEND_LIBRARY
    ]
