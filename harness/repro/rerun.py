"""`python -m harness repro CASE_ID [--run DIR] [--device SERIAL] [--models MODULE] [-- PYTEST ARGS]`: run one
case of an earlier run through the harness again (every check of it, on an emulated device of its SoC unless
--device is given), writing a fresh bundle for it whatever its verdicts (--repro-all).

The case is looked up in the run's report.json files (default reports/latest), so any case of a run can
be rerun, not only bundled ones. The run folder is data, never code or arguments: its soc, dtype and mode
must be what the suite knows (the SoC table of the executorch under test, vocabulary.DTYPES and Mode), its
case id must be the one they and a known card make, and card modules come from --models or the defaults
(a bundle's case.json names a module, but importing what a run folder names would run its code). A
report.json that is no report (harness/report/intake.py refuses it) is one line, exit 4; anything else is one
line, exit 2.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from harness.paths import REPO_ROOT
from harness.repro import layout
from harness.vocabulary import DEFAULT_CARD_MODULES

DEFAULT_RUN = Path("reports") / "latest"
SOC_NAME = re.compile(r"^[A-Z][A-Z0-9]{1,15}$")  # then it must be in the executorch's SoC table (harness/qnn/soc.py)
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class RerunError(ValueError):
    """The case cannot be found or named safely; the message is one line naming the fix."""


class MalformedReport(RerunError):
    """A report.json that is no report (a FIFO, too large, not the schema's): exit 4, as for diff and merge."""


def find_case(run: Path, case_id: str, read_report: Callable[[Path], dict]) -> tuple[dict, Path]:
    """(the case's entry in its report.json, that SoC's report folder). read_report: how a report.json from
    elsewhere is read (harness/report/intake.py's, which the caller passes: bounded, never blocking on a FIFO,
    validated; it raises ValueError naming the file)."""
    if not layout.PLAIN_NAME.match(case_id):
        raise RerunError(
            f"{case_id!r} is not a case id (CARD-DTYPE-MODE-SOC, as report.json and the bundles name them)"
        )
    top = run / "report.json"
    reports = [top] if top.exists() or top.is_symlink() else sorted(run.glob("*/report.json"))
    if not reports:
        raise RerunError(f"--run {run}: no report.json there or in its SoC folders; pass a run folder (reports/<run>)")
    for path in reports:
        try:
            document = read_report(path)
        except ValueError as error:
            raise MalformedReport(str(error)) from None
        for case in document["cases"]:
            if case.get("case_id") == case_id:
                return case, path.parent
    raise RerunError(
        f"no case {case_id} in {', '.join(str(p) for p in reports)}: copy the id from report.json or summary.md"
    )


def checked_case(case: dict, card_names: set[str]) -> dict[str, str]:
    """The case's card, dtype, mode and soc, each one the suite knows and together its case id; else RerunError."""
    from harness.qnn import soc as soc_table
    from harness.vocabulary import DTYPES, Mode

    fields = {name: case.get(name) for name in ("card", "dtype", "mode", "soc")}
    if not all(isinstance(value, str) for value in fields.values()):
        raise RerunError(f"report.json's case {case.get('case_id')!r} lacks card, dtype, mode or soc: a damaged report")
    if fields["dtype"] not in DTYPES:
        raise RerunError(
            f"report.json gives dtype {fields['dtype']!r}, not one of {', '.join(DTYPES)}: a damaged or crafted report"
        )
    if fields["mode"] not in {mode.value for mode in Mode}:
        raise RerunError(f"report.json gives mode {fields['mode']!r}, not one of {', '.join(m.value for m in Mode)}")
    if not SOC_NAME.match(fields["soc"]) or fields["soc"] not in soc_table.table():
        raise RerunError(
            f"report.json gives SoC {fields['soc']!r}, which the executorch under test does not know "
            f"(e.g. SM8650): a damaged or crafted report"
        )
    if fields["card"] not in card_names:
        raise RerunError(
            f"card {fields['card']!r} is not among the cards of the modules given: pass its module with "
            f"--models MODULE (a run folder never names the code to import)"
        )
    if case.get("case_id") != "-".join(fields[name] for name in ("card", "dtype", "mode", "soc")):
        raise RerunError(
            f"report.json's case {case.get('case_id')!r} is not its card, dtype, mode and SoC joined: a damaged report"
        )
    return fields


def card_names(modules: list[str]) -> set[str]:
    """The cards the given modules (and the defaults) register; the modules come from the command line."""
    from harness.pipeline import card

    for module in (*DEFAULT_CARD_MODULES, *modules):
        if not MODULE_NAME.match(module):
            raise RerunError(f"--models {module!r} is not a module name (dotted identifiers, e.g. my_cards)")
        try:
            card.load_module(module)
        except Exception as error:  # a card module that raises is the user's to fix: one line
            raise RerunError(f"--models {module}: importing it failed ({type(error).__name__}: {error})") from None
    return {found.name for found in card.cards()}


def command(case: dict[str, str], case_id: str, modules: list[str], devices: list[str], extra: list[str]) -> list[str]:
    """The pytest command line that runs every check of just this case (every value checked beforehand)."""
    models = [arg for module in modules if module not in DEFAULT_CARD_MODULES for arg in ("--models", module)]
    targets = [arg for serial in devices for arg in ("--device", serial)] or ["--emulate", case["soc"]]
    return [
        sys.executable,
        "-m",
        "pytest",
        "suites",
        "-k",
        case_id,
        "--soc",
        case["soc"],
        "--dtype",
        case["dtype"],
        *targets,
        *models,
        "--repro-all",
        *extra,
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("case_id", help="the case to run again, e.g. kv_arange_init-fp16-delegate_mutbuf-SM8650")
    parser.add_argument(
        "--run", type=Path, default=DEFAULT_RUN, help="the run folder to find it in (default reports/latest)"
    )
    parser.add_argument("--device", action="append", default=[], metavar="SERIAL", help="a real device (repeatable)")
    parser.add_argument(
        "--models",
        action="append",
        default=[],
        metavar="MODULE",
        help="a card module the case's card is in, when not a default one (repeatable)",
    )
    parser.epilog = "Arguments after -- go to pytest (e.g. -- --report-dir DIR)."


def main(args: argparse.Namespace, read_report: Callable[[Path], dict]) -> int:
    try:
        case, _ = find_case(args.run.resolve(), args.case_id, read_report)
        fields = checked_case(case, card_names(args.models))
    except RerunError as error:
        print(f"repro: {error}", file=sys.stderr)
        return 4 if isinstance(error, MalformedReport) else 2
    line = command(fields, args.case_id, args.models, args.device, args.pytest_args)
    print("repro: " + " ".join(line[1:]), flush=True)
    return subprocess.run(line, cwd=REPO_ROOT).returncode
