"""Building the interposer (interposer.c) and the overlay tree that puts it in front of an SDK.

The overlay is ROOT/lib/x86_64-linux-clang/ with a link to every library of the chosen SDK, except
that libQnnHtp.so is the interposer and the real one sits beside it as libQnnHtp.real.so. ExecuTorch
loads libQnnHtp.so both by absolute path ($QNN_SDK_ROOT/...) and by name (LD_LIBRARY_PATH); the
overlay makes both reach the interposer, and the SDK itself is never modified.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from harness.paths import state_dir
from harness.qnn.sdk import HOST_LIB_DIR, OVERLAY_MARKER, WHEEL_RUNTIME_DIR, QnnSdk

SOURCE = Path(__file__).with_name("interposer.c")
REAL_LIBRARY_NAME = "libQnnHtp.real.so"


class InterposerBuildError(RuntimeError):
    """The system C compiler could not build the interposer."""


def build() -> Path:
    """Compile once per source version; later calls return the cached library."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    output = state_dir() / "interposer" / digest / "libQnnHtp.so"
    if output.exists():
        return output
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise InterposerBuildError("no C compiler found (cc/gcc): install one, e.g. `apt-get install gcc`")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial")
    command = [compiler, "-O2", "-Wall", "-Werror", "-fPIC", "-shared", "-fvisibility=hidden",
               "-Wl,-soname,libQnnHtp.so", "-Wl,-z,nodelete", "-Wl,-Bsymbolic",
               "-o", str(partial), str(SOURCE), "-ldl", "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
        raise InterposerBuildError(f"building the interposer with {compiler} failed: {first_error}")
    partial.rename(output)
    return output


def overlay(sdk: QnnSdk, interposer: Path) -> Path:
    """An SDK-shaped tree for `sdk` with the interposer in front; cheap and idempotent."""
    key = hashlib.sha256(f"{sdk.root}|{interposer}".encode()).hexdigest()[:16]
    root = state_dir() / "overlay" / key
    lib_dir = root / HOST_LIB_DIR
    lib_dir.mkdir(parents=True, exist_ok=True)
    links = {entry.name: entry.resolve() for entry in sdk.host_lib_dir.iterdir()}
    links[REAL_LIBRARY_NAME] = links.pop("libQnnHtp.so")
    links["libQnnHtp.so"] = interposer.resolve()
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
