"""Cross-version programs: a program lowered by executorch release A run on the runtime of release B.

    python -m harness matrix --executorch 1.4.1,1.5.1 --cross -- --soc SM8650 --dtype fp16 -k counter_add

After the matrix's combinations ran (each lowered its cases into its own artifact cache), every case that
two releases of one QNN column both ran is taken: each release's program (found in its cache by the key its
own harness computes: harness/matrix/cross_runtime.py) is run on its own runtime (the reference), and on
every other release's runtime (older program on newer runtime and the other way), all through the emulated
device's runner (harness/emulator/host_runner.py) in the runtime release's venv, with that release's QNN
environment and the emulated heap pattern, on the HTP simulator. Each cross run is classified:

- matches: the outputs equal the runtime release's own lowering's outputs on that runtime, step by step,
  within the suite's tolerance for the dtype (harness/numerics.py; eager when the own run gave none);
- refuses: the runner exits non-zero (a program it will not load, or a run that fails), its error line kept;
- differs: it runs and its outputs differ (a finding): the max abs error per step.

Writes cross.json into the matrix folder; cross.md and a section of the matrix page are rendered from it
(harness/matrix/render.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from harness import numerics
from harness.device.kinds import EmulatedKind
from harness.files import write_atomically
from harness.matrix.environments import MATRIX_HOME, MatrixSetupError, PythonEnv, QnnTree
from harness.matrix.layout import Combination, report_files
from harness.paths import REPO_ROOT
from harness.report import intake
from harness.runner import contract

CROSS_SCHEMA_VERSION = 1
CROSS_FILE = "cross.json"
MATCHES, REFUSES, DIFFERS, NOT_RUN = "matches", "refuses", "differs", "not run"
OUTCOMES = (MATCHES, REFUSES, DIFFERS, NOT_RUN)
RUN_TIMEOUT_S = 300
DESCRIBE_TIMEOUT_S = 900

Outputs = numerics.Outputs


@dataclass(frozen=True)
class RunnerResult:
    """What one runner process left: its exit code, its log and its outputs as raw bytes [step][index] (a
    row is as long as the files it wrote; None marks a gap)."""

    exit_code: int
    log: str
    outputs: list[list[np.ndarray | None]] = field(default_factory=list)


@dataclass
class CrossRow:
    """One program on one runtime: what happened, against what it was compared."""

    case_id: str
    card: str
    dtype: str
    mode: str
    soc: str
    program: str  # the executorch release that lowered it
    runtime: str  # the executorch release whose runtime ran it
    outcome: str
    detail: str  # the error line (refuses), why not (not run), or the numbers
    reference: str = ""  # "own lowering" (the runtime's own program on it) or "eager"
    max_error_per_step: list[float] = field(default_factory=list)  # vs the reference
    mismatches: int = 0  # elements out of tolerance vs the reference
    eager_max_error_per_step: list[float] = field(default_factory=list)
    eager_mismatches: int | None = None


def error_line(result: RunnerResult) -> str:
    """Why the runner failed, in one line: its last line that says so (host_runner's `runner: cannot load
    ...`, an executorch or QNN error), else its last line."""
    lines = [" ".join(line.split()) for line in result.log.splitlines() if line.strip()]
    wanted = ("runner: cannot", "error", "Error", "ERROR", "failed", "Traceback")
    line = next((line for line in reversed(lines) if any(word in line for word in wanted)), lines[-1] if lines else "")
    return f"exit {result.exit_code}: {line[:300] or 'no output'}"


def decode(result: RunnerResult, eager: Outputs) -> Outputs:
    """The runner's raw outputs in eager's dtypes and shapes; ValueError (one line) when one is missing or
    of another size."""
    shaped = []
    for step, want_row in enumerate(eager):
        row = result.outputs[step] if step < len(result.outputs) else []
        shaped_row = []
        for index, want in enumerate(want_row):
            raw = row[index] if index < len(row) else None
            if raw is None:
                raise ValueError(f"step {step} output {index}: the runner wrote none")
            if raw.nbytes != want.nbytes:
                raise ValueError(
                    f"step {step} output {index}: {raw.nbytes} bytes, eager has {want.nbytes} ({want.dtype}{list(want.shape)})"
                )
            shaped_row.append(raw.view(want.dtype).reshape(want.shape))
        shaped.append(shaped_row)
    return shaped


def _numbers(comparison: numerics.Comparison) -> tuple[list[float], int]:
    return [float(f"{e.max_abs_error:.6g}") for e in comparison.errors], sum(e.mismatches for e in comparison.errors)


def classify(result: RunnerResult, eager: Outputs, dtype: str, own: Outputs | None) -> dict:
    """The outcome of one cross run (the fields of CrossRow it decides): refuses when the runner failed;
    else matches or differs by comparing its outputs with `own` (the runtime release's own lowering's
    outputs on that runtime) or, without those, with eager, at the suite's tolerance for the dtype."""
    if result.exit_code != 0:
        return {"outcome": REFUSES, "detail": error_line(result)}
    try:
        got = decode(result, eager)
    except ValueError as error:
        return {"outcome": DIFFERS, "detail": f"outputs unlike eager's: {error}"}
    eager_errors, eager_mismatches = _numbers(numerics.compare(got, eager, dtype))
    reference_name = "own lowering" if own is not None else "eager"
    errors, mismatches = (
        _numbers(numerics.compare(got, own, dtype)) if own is not None else (eager_errors, eager_mismatches)
    )
    worst = max(errors, default=0.0)
    if mismatches:
        steps = sum(1 for step_error in errors if step_error > 0)
        detail = f"{mismatches} element(s) out of tolerance vs the {reference_name}, max abs error {worst:.3g} ({steps} step(s) nonzero)"
    else:
        detail = f"within tolerance of the {reference_name} (max abs error {worst:.3g})"
    return {
        "outcome": DIFFERS if mismatches else MATCHES,
        "detail": detail,
        "reference": reference_name,
        "max_error_per_step": errors,
        "mismatches": mismatches,
        "eager_max_error_per_step": eager_errors,
        "eager_mismatches": eager_mismatches,
    }


class CrossSteps(Protocol):
    """The process boundary: the real ones below, fakes in the tests."""

    def release(self, combination: Combination) -> tuple[PythonEnv, QnnTree]: ...
    def describe(self, env: PythonEnv, tree: QnnTree, combination: Combination, case_ids: list[str]) -> dict: ...
    def run(
        self,
        env: PythonEnv,
        tree: QnnTree,
        runtime: dict,
        program: Path,
        method_index: int,
        inputs: list[list[Path]],
        out: Path,
    ) -> RunnerResult: ...


class RealCrossSteps:
    """The matrix's venvs, QNN trees and artifact caches under `home` (harness/matrix/runner.py made them)."""

    def __init__(self, home: Path = MATRIX_HOME) -> None:
        from harness.matrix.runner import RealSteps

        self.home = home
        self._steps = RealSteps(home)

    def release(self, combination: Combination) -> tuple[PythonEnv, QnnTree]:
        return self._steps.python_env(combination.executorch), self._steps.qnn_tree(combination.qnn_wheel)

    def describe(self, env: PythonEnv, tree: QnnTree, combination: Combination, case_ids: list[str]) -> dict:
        with tempfile.TemporaryDirectory(prefix="qnnsuite-cross-") as scratch:
            answer = Path(scratch) / "answer.json"
            command = [
                str(env.python),
                "-m",
                "harness.matrix.cross_runtime",
                "--cache-dir",
                str(self.home / "artifacts" / combination.id),
                "--out",
                str(answer),
                *case_ids,
            ]
            try:
                done = subprocess.run(
                    command,
                    cwd=REPO_ROOT,
                    env=self._steps._env(env, tree),  # as the combination's suite ran: its venv, tree and state
                    capture_output=True,
                    text=True,
                    timeout=DESCRIBE_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:
                raise MatrixSetupError(
                    f"executorch {env.executorch}: finding its lowerings took over {DESCRIBE_TIMEOUT_S} s"
                ) from None
            if done.returncode != 0 or not answer.is_file():
                lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
                raise MatrixSetupError(f"executorch {env.executorch}: cannot find its lowerings: {lines[-1][:300]}")
            return json.loads(answer.read_text())

    def run(
        self,
        env: PythonEnv,
        tree: QnnTree,
        runtime: dict,
        program: Path,
        method_index: int,
        inputs: list[list[Path]],
        out: Path,
    ) -> RunnerResult:
        out.mkdir(parents=True, exist_ok=True)
        listing = contract.write_input_list(
            [[str(path) for path in row] for row in inputs], out / contract.INPUT_LIST_NAME
        )
        base = self._steps._env(env, tree)
        variables = {
            **base,
            **runtime["env"],
            "LD_LIBRARY_PATH": ":".join(
                p for p in (runtime["env"]["LD_LIBRARY_PATH"], base.get("LD_LIBRARY_PATH", "")) if p
            ),
        }
        outputs = out / contract.OUTPUTS_DIR
        argv = contract.executor_runner_argv(str(program), str(listing), str(outputs), method_index)
        try:
            done = subprocess.run(
                [str(env.python), "-m", "harness.emulator.host_runner", *argv],
                cwd=REPO_ROOT,
                env=EmulatedKind.heap_environment(variables),
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return RunnerResult(124, f"runner: timed out after {RUN_TIMEOUT_S} s")
        return RunnerResult(done.returncode, done.stdout + done.stderr, contract.written_outputs(outputs, len(inputs)))


def case_ids_ran(folder: Path) -> dict[str, dict]:
    """The cases a combination's suite reported: case id -> {card, dtype, mode, soc}. Each report is read through
    the one report reader (schema-validated: ReportDataError, one line, for one that is not a report.json)."""
    cases = {}
    for path in report_files(folder):
        for case in intake.read_report(path)["cases"]:
            cases[str(case["case_id"])] = {name: str(case.get(name, "")) for name in ("card", "dtype", "mode", "soc")}
    return cases


@dataclass(frozen=True)
class Release:
    """One release of a QNN column: its venv, its QNN tree and what cross_runtime found in its venv."""

    version: str
    env: PythonEnv
    tree: QnnTree
    answer: dict  # {"env": the QNN variables, "lowerings": case id -> program or why missing}

    def lowering(self, case_id: str) -> dict:
        return self.answer["lowerings"].get(case_id, {"missing": "not asked"})


def _run_on(runtime: Release, lowering: dict, steps: CrossSteps, files: list[list[Path]], out: Path) -> RunnerResult:
    """A lowering (a release's program) on `runtime`'s runner."""
    program, method_index = Path(lowering["program"]), int(lowering["method_index"])
    return steps.run(runtime.env, runtime.tree, runtime.answer, program, method_index, files, out)


def _own_outputs(
    release: Release, case_id: str, steps: CrossSteps, files, eager: Outputs, work: Path
) -> Outputs | None:
    """The release's own program on its own runtime: the reference its cross runs are held to (None: it has
    no program, or it did not run it)."""
    lowering = release.lowering(case_id)
    if "program" not in lowering:
        return None
    result = _run_on(release, lowering, steps, files, work / f"{release.version}-on-{release.version}" / case_id)
    try:
        return decode(result, eager) if result.exit_code == 0 else None
    except ValueError:
        return None


def run_cross(
    ran: list[tuple[Combination, Path]],
    steps: CrossSteps,
    work: Path,
    feed: Callable[[str, int], tuple[list[tuple], Outputs]],
    progress: Callable[[str], None] = print,
) -> list[CrossRow]:
    """Every ordered pair of releases of one QNN column that both ran (given as the combination and its
    report folder), over the cases both reported. feed(card reference, steps) gives a card's inputs and eager
    outputs (real_feed in the real command)."""
    rows: list[CrossRow] = []
    by_wheel: dict[str, list[tuple[Combination, Path]]] = {}
    for combination, folder in ran:
        by_wheel.setdefault(combination.qnn_wheel, []).append((combination, folder))
    for group in (group for group in by_wheel.values() if len(group) > 1):
        reported = [case_ids_ran(folder) for _, folder in group]
        shared = sorted(set.intersection(*(set(cases) for cases in reported)))
        releases = []
        for combination, _ in group:
            env, tree = steps.release(combination)
            releases.append(Release(combination.executorch, env, tree, steps.describe(env, tree, combination, shared)))
        for case_id in shared:
            found = next((r.lowering(case_id) for r in releases if "program" in r.lowering(case_id)), None)
            if found is None:
                continue  # no release has a program: the matrix's own columns say why
            inputs, eager = feed(found["card"], int(found["steps"]))
            files = contract.write_inputs(inputs, work / "inputs" / case_id)
            own = {r.version: _own_outputs(r, case_id, steps, files, eager, work / "runs") for r in releases}
            info = reported[0][case_id]
            for program in releases:
                for runtime in (r for r in releases if r is not program):
                    row = CrossRow(
                        case_id,
                        info["card"],
                        info["dtype"],
                        info["mode"],
                        info["soc"],
                        program.version,
                        runtime.version,
                        NOT_RUN,
                        "",
                    )
                    lowering = program.lowering(case_id)
                    if "program" not in lowering:
                        row.detail = f"executorch {program.version} has no program: {lowering['missing']}"
                    else:
                        out = work / "runs" / f"{program.version}-on-{runtime.version}" / case_id
                        result = _run_on(runtime, lowering, steps, files, out)
                        for name, value in classify(result, eager, row.dtype, own[runtime.version]).items():
                            setattr(row, name, value)
                    progress(
                        f"cross: {case_id}: {program.version} program on {runtime.version} runtime: {row.outcome} ({row.detail})"
                    )
                    rows.append(row)
    return rows


def document(rows: list[CrossRow], matrix_id: str, command: str) -> dict:
    """cross.json: the rows (findings first), and per ordered pair of releases the count of each outcome."""
    pairs: dict[tuple[str, str], dict[str, int]] = {}
    for row in rows:
        counts = pairs.setdefault((row.program, row.runtime), dict.fromkeys(OUTCOMES, 0))
        counts[row.outcome] += 1
    order = {outcome: index for index, outcome in enumerate((DIFFERS, REFUSES, NOT_RUN, MATCHES))}
    return {
        "schema_version": CROSS_SCHEMA_VERSION,
        "matrix_id": matrix_id,
        "command": command,
        "outcomes": list(OUTCOMES),
        "pairs": [
            {"program": program, "runtime": runtime, "counts": counts} for (program, runtime), counts in pairs.items()
        ],
        "rows": [
            asdict(row) for row in sorted(rows, key=lambda r: (order[r.outcome], r.case_id, r.program, r.runtime))
        ],
        "findings": sum(row.outcome == DIFFERS for row in rows),
    }


def write(cross: dict, folder: Path) -> Path:
    """cross.json (the matrix page and cross.md are rendered from it: harness/matrix/render.py)."""
    write_atomically(folder / CROSS_FILE, json.dumps(cross, indent=1) + "\n")
    return folder / CROSS_FILE


def real_feed(card_reference: str, count: int) -> tuple[list[tuple], Outputs]:
    """A card's inputs for `count` steps and its eager outputs (the card as this checkout registers it)."""
    from harness.pipeline import card as cards, eager

    card = cards.find(card_reference)
    inputs = card.steps(count)
    return inputs, eager.run_steps(card, inputs)


def cross_matrix(folder: Path, home: Path, command: str, progress: Callable[[str], None] = print) -> dict:
    """The real cross step over a matrix folder's combinations that ran: cross.json's document."""
    from harness.matrix.layout import COMBINATION_FILE

    ran = []
    for entry in sorted(folder.glob(f"*/{COMBINATION_FILE}")):
        run = json.loads(entry.read_text())
        if run.get("status") == "ran":
            ran.append((Combination(run["executorch"], run["qnn_wheel"]), entry.parent))
    work = Path(tempfile.mkdtemp(prefix="qnnsuite-cross-"))  # 0700: inputs and outputs of the runs
    try:
        rows = run_cross(ran, RealCrossSteps(home), work, real_feed, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return document(rows, folder.name.removeprefix("matrix-"), command)
