"""Building suite_runner.cpp with the host C++ compiler against the executorch installation under test.

The executorch wheel ships what a C++ runner needs on x86_64: `executorch/include/`, `executorch/lib/`
(libexecutorch.so, the QNN backend, the kernel libraries). The binary is cached by content under the suite's
state folder, as the interposer is (harness/qnn/interposer.py): the key covers the source, the compiler's
identity and flags, and the identity of every header and library it is built against, so another
executorch (a wheel of another release, an editable build) gets its own binary and an unchanged one is
never rebuilt. A failed build is one line that names the fix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.paths import state_dir

SOURCE = Path(__file__).with_name("suite_runner.cpp")
BINARY_NAME = "suite_runner"
CACHE_FOLDER = "runner"
# Linked whether or not a symbol is referenced: the backend and the kernels register themselves from static
# initialisers. Without the kernel libraries a program with any op outside the delegate (skip-mode buffer
# copies) fails to load with "Missing operator: aten::copy_" (measured with executorch 1.5.1).
LIBRARIES = ("executorch", "executorch_backend_qnn", "executorch_kernels_optimized", "executorch_kernels_quantized")
CXX_FLAGS = ("-std=c++17", "-O2", "-Wall", "-Werror")
# The wheel's portable c10 headers are included as <c10/...> by the runtime's headers.
C10_INCLUDE = Path("executorch") / "runtime" / "core" / "portable_type" / "c10"
PROBE_HEADER = Path("executorch") / "extension" / "module" / "module.h"
# Optional: the event tracer that records an ETDump (the QNN profile, --profile-level).
ETDUMP_HEADER = Path("executorch") / "devtools" / "etdump" / "etdump_flatcc.h"
ETDUMP_LIBRARY = "executorch_etdump"
COMPILE_TIMEOUT_S = 600


class RunnerBuildError(RuntimeError):
    """The runner cannot be built here; the message is one line naming the fix."""


@dataclass(frozen=True)
class ExecutorchInstall:
    """Where the executorch under test keeps its C++ headers and libraries (and torch its headers)."""

    package: Path  # the `executorch` package folder
    torch_include: Path

    @property
    def include(self) -> Path:
        return self.package / "include"

    @property
    def lib(self) -> Path:
        return self.package / "lib"


def find_executorch() -> ExecutorchInstall:
    """The executorch and torch of this Python, located without importing them (an import takes seconds)."""
    found = {}
    for name in ("executorch", "torch"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RunnerBuildError(f"{name} is not installed in this Python: run the README's set-up command")
        found[name] = Path(next(iter(spec.submodule_search_locations)))
    install = ExecutorchInstall(found["executorch"], found["torch"] / "include")
    if not (install.include / PROBE_HEADER).is_file():
        raise RunnerBuildError(
            f"the executorch under test ({install.package}) has no C++ headers "
            f"({install.include / PROBE_HEADER} is missing): install a wheel that ships include/ "
            f"(1.5 and newer do) or build executorch from source with its CMake install step"
        )
    missing = [name for name in LIBRARIES if not (install.lib / f"lib{name}.so").is_file()]
    if missing:
        raise RunnerBuildError(
            f"the executorch under test has no {', '.join(f'lib{m}.so' for m in missing)} in "
            f"{install.lib}: use a build with the QNN backend and kernels (EXECUTORCH_BUILD_QNN=ON)"
        )
    if not install.torch_include.is_dir():
        raise RunnerBuildError(
            f"torch has no C++ headers at {install.torch_include}: reinstall torch from the registry"
        )
    return install


def find_compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise RunnerBuildError("no C++ compiler found (g++): install one, e.g. `apt-get install g++`")
    return compiler


def has_etdump(install: ExecutorchInstall) -> bool:
    """Whether this executorch ships ETDump (its header and library): the runner's --etdump_path, the QNN
    profile's path (suite_runner.cpp's header), is built only then."""
    return (install.include / ETDUMP_HEADER).is_file() and (install.lib / f"lib{ETDUMP_LIBRARY}.so").is_file()


def compile_command(compiler: str, install: ExecutorchInstall, output: Path) -> list[str]:
    """The one command that builds the runner; also what a repro bundle would record."""
    includes = [install.include, install.include / C10_INCLUDE, install.torch_include]
    etdump = has_etdump(install)
    return [
        compiler,
        *CXX_FLAGS,
        *(["-DSUITE_RUNNER_ETDUMP"] if etdump else []),
        *(f"-isystem{path}" for path in includes),
        "-o",
        str(output),
        str(SOURCE),
        f"-L{install.lib}",
        "-Wl,--no-as-needed",
        *(f"-l{name}" for name in (*LIBRARIES, *([ETDUMP_LIBRARY] if etdump else []))),
        "-Wl,--as-needed",
        f"-Wl,-rpath,{install.lib}",
    ]


def _tree_identity(folder: Path, pattern: str) -> str:
    """Name, size and modification time of every matching file: a rebuilt executorch makes a new key."""
    rows = []
    for path in sorted(folder.rglob(pattern)):
        if path.is_file():
            info = path.stat()
            rows.append(f"{path.relative_to(folder)}:{info.st_size}:{info.st_mtime_ns}")
    return "\n".join(rows)


def _compiler_identity(compiler: str) -> str:
    try:
        result = subprocess.run([compiler, "--version"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RunnerBuildError(
            f"cannot run the C++ compiler {compiler} ({error}): check that it is an executable "
            f"C++ compiler, or install g++ (`apt-get install g++`)"
        ) from error
    resolved = Path(shutil.which(compiler) or compiler).resolve()
    info = resolved.stat() if resolved.exists() else None
    return f"{resolved}:{info.st_size if info else ''}:{info.st_mtime_ns if info else ''}\n{result.stdout}"


def cache_key(compiler: str, install: ExecutorchInstall) -> str:
    parts = [
        SOURCE.read_text(),
        _compiler_identity(compiler),
        " ".join(compile_command(compiler, install, Path("out"))),
        _tree_identity(install.include, "*.h"),
        _tree_identity(install.lib, "*.so"),
        _tree_identity(install.torch_include / "c10" / "util", "*.h"),
    ]
    return hashlib.sha256("\n\0".join(parts).encode()).hexdigest()[:16]


def _compile(command: list[str], partial: Path, output: Path, *, cannot_run: str, failed: str, mismatch: str) -> None:
    """Runs one compile into `partial` and publishes it as `output` only when it succeeded: a concurrent or
    interrupted build never leaves a half-written binary where the cache looks."""
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RunnerBuildError(f"cannot run {command[0]} ({error}): {cannot_run}") from error
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
        raise RunnerBuildError(f"{failed}: {first_error[:300]} ({mismatch})")
    partial.chmod(0o700)
    partial.rename(output)


def build(compiler: str | None = None) -> Path:
    """The runner binary for this executorch: built once, then returned from the cache."""
    compiler = compiler or find_compiler()
    install = find_executorch()
    folder = state_dir() / CACHE_FOLDER / cache_key(compiler, install)
    output = folder / BINARY_NAME
    if output.is_file():
        return output
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = folder / f"{BINARY_NAME}.{os.getpid()}.partial"
    _compile(
        compile_command(compiler, install, partial),
        partial,
        output,
        cannot_run="check that it is an executable C++ compiler, or install g++ (`apt-get install g++`)",
        failed=f"building the suite's runner with {compiler} against {install.package} failed",
        mismatch="the executorch under test may not match suite_runner.cpp's API",
    )
    return output


# --- The Android build: the same source for aarch64-android with the NDK's clang++, pushed to phones ----------
# against the user's executorch Android build folder (--executorch-android-build: what CMake's install step
# writes, DIR/include and DIR/lib), so a phone runs the suite's runner too (harness/device/payload.py pushes it
# as `suite_runner`, with the shared libraries it links).
ANDROID_CACHE_FOLDER = "runner-android"
ANDROID_CXX_FLAGS = ("-std=c++17", "-O2", "-Wall", "-fPIE", "-pie", "-static-libstdc++")
# Each library the host build links, by the file names an Android build may give it (shared or static; the QNN
# backend as upstream's Android build names it too). Static registration libraries are linked whole: their
# backends and kernels register from static initialisers that nothing references.
ANDROID_LIBRARIES = {
    "executorch": ("libexecutorch.so", "libexecutorch.a"),
    "executorch_backend_qnn": (
        "libexecutorch_backend_qnn.so",
        "libqnn_executorch_backend.so",
        "libqnn_executorch_backend.a",
    ),
    "executorch_kernels_optimized": (
        "libexecutorch_kernels_optimized.so",
        "liboptimized_native_cpu_ops_lib.a",
    ),
    "executorch_kernels_quantized": ("libexecutorch_kernels_quantized.so", "libquantized_ops_lib.a"),
}
# What a static libexecutorch.a needs beside it (in the shared library these are inside libexecutorch.so).
ANDROID_STATIC_HELPERS = ("libexecutorch_core.a", "libextension_*.a")


@dataclass(frozen=True)
class AndroidRunner:
    """The runner built for phones and the shared libraries of the Android build, pushed beside it."""

    binary: Path
    libraries: tuple[Path, ...]


def android_build_problems(folder: Path) -> list[str]:
    """What the executorch Android build folder lacks for the runner, each naming the file looked for."""
    problems = []
    if not (folder / "include" / PROBE_HEADER).is_file():
        problems.append(f"the headers ({folder / 'include' / PROBE_HEADER})")
    for role, names in ANDROID_LIBRARIES.items():
        if not any((folder / "lib" / name).is_file() for name in names):
            problems.append(f"{role} ({' or '.join(str(folder / 'lib' / name) for name in names)})")
    return problems


def check_android_build(folder: Path) -> None:
    """One line naming everything the folder lacks (at the start of a run, not at the first phone case)."""
    problems = android_build_problems(folder)
    if problems:
        raise RunnerBuildError(
            f"--executorch-android-build {folder} lacks {'; '.join(problems)}: pass the folder executorch's "
            f"Android build installed into (cmake --install, with EXECUTORCH_BUILD_QNN=ON and the module extension)"
        )


def android_compile_command(compiler: str, folder: Path, torch_include: Path, output: Path) -> list[str]:
    """The one command that builds the runner for phones; also what a repro bundle would record."""
    lib = folder / "lib"
    found = [next(lib / name for name in names if (lib / name).is_file()) for names in ANDROID_LIBRARIES.values()]
    shared = [path for path in found if path.suffix == ".so"]
    whole = [path for path in found if path.suffix == ".a"]
    helpers = sorted({path for pattern in ANDROID_STATIC_HELPERS for path in lib.glob(pattern)}) if whole else []
    includes = [folder / "include", folder / "include" / C10_INCLUDE, torch_include]
    return [
        compiler,
        *ANDROID_CXX_FLAGS,
        *(f"-isystem{path}" for path in includes),
        "-o",
        str(output),
        str(SOURCE),
        f"-L{lib}",
        "-Wl,--no-as-needed",
        *(f"-l:{path.name}" for path in shared),
        *(["-Wl,--whole-archive", *map(str, whole), "-Wl,--no-whole-archive"] if whole else []),
        *(["-Wl,--start-group", *map(str, helpers), "-Wl,--end-group"] if helpers else []),
        "-Wl,--as-needed",
        "-ldl",
    ]


def build_for_android(clangxx: Path, folder: Path) -> AndroidRunner:
    """The runner for aarch64-android, built with the NDK's clang++ (harness/device/kinds/ finds it in the
    NDK, as for the interposer) against the user's executorch Android build; cached by content (source,
    compiler, command, every header and library of the build)."""
    check_android_build(folder)
    compiler = str(clangxx)
    torch_include = find_executorch().torch_include
    command = android_compile_command(compiler, folder, torch_include, Path("out"))
    key = hashlib.sha256(
        "\n\0".join(
            [
                SOURCE.read_text(),
                _compiler_identity(compiler),
                " ".join(command),
                _tree_identity(folder / "include", "*.h"),
                _tree_identity(folder / "lib", "*.so"),
                _tree_identity(folder / "lib", "*.a"),
                _tree_identity(torch_include / "c10" / "util", "*.h"),
            ]
        ).encode()
    ).hexdigest()[:16]
    cache = state_dir() / ANDROID_CACHE_FOLDER / key
    output = cache / BINARY_NAME
    # Every shared library of the build goes with it: the linked ones need others of the folder (measured with
    # the wheel's: the kernel libraries need libexecutorch_threadpool.so), pushed once per run.
    runner = AndroidRunner(output, tuple(sorted((folder / "lib").glob("*.so"))))
    if output.is_file():
        return runner
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = cache / f"{BINARY_NAME}.{os.getpid()}.partial"
    _compile(
        android_compile_command(compiler, folder, torch_include, partial),
        partial,
        output,
        cannot_run="pass the root of an Android NDK r23 or newer with --android-ndk",
        failed=f"building the suite's runner for Android with {compiler} against {folder} failed",
        mismatch="the executorch Android build may not match suite_runner.cpp's API",
    )
    return runner
