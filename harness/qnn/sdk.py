"""Finding the host QNN libraries and checking they are laid out as ExecuTorch expects.

Order of preference: `--qnn-sdk PATH`, then `QNN_SDK_ROOT`, then the tree laid out at set-up from the
onnxruntime-qnn wheel (the only registry package that ships x86_64 QNN libraries). ExecuTorch reads
`$QNN_SDK_ROOT/lib/x86_64-linux-clang/libQnnHtp.so`, so that is the layout every source must have.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from harness.paths import state_dir

HOST_LIB_DIR = Path("lib") / "x86_64-linux-clang"
# What lowering and the HTP simulator load; the rest of an SDK is optional here.
REQUIRED_HOST_LIBS = ("libQnnHtp.so", "libQnnSystem.so", "libHtpPrepare.so")
WHEEL_PACKAGE = "onnxruntime_qnn"
# The wheel's libraries find their bundled libc++ through RPATH $ORIGIN/../onnxruntime_qnn.libs.
WHEEL_RUNTIME_DIR = "onnxruntime_qnn.libs"
OVERLAY_MARKER = "qnnsuite-overlay-of"


WHEEL_ORIGIN = "onnxruntime-qnn wheel"  # host libraries only: no Android or Hexagon ones


class SdkError(RuntimeError):
    """A QNN SDK problem, worded as one line that names the fix."""


@dataclass(frozen=True)
class QnnSdk:
    root: Path
    origin: str  # "--qnn-sdk", "QNN_SDK_ROOT" or WHEEL_ORIGIN

    @property
    def host_lib_dir(self) -> Path:
        return self.root / HOST_LIB_DIR

    @property
    def htp_library(self) -> Path:
        return self.host_lib_dir / "libQnnHtp.so"


def validate(root: Path, origin: str) -> QnnSdk:
    """Check the layout and say exactly what is missing."""
    root = overlay_source(root) or root
    if not root.exists():
        raise SdkError(
            f"QNN SDK path {root} (from {origin}) does not exist: "
            f"point {origin} at a QNN SDK root, or unset it to use the libraries from the onnxruntime-qnn wheel"
        )
    lib_dir = root / HOST_LIB_DIR
    if not lib_dir.is_dir():
        raise SdkError(
            f"QNN SDK at {root} (from {origin}) has no {HOST_LIB_DIR}/: "
            f"expected the x86_64 host libraries there ({', '.join(REQUIRED_HOST_LIBS)})"
        )
    missing = [name for name in REQUIRED_HOST_LIBS if not (lib_dir / name).exists()]
    if missing:
        raise SdkError(
            f"QNN SDK at {root} (from {origin}) lacks {', '.join(missing)} in {HOST_LIB_DIR}/: "
            f"use a complete QNN SDK, or unset {origin} to use the onnxruntime-qnn wheel's libraries"
        )
    return QnnSdk(root=root.resolve(), origin=origin)


def overlay_source(root: Path) -> Path | None:
    """An overlay made by harness.qnn.interposer stands for the SDK it was made from; child
    processes inherit the overlay as QNN_SDK_ROOT, and must not wrap it a second time."""
    marker = root / OVERLAY_MARKER
    return Path(marker.read_text().strip()) if marker.is_file() else None


def wheel_library_dir() -> Path:
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SdkError(
            "no QNN SDK given and the onnxruntime-qnn wheel is not installed: "
            "run the README's set-up command, or pass --qnn-sdk PATH / set QNN_SDK_ROOT"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def lay_out_wheel_tree(destination: Path | None = None, package_dir: Path | None = None) -> Path:
    """Build ROOT/lib/x86_64-linux-clang from the wheel with symbolic links (never copies: the
    licence forbids redistributing the libraries, and links cost nothing to refresh).

    package_dir: an onnxruntime_qnn folder installed elsewhere (the version matrix keeps one per
    release); default: the one this Python imports."""
    package_dir = package_dir or wheel_library_dir()
    root = destination or state_dir() / "sdk"
    lib_dir = root / HOST_LIB_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    wanted = {library.name: library for library in package_dir.glob("*.so")}
    for stale in lib_dir.iterdir():
        if stale.name not in wanted or stale.resolve() != wanted[stale.name].resolve():
            stale.unlink()
    for name, library in wanted.items():
        if not (lib_dir / name).exists():
            (lib_dir / name).symlink_to(library.resolve())
    runtime_link = root / "lib" / WHEEL_RUNTIME_DIR
    runtime_target = (package_dir.parent / WHEEL_RUNTIME_DIR).resolve()
    if runtime_link.is_symlink() and runtime_link.resolve() != runtime_target:
        runtime_link.unlink()
    if not runtime_link.exists():
        runtime_link.symlink_to(runtime_target)
    return root


def resolve(cli_path: str | None = None) -> QnnSdk:
    """The SDK this run uses, validated."""
    if cli_path:
        return validate(Path(cli_path).expanduser(), "--qnn-sdk")
    env_path = os.environ.get("QNN_SDK_ROOT")
    if env_path:
        return validate(Path(env_path).expanduser(), "QNN_SDK_ROOT")
    root = state_dir() / "sdk"
    if not (root / HOST_LIB_DIR / "libQnnHtp.so").exists():
        root = lay_out_wheel_tree(root)
    return validate(root, WHEEL_ORIGIN)
