"""An emulated device that looks like a phone to the harness (`python -m harness emulate --as-phone`).

What the harness can see is what a Snapdragon phone shows: ABI arm64-v8a, the SoC only where phones put it
(per device one of ro.soc.model, the ro.board.platform codename or ro.hardware; ro.soc.model is left out on
all but the first device of three), no heap pattern and no execute trace unless the harness pushes its
interposer. It runs a pushed qnn_executor_runner with the pushed libraries (harness/emulator/phone_runtime.py).
For tests and for trying the phone path, this module also writes what a phone user has: a QNN SDK tree with
the phone layout, whose "Android" libraries are the host's x86 QNN libraries under QAIRT's file names (the
DSP-side Stub and Skel are stand-ins: the x86 simulator inside libQnnHtp.so does their work), and a standard
executorch build folder whose runner is the emulated one and whose backend library is the host executorch's.
Nothing is copied: Qualcomm's licence forbids redistributing the libraries, so the trees are links.
The build folder is also an install tree (include/, lib/) for --executorch-android-build, and write_ndk makes a
stand-in NDK whose compilers are the host's, so the suite's runner is "built for Android" and pushed to emulated
phones as to real ones; `python -m harness.emulator.phone BINARY ARGS` starts such a runner as a phone's loader
would, with the emulated phone's QNN adaptation in front of the pushed libQnnHtp.so.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from harness.device.payload import BACKEND_BUILD_DIR, BACKEND_LIBRARY, EMULATED_RUNNER, RUNNER_BUILD_DIR, RUNNER_NAME
from harness.emulator.phone_runtime import PHONE_ENV, runner_environment
from harness.paths import REPO_ROOT
from harness.qnn import interposer, soc as soc_table
from harness.qnn.sdk import HOST_LIB_DIR, WHEEL_RUNTIME_DIR, QnnSdk
from harness.qnn.toolchain import Toolchain
from harness.runner import build as runner_build
from harness.user_state import folder_problem

PHONE_ABI = "arm64-v8a"
# The emulated phone's own bridge reads QNNSUITE_PHONE_HW_* so that a pushed interposer's QNNSUITE_* are its own.
BRIDGE_PREFIX = "QNNSUITE_PHONE_HW_"
ANDROID_LIB_DIR = Path("lib") / "aarch64-android"
# QAIRT's Android names for the host libraries that do the same work.
ANDROID_NAMES = {
    "libQnnHtp.so": "libQnnHtp.so",
    "libQnnSystem.so": "libQnnSystem.so",
    "libQnnHtpPrepare.so": "libHtpPrepare.so",
}
# Variables of the host toolchain that a phone's commands must not see: the host overlay (interposer, trace).
HOST_ONLY_VARIABLES = (
    "QNN_SDK_ROOT",
    "LD_LIBRARY_PATH",
    "QNNSUITE_TRACE",
    "QNNSUITE_BRIDGE_DEVICE_CONFIG",
    "QNNSUITE_BRIDGE_COMPOSE_GRAPHS",
    "MALLOC_PERTURB_",
    "GLIBC_TUNABLES",
)


def soc_properties(soc: str, index: int) -> dict[str, str]:
    """How device number `index` exposes its SoC: ro.soc.model (every third), else the platform codename,
    else ro.hardware; a SoC without a codename in harness/qnn/soc.py keeps ro.soc.model."""
    codename = next((name for name, socs in soc_table.PLATFORM_CODENAMES.items() if socs == (soc,)), None)
    way = index % 3 if codename else 0
    if way == 0:
        return {"ro.soc.model": soc, "ro.board.platform": codename or "", "ro.hardware": "qcom"}
    if way == 1:
        return {"ro.board.platform": codename, "ro.hardware": "qcom"}
    return {"ro.board.platform": "", "ro.hardware": codename}


def bridge_library() -> Path:
    """The emulated phone's adaptation of the host QNN library to the host executorch (built once)."""
    return interposer.build(defines=(f'-DENV_PREFIX="{BRIDGE_PREFIX}"',), folder="interposer-phone-hw")


def device_environment(toolchain: Toolchain, base: dict[str, str]) -> dict[str, str]:
    """What an emulated phone's commands run with: the host Python for its runner, the libc++ the host QNN
    libraries need (a phone's system libraries), its bridge; none of the host overlay."""
    env = {key: value for key, value in base.items() if key not in HOST_ONLY_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    runtime = toolchain.sdk.root / "lib" / WHEEL_RUNTIME_DIR
    env["LD_LIBRARY_PATH"] = str(runtime.resolve()) if runtime.exists() else ""
    env[PHONE_ENV] = str(bridge_library().parent)
    env[f"{BRIDGE_PREFIX}BRIDGE_DEVICE_CONFIG"] = "1" if toolchain.probe.bridge_device_config else "0"
    env[f"{BRIDGE_PREFIX}BRIDGE_COMPOSE_GRAPHS"] = "1" if toolchain.probe.bridge_compose_graphs else "0"
    return env


class UnsafeDestination(OSError):
    """A --write-sdk/--write-build folder that is not a fresh folder of this user's; the message names the fix."""


def fresh_folder(destination: Path, option: str) -> Path:
    """`destination` (made absolute, never resolved through links) as a new or empty folder of this user's that
    no one else may write: everything written below it is then ours, so plain paths under it cannot be
    redirected. A folder another user made (in /tmp, say) could hold their symlinks, or stay theirs."""
    destination = Path(os.path.abspath(destination))
    for parent in reversed(destination.parents):  # another user's link above it would say where we write
        parent_info = os.lstat(parent) if os.path.lexists(parent) else None
        if parent_info is not None and stat.S_ISLNK(parent_info.st_mode) and parent_info.st_uid != os.getuid():
            raise UnsafeDestination(
                f"{option} {destination} lies under {parent}, a symlink of uid {parent_info.st_uid}: "
                f"name a new folder of yours (e.g. under $HOME) and it is created fresh"
            )
    missing = [parent for parent in [destination, *destination.parents] if not os.path.lexists(parent)]
    for folder in reversed(missing):  # the components we create: 0700 until written, never through a link
        try:
            os.mkdir(folder, 0o755 if folder != destination else 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked below like any existing folder
    for parent in destination.parents:  # another user who may rename entries of a parent could swap ours
        parent_info = os.stat(parent)
        if parent_info.st_uid not in (0, os.getuid()) or (
            parent_info.st_mode & 0o022 and not parent_info.st_mode & stat.S_ISVTX
        ):
            raise UnsafeDestination(
                f"{option} {destination} lies in {parent}, which uid {parent_info.st_uid} owns or "
                f"others may change: name a new folder of yours (e.g. under $HOME)"
            )
    info = os.lstat(destination)
    problem = folder_problem(info, forbidden_mode=0o022, mode_words="writable by others")
    if not problem:
        descriptor = os.open(destination, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            opened = os.fstat(descriptor)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                problem = "changed while it was checked"
            elif os.listdir(descriptor):
                problem = "is not empty"
        finally:
            os.close(descriptor)
    if problem:
        raise UnsafeDestination(
            f"{option} {destination} {problem}: name a new folder of yours (e.g. under $HOME) and it is created fresh"
        )
    os.chmod(destination, 0o755)  # ours and empty: readable as an SDK tree is, writable by us only
    return destination


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target.resolve())


DSP_STAND_IN = (
    "emulated phone: stand-in for Qualcomm's {name}; the DSP side of HTP v{arch} is the x86 "
    "simulator inside libQnnHtp.so, so this file is pushed as upstream pushes it and never loaded\n"
)


def write_sdk(destination: Path, sdk: QnnSdk) -> Path:
    """A QNN SDK tree with the phone layout (lib/aarch64-android, lib/hexagon-v{arch}/unsigned) for every
    HTP arch the SoC table knows, plus the host libraries (so --qnn-sdk also serves lowering). `destination`
    must be new or an empty folder of the user's (fresh_folder)."""
    destination = fresh_folder(destination, "--write-sdk")
    for entry in sdk.host_lib_dir.iterdir():
        _link(destination / HOST_LIB_DIR / entry.name, entry)
    runtime = sdk.root / "lib" / WHEEL_RUNTIME_DIR
    if runtime.exists():
        _link(destination / "lib" / WHEEL_RUNTIME_DIR, runtime)
    for android_name, host_name in ANDROID_NAMES.items():
        _link(destination / ANDROID_LIB_DIR / android_name, sdk.host_lib_dir / host_name)
    for arch in sorted({soc.htp_arch for soc in soc_table.table().values()}):
        stub = destination / ANDROID_LIB_DIR / f"libQnnHtpV{arch}Stub.so"
        skel = destination / "lib" / f"hexagon-v{arch}" / "unsigned" / f"libQnnHtpV{arch}Skel.so"
        for path in (stub, skel):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(DSP_STAND_IN.format(name=path.name, arch=arch))
    return destination


def write_build(destination: Path) -> Path:
    """A standard executorch build folder: the runner where upstream's build puts it, and the backend library
    in backends/qualcomm/ (the host executorch's QNN backend). Returns the runner's path. `destination` must
    be new or an empty folder of the user's (fresh_folder)."""
    destination = fresh_folder(destination, "--write-build")
    runner = destination.joinpath(*RUNNER_BUILD_DIR, RUNNER_NAME)
    _link(runner, EMULATED_RUNNER)
    spec = importlib.util.find_spec("executorch")  # a namespace package: no __file__
    if spec is None or not spec.submodule_search_locations:
        raise OSError("executorch is not installed in this Python: run the README's set-up command")
    package = Path(next(iter(spec.submodule_search_locations)))
    _link(destination / BACKEND_BUILD_DIR / BACKEND_LIBRARY, package / "lib" / "libexecutorch_backend_qnn.so")
    # What executorch's CMake install step writes beside it, which --executorch-android-build reads: the headers
    # and the libraries (the host executorch's, which the emulated phone runs).
    _link(destination / "include", package / "include")
    for library in (package / "lib").glob("libexecutorch*.so"):
        _link(destination / "lib" / library.name, library)
    return runner


# --- The stand-in NDK: how emulated phones get the suite's runner "built for Android" ------------------------
# Its clang is the host cc (the interposer's build) and its clang++ compiles with the host g++: the emulated
# phone runs host binaries. A phone's loader would then start the runner with the device's own QNN adaptation
# in front of the pushed libQnnHtp.so (phone_runtime.runner_environment, as for the emulated
# qnn_executor_runner); the emulated phone has no such loader for a pushed executable, so the stand-in
# compiler writes the runner as a host binary beside its output and the output as the phone's start of it.
STAND_IN_NOTE = "stand-in for the NDK's {name}: the emulated phones run host binaries"
HOST_BINARY_SUFFIX = ".host-elf"


def write_ndk(destination: Path) -> Path:
    """A stand-in Android NDK (only what the suite uses of one: the aarch64 clang and clang++ drivers at the
    lowest API level it accepts); `destination` must be new or an empty folder of the user's (fresh_folder)."""
    destination = fresh_folder(destination, "--write-ndk")
    prefix = f"{interposer.NDK_CLANG_PREFIX}{interposer.MIN_ANDROID_API}"
    folder = destination / interposer.NDK_CLANG_DIR
    folder.mkdir(parents=True)
    clang = folder / f"{prefix}-clang"
    clang.write_text(f'#!/bin/sh\n# {STAND_IN_NOTE.format(name=clang.name)}\nexec cc "$@"\n')
    clangxx = folder / f"{prefix}-clang++"
    clangxx.write_text(
        f"#!{sys.executable}\n# {STAND_IN_NOTE.format(name=clangxx.name)}\nimport sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\nfrom harness.emulator.phone import stand_in_compile\n"
        f"sys.exit(stand_in_compile(sys.argv[1:]))\n"
    )
    for path in (clang, clangxx):
        path.chmod(0o755)
    return destination


def stand_in_compile(arguments: list[str]) -> int:
    """The stand-in clang++: the host g++ builds OUTPUT + HOST_BINARY_SUFFIX from the same arguments, and OUTPUT
    becomes the emulated phone's start of it (`python -m harness.emulator.phone BINARY ARGS`)."""
    if "-o" not in arguments or arguments.index("-o") + 1 >= len(arguments):
        print("stand-in clang++: error: no -o OUTPUT", file=sys.stderr)
        return 2
    at = arguments.index("-o") + 1
    output = Path(arguments[at])
    binary = output.with_name(output.name + HOST_BINARY_SUFFIX)
    compiler = runner_build.find_compiler()  # the host's, as the suite's host build of the runner uses
    compiled = subprocess.run([compiler, *arguments[:at], str(binary), *arguments[at + 1 :]], check=False)
    if compiled.returncode != 0:
        return compiled.returncode
    output.write_text(
        f"#!/bin/sh\n# emulated phone: {binary.name} started as a phone's loader would (harness/emulator/phone.py)\n"
        f'exec "${{QNNSUITE_PYTHON:?this runner only works on an emulated phone}}" -m harness.emulator.phone '
        f'{shlex.quote(str(binary))} "$@"\n'
    )
    output.chmod(0o755)
    return 0


def start_runner(binary: str, arguments: list[str]) -> None:
    """Start a runner built by the stand-in compiler with the emulated phone's QNN adaptation in front."""
    os.execve(binary, [binary, *arguments], runner_environment(dict(os.environ)))


if __name__ == "__main__":
    start_runner(sys.argv[1], sys.argv[2:])
