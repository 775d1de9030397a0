"""The matrix's environments: a virtual environment per executorch release and a host QNN tree per
onnxruntime-qnn release, each made once under .cache/matrix/ (git-ignored) and reused while its recipe holds.

Every venv gets the pins of requirements.txt (torch==2.13.0 exactly: the CPU build on disk) with the
executorch release swapped in; pip's cache is the user's, shared by all of them. A QNN tree is the wheel's
libraries installed into a folder of their own and laid out as an SDK (links only; nothing is copied).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from harness.paths import REPO_ROOT
from harness.qnn import qairt
from harness.qnn.sdk import HOST_LIB_DIR, REQUIRED_HOST_LIBS, WHEEL_PACKAGE, lay_out_wheel_tree

MATRIX_HOME = REPO_ROOT / ".cache" / "matrix"
REQUIREMENTS = REPO_ROOT / "requirements.txt"
# Swapped per column (executorch) or kept out of the venvs (the QNN libraries come from each column's tree).
PER_COLUMN = ("executorch", "onnxruntime-qnn")
# executorch's Qualcomm backend imports cpuinfo; not every wheel declares it (1.4.1 was measured not to).
# Installed in every venv alike, so no release is special-cased.
COMMON_EXTRAS = ("py-cpuinfo==9.0.0",)
STAMP = ".qnnsuite-matrix-stamp"
PIP_TIMEOUT_S = 1800


class MatrixSetupError(RuntimeError):
    """An environment of one combination cannot be made; one line saying why (the matrix goes on)."""


def release(text: str, what: str) -> str:
    """A version given on the command line, validated (it becomes part of paths and pip requirements)."""
    try:
        version = Version(text.strip())
    except InvalidVersion:
        raise MatrixSetupError(f"{what} {text!r} is not a version: give releases like 1.5.1") from None
    return str(version)


def requirements_for(executorch: str, requirements: Path = REQUIREMENTS, wheel: Path | None = None) -> list[str]:
    """requirements.txt with executorch swapped for `executorch` (or for a wheel file of it) and onnxruntime-qnn
    left out."""
    wanted = []
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            name = Requirement(line).name.lower()
        except InvalidRequirement as error:
            detail = str(error).splitlines()[0] if str(error) else "unparsable"
            raise MatrixSetupError(f"{requirements}: {line!r} is not a requirement ({detail})") from None
        if name not in PER_COLUMN:
            wanted.append(line)
    swapped = (
        f"executorch @ {wheel.resolve().as_uri()}" if wheel else f"executorch=={release(executorch, 'executorch')}"
    )
    return [*wanted, swapped, *COMMON_EXTRAS]


@dataclass(frozen=True)
class PythonEnv:
    executorch: str
    root: Path
    reused: bool

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"


def _pip_failure(completed: subprocess.CompletedProcess, what: str) -> MatrixSetupError:
    lines = [line.strip() for line in (completed.stderr + completed.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    detail = (errors or lines or [f"pip exited {completed.returncode}"])[0]
    return MatrixSetupError(f"{what}: {detail.removeprefix('ERROR: ')}")


def kept_wheel(wheel: Path, home: Path = MATRIX_HOME) -> tuple[Path, str]:
    """(a copy of the wheel under home, named by its sha256; that sha256). A venv keyed by the wheel's path
    would serve one wheel's install for another put at the same path later; hashing while copying, then
    installing the copy, leaves no moment where the file pip reads is not the one hashed."""
    kept = home / "wheels"
    kept.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=kept, delete=False) as copy:
        try:
            with wheel.open("rb") as source:
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    copy.write(chunk)
        except OSError as error:
            os.unlink(copy.name)
            raise MatrixSetupError(f"cannot read the wheel {wheel} ({error.strerror or error})") from None
    folder = kept / digest.hexdigest()
    folder.mkdir(exist_ok=True)
    os.replace(copy.name, folder / wheel.name)
    return folder / wheel.name, digest.hexdigest()


def ensure_venv(
    executorch: str, home: Path = MATRIX_HOME, base_python: str = sys.executable, wheel: Path | None = None
) -> PythonEnv:
    """The venv of one executorch release (or wheel file, for bisect): made on first use, reused while
    requirements.txt holds."""
    name = f"executorch-{release(executorch, 'executorch')}"
    if wheel is not None:  # keyed by what the wheel holds, and installed from the copy that was hashed
        wheel, digest = kept_wheel(wheel, home)
        name = f"{name}-{digest[:16]}"
    wanted = requirements_for(executorch, wheel=wheel)
    root = home / "venvs" / name
    stamp = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:32]
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if (
            (root / STAMP).is_file()
            and (root / STAMP).read_text().strip() == stamp
            and (root / "bin" / "python").exists()
        ):
            return PythonEnv(executorch, root, reused=True)
        if not (root / "bin" / "python").exists():
            created = subprocess.run([base_python, "-m", "venv", str(root)], capture_output=True, text=True)
            if created.returncode != 0:
                raise MatrixSetupError(
                    f"cannot create a venv at {root}: {(created.stderr.strip().splitlines() or ['?'])[-1]}"
                )
        listing = root / ".matrix-requirements.txt"
        listing.write_text("\n".join(wanted) + "\n")
        installed = subprocess.run(
            [
                str(root / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                str(listing),
            ],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
        if installed.returncode != 0:
            raise _pip_failure(installed, f"pip cannot install executorch=={executorch} beside torch==2.13.0")
        (root / STAMP).write_text(stamp + "\n")
    return PythonEnv(executorch, root, reused=False)


@dataclass(frozen=True)
class QnnTree:
    wheel: str  # the onnxruntime-qnn release the libraries came from
    root: Path  # an SDK-shaped tree: root/lib/x86_64-linux-clang/*.so
    build_id: str  # as read from its libQnnHtp.so, e.g. v2.51.0.260929181845


def ensure_qnn_tree(wheel: str, home: Path = MATRIX_HOME, python: str = sys.executable) -> QnnTree:
    """The host QNN tree of one onnxruntime-qnn release (installed once with pip --target, then reused)."""
    version = release(wheel, "onnxruntime-qnn")
    base = home / "qnn" / f"onnxruntime-qnn-{version}"
    site = base / "site"
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(base) + ".lock"):
        if not (site / WHEEL_PACKAGE).is_dir():
            partial = base / "site.partial"
            shutil.rmtree(partial, ignore_errors=True)
            installed = subprocess.run(
                [
                    python,
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--target",
                    str(partial),
                    f"onnxruntime-qnn=={version}",
                ],
                capture_output=True,
                text=True,
                timeout=PIP_TIMEOUT_S,
            )
            if installed.returncode != 0:
                raise _pip_failure(installed, f"pip cannot fetch onnxruntime-qnn=={version} for this host")
            os.replace(partial, site)
        package = site / WHEEL_PACKAGE
        missing = [name for name in REQUIRED_HOST_LIBS if not (package / name).exists()]
        if missing:
            raise MatrixSetupError(
                f"onnxruntime-qnn {version} carries no x86_64 {', '.join(missing)}: "
                f"pick a release that ships the host libraries"
            )
        root = lay_out_wheel_tree(base / "sdk", package_dir=package)
    try:
        build_id = qairt.build_id_of(root / HOST_LIB_DIR / "libQnnHtp.so")
    except qairt.QairtVersionError as error:
        raise MatrixSetupError(str(error)) from None
    return QnnTree(version, root, build_id)
