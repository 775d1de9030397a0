"""`python -m harness.report diff A B`: what changed between two runs, failing on regressions; and
`python -m harness.report merge DIR... --out DIR`: shards' reports as one run's (harness/report/merge.py).

diff: A and B are report.json files or run folders. Prints one line per check whose verdict changed
(regressions, new failures and known failures that now pass are marked); exits 1 if B regressed against A
or has a new failure,
2 on a path that holds no report, 4 on a report file that is not a valid report.json (one line on stderr
names it: report files from elsewhere are data, harness/report/intake.py), else 0.
merge: exits 2 when the parts cannot be merged (one line says why), 4 on a part or baseline that is not a
valid report.json, 1 when --baseline is given and the merged run fails its gate (gate.json beside each
report.json names the checks), else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import merge as merging
from harness.report.gate import BaselineError, MalformedReport, changes, compare, load
from harness.report.writer import summary_line
from harness.text import printable

MALFORMED = 4  # a report file that is not a valid report.json: pytest's usage-error code, as --baseline gets


def diff(before_path: Path, after_path: Path) -> int:
    try:
        before, after = load(before_path), load(after_path)
    except BaselineError as error:
        print(f"diff: {error}", file=sys.stderr)
        return MALFORMED if isinstance(error, MalformedReport) else 2
    result = compare(before, after)
    notes = {
        **{c.key: "known failure now passes" for c in result.fixed_known_failures},
        **{c.key: "new failure" for c in result.new_failures},
        **{c.key: "regression" for c in result.regressions},
    }
    for change in changes(before, after):
        print(change.line() + (f"  [{notes[change.key]}]" if change.key in notes else ""))
    return 1 if result.regressions or result.new_failures else 0


def merge(folders: list[Path], out: Path, baseline: Path | None, allow_missing: bool) -> int:
    try:
        merged = merging.merge(folders, out, baseline, allow_missing)
    except MalformedReport as error:
        print(f"merge: {error}", file=sys.stderr)
        return MALFORMED
    except merging.MergeError as error:
        print(f"merge: {error}", file=sys.stderr)
        return 2
    socs = sorted({record.soc for record in merged.records})
    print(f"merged {len(folders)} run(s) into {out}")
    for soc in socs:
        print(summary_line(merged.records, soc, out / soc / "report.html"))
    verdict = merged.verdict
    if verdict is None:
        return 0
    print(f"gate against {baseline}: " + ("no regressions" if verdict.ok else "FAILED"))
    for line in verdict.lines():
        print(f"  {printable(line)}")  # a part's failure message may carry terminal escapes
    return 0 if verdict.ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description="Compare conformance reports.")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("diff", help="print checks whose verdict changed from A to B; exit 1 on regressions")
    command.add_argument("before", type=Path, metavar="A", help="baseline: a report.json or a run folder")
    command.add_argument("after", type=Path, metavar="B", help="candidate: a report.json or a run folder")
    command = commands.add_parser("merge", help="merge shard run folders into one per-SoC report folder")
    command.add_argument("folders", type=Path, nargs="+", metavar="DIR", help="a shard's run folder (reports/<run>)")
    command.add_argument("--out", type=Path, required=True, metavar="DIR", help="new folder for <SOC>/report.json etc.")
    command.add_argument("--baseline", type=Path, metavar="PATH", help="gate the merged run against this report or run")
    command.add_argument(
        "--allow-missing", action="store_true", help="gate: baseline checks absent here do not fail it"
    )
    args = parser.parse_args(argv)
    if args.command == "merge":
        return merge(args.folders, args.out, args.baseline, args.allow_missing)
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
