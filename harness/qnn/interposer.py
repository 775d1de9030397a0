"""Building the interposer (interposer.c), the system bridge (system_bridge.c) and the overlay tree that puts
them in front of an SDK.

The overlay is ROOT/lib/x86_64-linux-clang/ with a link to every library of the chosen SDK, except
that libQnnHtp.so is the interposer and the real one sits beside it as libQnnHtp.real.so. ExecuTorch
loads libQnnHtp.so both by absolute path ($QNN_SDK_ROOT/...) and by name (LD_LIBRARY_PATH); the
overlay makes both reach the interposer, and the SDK itself is never modified. Likewise libQnnSystem.so is the
system bridge (docs/FINDINGS.md#F19), the real one beside it as libQnnSystem.real.so; it changes nothing unless
QNNSUITE_BRIDGE_COMPOSE_GRAPHS=1 (harness/qnn/toolchain.py decides).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from harness.paths import state_dir
from harness.qnn.sdk import HOST_LIB_DIR, OVERLAY_MARKER, WHEEL_RUNTIME_DIR, QnnSdk

SOURCE = Path(__file__).with_name("interposer.c")
REAL_LIBRARY_NAME = "libQnnHtp.real.so"
SYSTEM_SOURCE = Path(__file__).with_name("system_bridge.c")
SYSTEM_LIBRARY_NAME = "libQnnSystem.so"  # built beside the interposer when asked (system_bridge=True)
REAL_SYSTEM_LIBRARY_NAME = "libQnnSystem.real.so"


# Where an Android NDK keeps its clang drivers, one per API level (aarch64-linux-android30-clang, ...).
NDK_CLANG_DIR = Path("toolchains") / "llvm" / "prebuilt" / "linux-x86_64" / "bin"
NDK_CLANG_PREFIX = "aarch64-linux-android"
# Android 11 (API 30): what the oldest SoC of the table (SM8350) shipped with; the lowest level at or above
# it that the NDK has is used, so the library loads on every phone the suite knows.
MIN_ANDROID_API = 30
COMMON_FLAGS = (
    "-O2",
    "-Wall",
    "-Werror",
    "-fPIC",
    "-shared",
    "-fvisibility=hidden",
    "-Wl,-z,nodelete",
    "-Wl,-Bsymbolic",
)
HOST_LIBRARIES = ("-ldl", "-lpthread")


class InterposerBuildError(RuntimeError):
    """The C compiler (the system's, or the NDK's) could not build the interposer."""


def build(
    compiler: str | None = None,
    defines: tuple[str, ...] = (),
    libraries: tuple[str, ...] = HOST_LIBRARIES,
    folder: str = "interposer",
    system_bridge: bool = True,
) -> Path:
    """Compile once per source, compiler and defines; later calls return the cached library (libQnnHtp.so).

    compiler: default the system's cc; defines: -D options (e.g. the emulated phone's variable prefix);
    system_bridge: also build the system bridge, as libQnnSystem.so beside it (hosts and emulated phones, which
    run the host's x86_64 libraries; never a phone's build, whose need is not measured: F19)."""
    compiler = compiler or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise InterposerBuildError("no C compiler found (cc/gcc): install one, e.g. `apt-get install gcc`")
    key = SOURCE.read_bytes() + (SYSTEM_SOURCE.read_bytes() if system_bridge else b"")
    if (defines, libraries, folder) != ((), HOST_LIBRARIES, "interposer"):  # the host build keeps its key
        key += "|".join([compiler, _compiler_identity(compiler), *defines, *libraries]).encode()
    output = state_dir() / folder / hashlib.sha256(key).hexdigest()[:16] / "libQnnHtp.so"
    if output.exists():  # built last: the folder is complete
        return output
    if system_bridge:
        _compile(compiler, defines, libraries, SYSTEM_SOURCE, output.with_name(SYSTEM_LIBRARY_NAME))
    _compile(compiler, defines, libraries, SOURCE, output)
    return output


def _compile(compiler: str, defines: tuple[str, ...], libraries: tuple[str, ...], source: Path, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(f".{os.getpid()}.partial")
    command = [compiler, *COMMON_FLAGS, f"-Wl,-soname,{output.name}", *defines, "-o", str(partial), str(source)]
    try:
        result = subprocess.run([*command, *libraries], capture_output=True, text=True)
    except OSError as error:
        raise InterposerBuildError(
            f"cannot run {compiler} ({error}): check that it is an executable C compiler"
        ) from error
    if result.returncode != 0:
        first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
        raise InterposerBuildError(
            f"building the interposer ({source.name}) with {compiler} failed: {first_error[:300]}"
        )
    partial.rename(output)


def _compiler_identity(compiler: str) -> str:
    """Size and modification time: a rebuilt or replaced compiler makes a new library."""
    try:
        info = Path(compiler).stat()
    except OSError:
        return ""
    return f"{info.st_size}:{info.st_mtime_ns}"


def android_clang(ndk: Path) -> Path:
    """The NDK's clang for aarch64-linux-android at the lowest API level >= MIN_ANDROID_API it has."""
    folder = ndk / NDK_CLANG_DIR
    levels = sorted(
        int(match.group(1))
        for path in (folder.iterdir() if folder.is_dir() else [])
        if (match := re.fullmatch(rf"{NDK_CLANG_PREFIX}(\d+)-clang", path.name))
    )
    usable = [level for level in levels if level >= MIN_ANDROID_API]
    if not usable:
        found = f"it has API levels {', '.join(map(str, levels))}" if levels else "none is there"
        raise InterposerBuildError(
            f"Android NDK {ndk} has no {NDK_CLANG_DIR}/{NDK_CLANG_PREFIX}<API>-clang for API "
            f"{MIN_ANDROID_API} or newer ({found}): pass the root of an Android NDK r23 or newer"
        )
    return folder / f"{NDK_CLANG_PREFIX}{usable[0]}-clang"


def build_for_android(ndk: Path) -> Path:
    """The interposer built for phones with the NDK's clang (bionic has pthread in libc, so only -ldl)."""
    return build(str(android_clang(ndk)), libraries=("-ldl",), folder="interposer-android", system_bridge=False)


def overlay(sdk: QnnSdk, interposer: Path) -> Path:
    """An SDK-shaped tree for `sdk` with the interposer in front; cheap and idempotent."""
    key = hashlib.sha256(f"{sdk.root}|{interposer}".encode()).hexdigest()[:16]
    root = state_dir() / "overlay" / key
    lib_dir = root / HOST_LIB_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    links = {entry.name: entry.resolve() for entry in sdk.host_lib_dir.iterdir()}
    links[REAL_LIBRARY_NAME] = links.pop("libQnnHtp.so")
    links["libQnnHtp.so"] = interposer.resolve()
    system_bridge = interposer.with_name(SYSTEM_LIBRARY_NAME)
    if system_bridge.exists() and SYSTEM_LIBRARY_NAME in links:
        links[REAL_SYSTEM_LIBRARY_NAME] = links.pop(SYSTEM_LIBRARY_NAME)
        links[SYSTEM_LIBRARY_NAME] = system_bridge.resolve()
    for name, target in links.items():
        _link(lib_dir / name, target)
    runtime_dir = sdk.root / "lib" / WHEEL_RUNTIME_DIR
    if runtime_dir.exists():
        # The wheel's libraries look for their libc++ at $ORIGIN/../onnxruntime_qnn.libs.
        _link(root / "lib" / WHEEL_RUNTIME_DIR, runtime_dir.resolve())
    (root / OVERLAY_MARKER).write_text(str(sdk.root))
    return root


def _link(path: Path, target: Path) -> None:
    if path.is_symlink() and path.resolve() == target:
        return
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)
