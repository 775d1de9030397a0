"""`python -m harness matrix`: the same suite selection across executorch and onnxruntime-qnn releases.

    python -m harness matrix --executorch 1.4.1,1.5.0,1.5.1 [--qnn-wheel 2.5.0,2.7.0] [-- PYTEST ARGS]
    python -m harness matrix --rebuild reports/matrix-<id>      (re-render the side-by-side report only)
    python -m harness matrix --executorch 1.4.1,1.5.1 --cross [-- PYTEST ARGS]   (and each release's programs
        on the other releases' runtimes: harness/matrix/cross.py, cross.{json,md} and a section of the page)

Writes reports/matrix-<id>/matrix.{html,md,json}. Exits 0 when every combination ran (failing checks
are findings, not errors), 1 when some could not run (their column says why), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

from harness.matrix import render, runner, side_by_side
from harness.matrix.environments import MATRIX_HOME, REQUIREMENTS, MatrixSetupError, release
from harness.matrix.layout import COMMAND_FILE, Combination
from harness.paths import REPO_ROOT
from harness.report.intake import ReportDataError

MATRIX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _releases(text: str, what: str) -> list[str]:
    versions = [release(part, what) for part in text.split(",") if part.strip()]
    if not versions:
        raise MatrixSetupError(f"{what}: give at least one release, e.g. 1.5.1")
    return list(dict.fromkeys(versions))


def pinned_qnn_wheel(requirements: Path = REQUIREMENTS) -> str:
    """The onnxruntime-qnn release requirements.txt pins: the default (and only) QNN column."""
    found = re.search(r"^onnxruntime-qnn==(\S+)", requirements.read_text(), re.MULTILINE)
    if found is None:
        raise MatrixSetupError(f"{requirements} pins no onnxruntime-qnn: pass --qnn-wheel")
    return found.group(1)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Options before `--`, pytest's arguments after it."""
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m harness matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executorch", metavar="V[,V...]", help="executorch releases, one column group each")
    parser.add_argument(
        "--qnn-wheel",
        metavar="V[,V...]",
        default=None,
        help="onnxruntime-qnn releases whose host QNN libraries to use (default: the pinned one)",
    )
    parser.add_argument("--id", default=None, help="matrix id (default: a time stamp); reports/matrix-<id>/")
    parser.add_argument("--report-root", type=Path, default=REPO_ROOT / "reports", help="where matrix-<id>/ goes")
    parser.add_argument(
        "--home", type=Path, default=MATRIX_HOME, help="venvs, QNN trees and caches (default .cache/matrix)"
    )
    parser.add_argument(
        "--rebuild",
        type=Path,
        default=None,
        metavar="FOLDER",
        help="re-render the side-by-side report of an existing reports/matrix-<id>/ and stop",
    )
    parser.add_argument(
        "--cross",
        action="store_true",
        help="also run each release's programs on every other release's runtime (cross.json, cross.md)",
    )
    args = parser.parse_args(ours)
    if args.rebuild is None and not args.executorch:
        parser.error("--executorch is required (e.g. --executorch 1.4.1,1.5.0,1.5.1), or --rebuild FOLDER")
    if args.cross and (args.rebuild is not None or len([v for v in args.executorch.split(",") if v.strip()]) < 2):
        parser.error("--cross runs programs across releases: give two or more with --executorch (e.g. 1.4.1,1.5.1)")
    if args.id is not None and not MATRIX_ID.fullmatch(args.id):
        parser.error(f"--id {args.id!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return args, pytest_args


def combinations(args: argparse.Namespace) -> list[Combination]:
    executorch = _releases(args.executorch, "--executorch")
    wheels = _releases(args.qnn_wheel, "--qnn-wheel") if args.qnn_wheel else [pinned_qnn_wheel()]
    return [Combination(e, q) for e in executorch for q in wheels]


def flaky_reasons() -> frozenset[str]:
    """How the report words an xfail of each manifest entry marked flaky (those flips are not version changes).
    The entries are read without checking their signatures against the check registry (`known_failures.load`
    does, and the matrix may not import the checks, a floor above it: with none registered every entry was
    refused and no page was written); each column's suite run checked the manifest."""
    from harness import known_failures

    return frozenset(entry.describe() for entry in known_failures.load(registered=False) if entry.flaky)


MALFORMED_REPORT = 4  # a combination's report.json is not a valid one: bad input, as `python -m harness.report` exits


def _unreadable_report(error: ReportDataError, folder: Path) -> int:
    print(f"matrix: no page: {error}; fix or remove it, then --rebuild {folder}", file=sys.stderr)
    return MALFORMED_REPORT


def write_side_by_side(folder: Path, fallback_command: str) -> Path:
    """matrix.{json,md,html} of `folder`, naming every command recorded in its command.txt (the runs
    and re-runs that made it), or `fallback_command` for a folder made before that file existed.
    ReportDataError when a combination's report.json is not a valid one (nothing is written then)."""
    recorded = folder / COMMAND_FILE
    command = recorded.read_text().strip() if recorded.is_file() else fallback_command
    document = side_by_side.build(
        side_by_side.load_columns(folder), folder.name.removeprefix("matrix-"), command, flaky_reasons()
    )
    render.write(document, folder, cross_document(folder))
    return folder / "matrix.html"


def cross_document(folder: Path) -> dict | None:
    """cross.json of a matrix folder, read as data (None when there is none, or one line when it is unreadable)."""
    path = folder / "cross.json"
    if not path.is_file():
        return None
    try:
        cross = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        print(f"matrix: {path} is unreadable ({error}); the page has no cross-version section", file=sys.stderr)
        return None
    if not isinstance(cross, dict) or cross.get("schema_version") != 1:
        print(f"matrix: {path} is not a cross.json of schema 1; the page has no cross-version section", file=sys.stderr)
        return None
    return cross


def write_cross(folder: Path, args: argparse.Namespace, command: str) -> int:
    """The cross-version step over the combinations that ran; 0, or 1 with one line when it cannot run."""
    from harness.matrix import cross  # imports torch (numerics, the cards' eager runs): only when asked

    try:
        found = cross.cross_matrix(folder, args.home, command, progress=lambda line: print(line, flush=True))
    except (MatrixSetupError, ReportDataError) as error:
        print(f"matrix: cross-version programs: {error}", file=sys.stderr)
        return 1
    path = cross.write(found, folder)
    counts = ", ".join(f"{sum(p['counts'][o] for p in found['pairs'])} {o}" for o in found["outcomes"])
    print(f"matrix: cross-version programs: {len(found['rows'])} runs ({counts}) -> {path} (cross.md with the page)")
    return 0


def main(argv: list[str]) -> int:
    args, pytest_args = parse(argv)
    command = "python -m harness matrix " + shlex.join(argv)
    if args.rebuild is not None:
        if not args.rebuild.is_dir():
            print(
                f"matrix: --rebuild {args.rebuild}: no such folder; pass a reports/matrix-<id>/ folder", file=sys.stderr
            )
            return 2
        try:
            print(f"matrix: {write_side_by_side(args.rebuild, command)}")
        except ReportDataError as error:
            return _unreadable_report(error, args.rebuild)
        return 0
    try:
        wanted = combinations(args)
    except MatrixSetupError as error:
        print(f"matrix: {error}", file=sys.stderr)
        return 2
    folder = args.report_root / f"matrix-{args.id or time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / COMMAND_FILE, "a") as commands:  # a re-run of some combinations adds its line
        commands.write(command + "\n")
    runs = runner.run_matrix(
        wanted, runner.RealSteps(args.home, pytest_args), folder, progress=lambda line: print(line, flush=True)
    )
    crossed = write_cross(folder, args, command) if args.cross else 0
    try:
        page = write_side_by_side(folder, command)
    except ReportDataError as error:
        return _unreadable_report(error, folder)
    ran = sum(run.status == "ran" for run in runs)
    print(f"matrix: {ran} of {len(runs)} combinations ran -> {page} (also matrix.md, matrix.json)")
    return 0 if ran == len(runs) and crossed == 0 else 1
