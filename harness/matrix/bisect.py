"""`python -m harness bisect --good V --bad V [--wheels DIR] -- PYTEST SELECTION`: the first executorch release
(or wheel in a folder, e.g. nightlies a user downloaded) where a selection's verdicts change.

When a check starts failing, the question is which release broke it. The matrix (harness/matrix/) already
runs one selection in a release's own venv and QNN tree (harness/matrix/environments.py) and writes the suite's
reports; bisect runs it the same way (harness/matrix/runner.py run_combination, one combination per candidate)
on as few candidates as a binary search needs. The verdicts that differ between the good and the bad end are
what is searched: a candidate that gives the good end's verdicts on them is good, one that gives the bad end's
is bad, one that gives a mix counts as changed (named in the result), and one that cannot run is skipped as
`git bisect skip` would. The result, bisect.json and bisect.md in the output folder, names the last good and
first changed candidate and every check whose verdict changed between them, with the messages.

Candidates: with --wheels, the executorch-<version>-*.whl files in DIR whose versions lie from --good to --bad;
without, the releases pip lists for executorch in that range (`--releases` gives them instead, e.g. offline).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.files import write_atomically
from harness.matrix.cli import pinned_qnn_wheel
from harness.matrix.environments import MATRIX_HOME, MatrixSetupError, PythonEnv, ensure_venv, release
from harness.matrix.layout import Combination, report_files
from harness.matrix.runner import RealSteps, Steps, run_combination
from harness.paths import REPO_ROOT
from harness.report.gate import Key, Outcome, changes, of_document
from harness.report.intake import ReportDataError, read_report
from harness.text import markdown_text

WHEEL = re.compile(r"^executorch-([0-9][A-Za-z0-9.+!]*)-[^/]+\.whl$")  # PEP 427: name-version-...-platform.whl
BISECT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class BisectError(ValueError):
    """Bisection cannot start or cannot decide; the message is one line."""


@dataclass(frozen=True)
class Candidate:
    version: str
    wheel: Path | None = None  # None: the release from the package index

    @property
    def label(self) -> str:
        return self.wheel.name if self.wheel else f"executorch {self.version}"


@dataclass
class Tested:
    candidate: str
    state: str  # "good", "bad", "changed" (a mix), or "skipped" (could not run; reason says why)
    reason: str = ""
    verdicts: dict[str, str] = field(default_factory=dict)  # "SOC case check" -> verdict, on the searched checks


def wheel_candidates(folder: Path, good: Version, bad: Version) -> list[Candidate]:
    """executorch wheels in folder (regular files, not links), from good to bad inclusive, in version order."""
    found: dict[Version, Candidate] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        match = WHEEL.match(path.name)
        if not match or path.is_symlink() or not path.is_file():
            continue
        try:
            version = Version(match.group(1))
        except InvalidVersion:
            continue
        if good <= version <= bad:
            if version in found:
                raise BisectError(f"{folder} holds two wheels of executorch {version}: keep one per version")
            found[version] = Candidate(str(version), path)
    return [found[version] for version in sorted(found)]


def index_releases(python: str = sys.executable) -> list[str]:
    """The executorch releases pip's index lists (network); [] when it cannot say."""
    completed = subprocess.run(
        [python, "-m", "pip", "index", "versions", "executorch", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r"Available versions:\s*(.+)", completed.stdout)
    return [part.strip() for part in found.group(1).split(",")] if found else []


def release_candidates(listed: list[str], good: Version, bad: Version) -> list[Candidate]:
    versions = set()
    for text in [*listed, str(good), str(bad)]:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if good <= version <= bad and (not version.is_prerelease or version in (good, bad)):
            versions.add(version)
    return [Candidate(str(version)) for version in sorted(versions)]


class BisectSteps(RealSteps):
    """The matrix's steps, with a wheel file's venv for a wheel candidate."""

    def __init__(self, wheels: dict[str, Path], home: Path = MATRIX_HOME, pytest_args: list[str] | None = None):
        super().__init__(home, pytest_args)
        self.wheels = wheels

    def python_env(self, executorch: str) -> PythonEnv:
        return ensure_venv(executorch, self.home, wheel=self.wheels.get(executorch))


def verdicts_of(folder: Path) -> dict[Key, Outcome]:
    """What a candidate's run gave: its reports under folder, read as data."""
    outcomes: dict[Key, Outcome] = {}
    for path in report_files(folder):
        try:
            outcomes.update(of_document(read_report(path)))
        except ReportDataError as error:
            raise BisectError(str(error)) from None
    return outcomes


def _name(key: Key) -> str:
    return " ".join(key)


def _measure(candidate: Candidate, steps: Steps, qnn_wheel: str, out: Path) -> tuple[dict[Key, Outcome] | None, str]:
    combination = Combination(candidate.version, qnn_wheel)
    run = run_combination(combination, steps, out / combination.id)
    if run.status != "ran":
        return None, run.reason
    return verdicts_of(out / combination.id), ""


def _changed_rows(before: dict[Key, Outcome], after: dict[Key, Outcome]) -> list[dict]:
    """The result's rows: every check whose verdict differs between the last good and the first changed."""
    return [
        {
            "soc": c.key[0],
            "case_id": c.key[1],
            "check": c.key[2],
            "before": c.before.verdict if c.before else "absent",
            "after": c.after.verdict if c.after else "absent",
            "message": c.after.message if c.after else "",
        }
        for c in changes(before, after)
    ]


def bisect(
    candidates: list[Candidate],
    steps: Steps,
    qnn_wheel: str,
    out: Path,
    progress=print,  # noqa: ANN001  a callable taking one line
) -> dict:
    """Binary search over candidates (oldest first; the first is good, the last bad); the result document."""
    if len(candidates) < 2:
        raise BisectError("fewer than two candidates between --good and --bad: nothing to bisect")
    tested: dict[str, Tested] = {}
    measured: dict[str, dict[Key, Outcome]] = {}

    def measure(candidate: Candidate) -> dict[Key, Outcome] | None:
        progress(f"bisect: running the selection on {candidate.label}")
        outcomes, reason = _measure(candidate, steps, qnn_wheel, out)
        if outcomes is None:
            tested[candidate.version] = Tested(candidate.label, "skipped", reason)
            progress(f"bisect: {candidate.label}: cannot run: {reason}")
        else:
            measured[candidate.version] = outcomes
        return outcomes

    good, bad = candidates[0], candidates[-1]
    good_outcomes, bad_outcomes = measure(good), measure(bad)
    for end, outcomes, flag in ((good, good_outcomes, "--good"), (bad, bad_outcomes, "--bad")):
        if outcomes is None:
            raise BisectError(f"{flag} {end.label} cannot run: {tested[end.version].reason}")
    searched = [change.key for change in changes(good_outcomes, bad_outcomes)]
    if not searched:
        raise BisectError(f"{good.label} and {bad.label} give the same verdicts: nothing changed to bisect")

    def verdicts(outcomes: dict[Key, Outcome]) -> dict[str, str]:
        return {_name(key): outcomes[key].verdict if key in outcomes else "absent" for key in searched}

    tested[good.version] = Tested(good.label, "good", verdicts=verdicts(good_outcomes))
    tested[bad.version] = Tested(bad.label, "bad", verdicts=verdicts(bad_outcomes))
    pending = list(candidates)
    low, high = 0, len(pending) - 1  # pending[low] is good, pending[high] changed
    while high - low > 1:
        middle = (low + high) // 2
        candidate = pending[middle]
        outcomes = measure(candidate)
        if outcomes is None:
            del pending[middle]
            high -= 1
            continue
        seen = verdicts(outcomes)
        if seen == tested[good.version].verdicts:
            state = "good"
        elif seen == tested[bad.version].verdicts:
            state = "bad"
        else:
            state = "changed"
        tested[candidate.version] = Tested(candidate.label, state, verdicts=seen)
        progress(f"bisect: {candidate.label}: {state}")
        if state == "good":
            low = middle
        else:
            high = middle
    last_good, first_changed = pending[low], pending[high]
    changed = _changed_rows(measured[last_good.version], measured[first_changed.version])
    return {
        "last_good": last_good.label,
        "first_changed": first_changed.label,
        "first_changed_version": first_changed.version,
        "qnn_wheel": qnn_wheel,
        "candidates": [c.label for c in candidates],
        "tested": [asdict(tested[c.version]) for c in candidates if c.version in tested],
        "changed": changed,
    }


def render_markdown(result: dict, command: str) -> str:
    lines = [
        f"# bisect: first change in {markdown_text(result['first_changed'])}",
        "",
        f"Last good: {markdown_text(result['last_good'])}; first changed: {markdown_text(result['first_changed'])} "
        f"(host QNN libraries of onnxruntime-qnn {markdown_text(result['qnn_wheel'])}).",
        "",
        f"Command: `{command.replace('`', '')}`",
        "",
        "## What changed",
        "",
        "| SoC | case | check | before | after | message |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        "| " + " | ".join(markdown_text(c[k]) for k in ("soc", "case_id", "check", "before", "after", "message")) + " |"
        for c in result["changed"]
    ]
    lines += ["", "## Candidates tested", "", "| candidate | state | why |", "| --- | --- | --- |"]
    lines += [
        f"| {markdown_text(t['candidate'])} | {t['state']} | {markdown_text(t['reason'])} |" for t in result["tested"]
    ]
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m harness bisect", description=__doc__.split("\n\n")[0])
    parser.add_argument("--good", required=True, metavar="V", help="an executorch version whose verdicts are good")
    parser.add_argument("--bad", required=True, metavar="V", help="a later version whose verdicts changed")
    parser.add_argument("--wheels", type=Path, metavar="DIR", help="bisect over the executorch wheels in DIR")
    parser.add_argument("--releases", metavar="V[,V...]", help="the releases to bisect over (default: pip's index)")
    parser.add_argument("--qnn-wheel", metavar="V", help="onnxruntime-qnn release (default: the pinned one)")
    parser.add_argument("--id", default=None, help="bisect id (default: a time stamp); reports/bisect-<id>/")
    parser.add_argument("--report-root", type=Path, default=REPO_ROOT / "reports", help="where bisect-<id>/ goes")
    parser.add_argument("--home", type=Path, default=MATRIX_HOME, help="venvs, QNN trees and caches (the matrix's)")
    args = parser.parse_args(ours)
    if args.id is not None and not BISECT_ID.fullmatch(args.id):
        parser.error(f"--id {args.id!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    if not pytest_args:
        parser.error("give the selection after --, e.g. -- --emulate SM8650 --dtype fp16 -k counter_add")
    return args, pytest_args


def candidates_of(args: argparse.Namespace) -> list[Candidate]:
    good, bad = Version(release(args.good, "--good")), Version(release(args.bad, "--bad"))
    if not good < bad:
        raise BisectError(f"--good {good} is not before --bad {bad}: give the older version as --good")
    if args.wheels is not None:
        if not args.wheels.is_dir():
            raise BisectError(f"--wheels {args.wheels} is not a folder: pass the folder holding the wheels")
        found = wheel_candidates(args.wheels, good, bad)
        ends = {Version(c.version) for c in found}
        if good not in ends or bad not in ends:
            raise BisectError(
                f"--wheels {args.wheels} must hold the wheels of --good {good} and --bad {bad} (executorch-<version>-*.whl)"
            )
        return found
    listed = args.releases.split(",") if args.releases else index_releases()
    return release_candidates(listed, good, bad)


def main(argv: list[str], steps: Steps | None = None) -> int:
    """Exit 0 when a first changed candidate was found, 2 on bad arguments, 1 when it cannot be decided."""
    args, pytest_args = parse(argv)
    command = "python -m harness bisect " + shlex.join(argv)
    try:
        candidates = candidates_of(args)
        qnn_wheel = release(args.qnn_wheel, "--qnn-wheel") if args.qnn_wheel else pinned_qnn_wheel()
    except (BisectError, MatrixSetupError) as error:
        print(f"bisect: {error}", file=sys.stderr)
        return 2
    out = args.report_root / f"bisect-{args.id or time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    wheels = {c.version: c.wheel for c in candidates if c.wheel is not None}
    try:
        result = bisect(
            candidates,
            steps or BisectSteps(wheels, args.home, pytest_args),
            qnn_wheel,
            out,
            progress=lambda line: print(line, flush=True),
        )
    except BisectError as error:
        print(f"bisect: {error}", file=sys.stderr)
        return 1
    write_atomically(out / "bisect.json", json.dumps({**result, "command": command}, indent=1) + "\n")
    write_atomically(out / "bisect.md", render_markdown(result, command))
    print(f"bisect: first change in {result['first_changed']} (last good {result['last_good']}) -> {out / 'bisect.md'}")
    for change in result["changed"]:
        print(f"  {change['soc']} {change['case_id']} {change['check']}: {change['before']} -> {change['after']}")
    return 0
