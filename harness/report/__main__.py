"""`python -m harness.report diff A B`: what changed between two runs, failing on regressions.

A and B are report.json files or run folders. Prints one line per check whose verdict changed
(regressions, new failures and known failures that now pass are marked); exits 1 if B regressed against A
or has a new failure,
2 on unreadable input, else 0.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report.gate import BaselineError, changes, compare, load


def diff(before_path: Path, after_path: Path) -> int:
    try:
        before, after = load(before_path), load(after_path)
    except BaselineError as error:
        print(f"diff: {error}", file=sys.stderr)
        return 2
    result = compare(before, after)
    notes = {**{c.key: "known failure now passes" for c in result.fixed_known_failures},
             **{c.key: "new failure" for c in result.new_failures},
             **{c.key: "regression" for c in result.regressions}}
    for change in changes(before, after):
        print(change.line() + (f"  [{notes[change.key]}]" if change.key in notes else ""))
    return 1 if result.regressions or result.new_failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description="Compare conformance reports.")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("diff", help="print checks whose verdict changed from A to B; exit 1 on regressions")
    command.add_argument("before", type=Path, metavar="A", help="baseline: a report.json or a run folder")
    command.add_argument("after", type=Path, metavar="B", help="candidate: a report.json or a run folder")
    args = parser.parse_args(argv)
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
