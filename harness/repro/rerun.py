"""`python -m harness repro CASE_ID [--run DIR] [--device SERIAL] [-- PYTEST ARGS]`: run one case of an earlier
run through the harness again (every check of it, on an emulated device of its SoC unless --device is
given), writing a fresh bundle for it whatever its verdicts (--repro-all).

The case is looked up in the run's report.json files (default reports/latest), so any case of a run can
be rerun, not only bundled ones; a bundle's case.json adds the card module when it is not a default one.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness.paths import REPO_ROOT
from harness.repro import layout

DEFAULT_RUN = Path("reports") / "latest"
DEFAULT_CARD_MODULES = ("fixtures.zoo", "fixtures.llama")


class RerunError(ValueError):
    """The case cannot be found or named safely; the message is one line naming the fix."""


def find_case(run: Path, case_id: str) -> tuple[dict, Path]:
    """(the case's entry in its report.json, that SoC's report folder)."""
    if not layout.PLAIN_NAME.match(case_id):
        raise RerunError(f"{case_id!r} is not a case id (CARD-DTYPE-MODE-SOC, as report.json and the bundles name them)")
    reports = [run / "report.json"] if (run / "report.json").is_file() else sorted(run.glob("*/report.json"))
    if not reports:
        raise RerunError(f"--run {run}: no report.json there or in its SoC folders; pass a run folder (reports/<run>)")
    for path in reports:
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise RerunError(f"{path}: unreadable report ({error})") from error
        for case in document.get("cases", []):
            if case.get("case_id") == case_id:
                return case, path.parent
    raise RerunError(f"no case {case_id} in {', '.join(str(p) for p in reports)}: copy the id from report.json or summary.md")


def command(case: dict, soc_folder: Path, devices: list[str], extra: list[str]) -> list[str]:
    """The pytest command line that runs every check of just this case."""
    bundle = soc_folder / layout.link(case["case_id"]) / layout.CASE_FILE
    module = json.loads(bundle.read_text())["card"]["module"] if bundle.is_file() else ""
    models = ["--models", module] if module and module not in DEFAULT_CARD_MODULES else []
    targets = [arg for serial in devices for arg in ("--device", serial)] or ["--emulate", case["soc"]]
    return [sys.executable, "-m", "pytest", "suites", "-k", case["case_id"], "--soc", case["soc"], "--dtype", case["dtype"],
            *targets, *models, "--repro-all", *extra]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case_id", help="the case to run again, e.g. kv_arange_init-fp16-delegate_mutbuf-SM8650")
    parser.add_argument("--run", type=Path, default=DEFAULT_RUN, help="the run folder to find it in (default reports/latest)")
    parser.add_argument("--device", action="append", default=[], metavar="SERIAL", help="a real device (repeatable)")
    parser.epilog = "Arguments after -- go to pytest (e.g. -- --report-dir DIR)."


def main(args: argparse.Namespace) -> int:
    try:
        case, soc_folder = find_case(args.run.resolve(), args.case_id)
    except RerunError as error:
        print(f"repro: {error}", file=sys.stderr)
        return 2
    line = command(case, soc_folder, args.device, args.pytest_args)
    print("repro: " + " ".join(line[1:]), flush=True)
    return subprocess.run(line, cwd=REPO_ROOT).returncode
