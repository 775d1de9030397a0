"""Running the same suite selection in every combination (executorch release x onnxruntime-qnn release).

Combinations run one after another, each with its venv, its QNN tree and its own bridge probe
(`python -m harness setup` in that venv: the bridge is decided by measurement there, never by a
version table), its own artifact cache and report folder. A combination that cannot run is written
down with one line saying why, and the matrix goes on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from harness.matrix.environments import MATRIX_HOME, MatrixSetupError, PythonEnv, QnnTree, ensure_qnn_tree, ensure_venv
from harness.matrix.layout import COMBINATION_FILE, SUITE_LOG, Combination, report_files
from harness.paths import REPO_ROOT
from harness.report import intake

DEFAULT_WORKERS = ("-n", "2")  # the machines this runs on have 2 cores; a user's own -n wins
SUITE_TIMEOUT_S = 6 * 3600
SETUP_TIMEOUT_S = 900
# The runtime the emulated devices run .pte files with; its compiled binding must match the venv's torch.
RUNTIME_MODULE = "executorch.extension.pybindings.portable_lib"


@dataclass
class CombinationRun:
    """What happened to one combination; written as combination.json beside its reports."""

    executorch: str
    qnn_wheel: str
    status: str = "cannot run"  # "ran" or "cannot run"
    reason: str = ""  # one line when it cannot run
    qnn_build_id: str = ""
    bridge: str = ""  # "on" / "off" as the combination's own probe decided
    venv_reused: bool | None = None
    suite_exit_code: int | None = None
    duration_s: float = 0.0
    steps_s: dict[str, float] = field(default_factory=dict)


class Steps(Protocol):
    """The four things a combination needs; the real ones below, fakes in the tests."""

    def python_env(self, executorch: str) -> PythonEnv: ...
    def qnn_tree(self, wheel: str) -> QnnTree: ...
    def setup(self, env: PythonEnv, tree: QnnTree) -> str: ...  # returns "on" / "off" (the bridge)
    def suite(self, env: PythonEnv, tree: QnnTree, combination: Combination, folder: Path) -> int: ...


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]


def with_default_workers(pytest_args: list[str]) -> list[str]:
    """`-n 2` unless the selection says how many workers (or switches xdist off)."""
    chosen = any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) or arg == "no:xdist" for arg in pytest_args)
    return list(pytest_args) if chosen else [*DEFAULT_WORKERS, *pytest_args]


class RealSteps:
    """Venvs and trees under `home`, the suite run with `pytest_args` in each."""

    def __init__(self, home: Path = MATRIX_HOME, pytest_args: list[str] | None = None) -> None:
        self.home = home
        self.pytest_args = with_default_workers(pytest_args or [])

    def python_env(self, executorch: str) -> PythonEnv:
        return ensure_venv(executorch, self.home)

    def qnn_tree(self, wheel: str) -> QnnTree:
        return ensure_qnn_tree(wheel, self.home)

    def _env(self, env: PythonEnv, tree: QnnTree) -> dict[str, str]:
        """The combination's processes run as in its activated venv: its bin/ first on PATH (executorch
        1.3.1 runs the `flatc` its wheel installs there), QNN_SDK_ROOT at its tree in the suite's own
        processes too (some releases set up, i.e. download, an SDK when their Qualcomm backend is imported
        without it), and one state folder for the matrix (overlays and probe results are keyed by library
        and executorch, so columns never mix)."""
        path = [str(env.root / "bin"), *[p for p in os.environ.get("PATH", "").split(os.pathsep) if p]]
        variables = {
            **os.environ,
            "PATH": os.pathsep.join(path),
            "VIRTUAL_ENV": str(env.root),
            "QNN_SDK_ROOT": str(tree.root),
            "QNNSUITE_HOME": str(self.home / "state"),
        }
        variables.pop("QNNSUITE_TRACE", None)
        return variables

    def setup(self, env: PythonEnv, tree: QnnTree) -> str:
        """Feature checks first (does the runtime binding load beside this torch?), then the bridge probe."""
        loaded = subprocess.run(
            [str(env.python), "-c", f"import {RUNTIME_MODULE}"],
            cwd=REPO_ROOT,
            env=self._env(env, tree),
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
        )
        if loaded.returncode != 0:
            lines = [line for line in loaded.stderr.splitlines() if line.strip()]
            last = (lines[-1] if lines else f"exit {loaded.returncode}").replace(str(env.root) + "/", "")
            raise MatrixSetupError(f"{RUNTIME_MODULE} does not load in this venv: {_one_line(last)}")
        completed = subprocess.run(
            [str(env.python), "-m", "harness", "setup"],
            cwd=REPO_ROOT,
            env=self._env(env, tree),
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT_S,
        )
        if completed.returncode != 0:
            lines = [line for line in completed.stderr.splitlines() if line.strip()]
            detail = next((line for line in reversed(lines) if line.startswith("setup:")), lines[-1] if lines else "")
            raise MatrixSetupError(f"bridge probe failed: {_one_line(detail.removeprefix('setup: ')) or 'no output'}")
        found = re.search(r"device-config bridge (on|off)", completed.stdout)
        return found.group(1) if found else "unknown"

    def suite(self, env: PythonEnv, tree: QnnTree, combination: Combination, folder: Path) -> int:
        command = [
            str(env.python),
            "-m",
            "pytest",
            "suites",
            "-p",
            "no:cacheprovider",
            "--cache-dir",
            str(self.home / "artifacts" / combination.id),
            "--report-dir",
            str(folder),
            *self.pytest_args,
        ]
        with open(folder / SUITE_LOG, "w") as log:
            log.write("$ " + shlex.join(command) + "\n")
            log.flush()
            completed = subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=self._env(env, tree),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=SUITE_TIMEOUT_S,
            )
        return completed.returncode


def _suite_failure(folder: Path, exit_code: int) -> str:
    """Why a suite run left no report: its last error line (a usage error, an internal error)."""
    log = folder / SUITE_LOG
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    wanted = re.compile(r"(ERROR|Error|error:|INTERNALERROR|UsageError)")
    detail = next((line for line in reversed(lines) if wanted.search(line)), lines[-1] if lines else "")
    return f"suite exited {exit_code} without a report: {_one_line(detail) or 'no output'} (see {log})"


def run_combination(combination: Combination, steps: Steps, folder: Path) -> CombinationRun:
    run = CombinationRun(combination.executorch, combination.qnn_wheel)
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        clock = time.monotonic()
        env = steps.python_env(combination.executorch)
        run.venv_reused, run.steps_s["venv"] = env.reused, round(time.monotonic() - clock, 1)
        clock = time.monotonic()
        tree = steps.qnn_tree(combination.qnn_wheel)
        run.qnn_build_id, run.steps_s["qnn_tree"] = tree.build_id, round(time.monotonic() - clock, 1)
        clock = time.monotonic()
        run.bridge, run.steps_s["setup"] = steps.setup(env, tree), round(time.monotonic() - clock, 1)
        clock = time.monotonic()
        run.suite_exit_code = steps.suite(env, tree, combination, folder)
        run.steps_s["suite"] = round(time.monotonic() - clock, 1)
        if report_files(folder):
            run.status = "ran"
        else:
            run.reason = _suite_failure(folder, run.suite_exit_code)
    except MatrixSetupError as error:
        run.reason = _one_line(str(error))
    except subprocess.TimeoutExpired as error:
        run.reason = f"timed out after {error.timeout:.0f} s: {_one_line(' '.join(map(str, error.cmd)))}"
    run.duration_s = round(time.monotonic() - started, 1)
    (folder / COMBINATION_FILE).write_text(json.dumps(asdict(run), indent=1) + "\n")
    return run


def run_matrix(
    combinations: list[Combination], steps: Steps, out_dir: Path, progress: Callable[[str], None] = print
) -> list[CombinationRun]:
    """Every combination in turn, a progress line before and after each."""
    runs = []
    for index, combination in enumerate(combinations, start=1):
        prefix = f"matrix [{index}/{len(combinations)}] executorch {combination.executorch} x onnxruntime-qnn {combination.qnn_wheel}"
        progress(f"{prefix}: starting")
        run = run_combination(combination, steps, out_dir / combination.id)
        if run.status == "ran":
            counts = _summary(out_dir / combination.id)
            venv = "reused" if run.venv_reused else f"made in {run.steps_s['venv']:.0f} s"
            progress(
                f"{prefix}: {counts} (QAIRT {run.qnn_build_id}, bridge {run.bridge}, "
                f"venv {venv}) in {run.duration_s:.0f} s"
            )
        else:
            progress(f"{prefix}: cannot run: {run.reason}")
        runs.append(run)
    return runs


def _summary(folder: Path) -> str:
    """The combination's verdict counts for its progress line, each report read through the one report reader; a
    report it refuses is named there (the side-by-side page then refuses it with the same line)."""
    totals: dict[str, int] = {}
    for path in report_files(folder):
        try:
            summary = intake.read_report(path)["summary"]
        except intake.ReportDataError as error:
            return f"no counts: {error}"
        for verdict, count in summary.items():
            if verdict != "total":
                totals[verdict] = totals.get(verdict, 0) + count
    return ", ".join(f"{count} {verdict}" for verdict, count in totals.items() if count) or "no checks"
