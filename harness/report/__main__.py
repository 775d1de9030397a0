"""`python -m harness.report diff A B`: what changed between two runs, failing on regressions; and
`python -m harness.report merge DIR... --out DIR`: shards' reports as one run's (harness/report/nightly/merge.py).

diff: A and B are report.json files or run folders. Prints one line per check whose verdict changed
(regressions, new failures and known failures that now pass are marked); exits 1 if B regressed against A
or has a new failure,
2 on a path that holds no report, 4 on a report file that is not a valid report.json (one line on stderr
names it: report files from elsewhere are data, harness/report/intake.py), else 0.
merge: exits 2 when the parts cannot be merged (one line says why), 4 on a part or baseline that is not a
valid report.json, 1 when --baseline is given and the merged run fails its gate (gate.json beside each
report.json names the checks), else 0.
A baseline (diff's A, merge's --baseline) that is a nightly store means its newest sealed night whose gate
passed (harness/report/nightly/promote.py baseline_path).
promote: `python -m harness.report promote RUN --to DIR [--keep N]` (harness/report/nightly/promote.py); exits 2
when the run is incomplete or DIR is not a store. history: `python -m harness.report history DIR`
(harness/report/nightly/history.py); exits 2 when DIR is not a store. issues: `python -m harness.report issues RUN`
(harness/report/nightly/issues.py); exits 2 on a path without reports, 4 on a malformed one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.report.gate import BaselineError, MalformedReport, changes, compare, load
from harness.report.nightly import history as histories, issues as findings, merge as merging, promote as promotion
from harness.report.render.writer import DocsUrlError, docs_url, summary_line
from harness.text import printable
from harness.user_state import UnsafeStateDir

MALFORMED = 4  # a report file that is not a valid report.json: pytest's usage-error code, as --baseline gets


def diff(before_path: Path, after_path: Path) -> int:
    try:
        before, after = load(promotion.baseline_path(before_path)), load(after_path)
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


def merge(
    folders: list[Path], out: Path, baseline: Path | None, allow_missing: bool, run_id: str | None, url: str | None
) -> int:
    try:
        url = docs_url(url)
        baseline = promotion.baseline_path(baseline) if baseline else None  # a store: its newest night that passed
        merged = merging.merge(folders, out, baseline, allow_missing, run_id, url)
    except MalformedReport as error:
        print(f"merge: {error}", file=sys.stderr)
        return MALFORMED
    except (merging.MergeError, BaselineError, DocsUrlError) as error:
        print(f"merge: {error}", file=sys.stderr)
        return 2
    socs = sorted({record.soc for record in merged.records})
    print(f"merged {len(folders)} run(s) into {out}")
    for soc in socs:
        print(summary_line(merged.records, soc, out / soc / "report.html"))
    verdict = merged.verdict
    if verdict is None:
        return 0
    said = f" ({verdict.baseline_line()})" if verdict.baseline_line() else ""
    print(f"gate against {baseline}{said}: " + ("no regressions" if verdict.ok else "FAILED"))
    for line in verdict.lines():
        print(f"  {printable(line)}")  # a part's failure message may carry terminal escapes
    return 0 if verdict.ok else 1


def promote(run: Path, store: Path, keep: int, bundles: bool) -> int:
    try:
        night = promotion.promote(run, store, keep, bundles)
    except (promotion.PromoteError, UnsafeStateDir) as error:
        print(f"promote: {error}", file=sys.stderr)
        return 2
    print(f"promoted {run} to {night}")
    return 0


def history(store: Path, out: Path | None, url: str | None) -> int:
    if not promotion.is_store(store):
        print(f"history: {store} is not a nightly store: pass the folder given to promote --to", file=sys.stderr)
        return 2
    try:
        promotion.check_store(store, "history:")
        json_path, html_path = histories.write(store, out, docs_url(url))
    except (BaselineError, DocsUrlError) as error:
        print(f"history: {error}", file=sys.stderr)
        return 2
    for line in histories.headline(json.loads(json_path.read_text(encoding="utf-8"))):
        print(printable(line))
    print(f"history: {html_path} and {json_path.name}")
    return 0


def issues(run: Path, out: Path | None) -> int:
    try:
        written = findings.write(run, out)
    except (BaselineError, findings.IssuesError) as error:
        print(f"issues: {error}", file=sys.stderr)
        return MALFORMED if isinstance(error, MalformedReport) else 2
    for path in written:
        print(path)
    missing = findings.missing_bundles(run)
    if missing:
        print(
            f"issues: {missing} reproduction bundle(s) the reports name are not in {run} (promoted with --no-bundles?): "
            f"no script for those findings; take the bundles from the run's own folder, or write one again with "
            f"`python -m harness repro CASE_ID --run RUN`",
            file=sys.stderr,
        )
    print(f"issues: {len(written)} finding(s)" + (f" in {written[0].parent}" if written else ": no failing check"))
    return 0


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
    command.add_argument(
        "--run-id", metavar="ID", help="the merged run's id (default: the parts'; never the --out folder's name)"
    )
    docs = "where docs/ is published, for FINDINGS.md links (default: $QNNSUITE_DOCS_URL, else a copy in the folder)"
    command.add_argument("--docs-url", metavar="URL", help=docs)
    command = commands.add_parser("promote", help="copy a finished run into a nightly store as its newest night")
    command.add_argument("run", type=Path, metavar="RUN", help="a run folder (reports/<run>, or a merged folder)")
    command.add_argument("--to", type=Path, required=True, metavar="DIR", help="the nightly store (made if new)")
    command.add_argument("--keep", type=int, default=promotion.DEFAULT_KEEP, metavar="N", help="nights to keep")
    command.add_argument("--no-bundles", action="store_true", help="leave the reproduction bundles out (smaller)")
    command = commands.add_parser("history", help="history.html and history.json of a nightly store")
    command.add_argument("store", type=Path, metavar="DIR", help="a nightly store (promote --to DIR)")
    command.add_argument("--out", type=Path, metavar="DIR", help="where to write them (default: DIR)")
    command.add_argument("--docs-url", metavar="URL", help=docs)
    command = commands.add_parser("issues", help="one upstream issue.md (and script) per finding of a run")
    command.add_argument("run", type=Path, metavar="RUN", help="a run folder (reports/<run>, or a merged folder)")
    command.add_argument("--out", type=Path, metavar="DIR", help="where to write them (default: RUN/issues)")
    args = parser.parse_args(argv)
    if args.command == "issues":
        return issues(args.run, args.out)
    if args.command == "promote":
        return promote(args.run, args.to, args.keep, not args.no_bundles)
    if args.command == "history":
        return history(args.store, args.out, args.docs_url)
    if args.command == "merge":
        return merge(args.folders, args.out, args.baseline, args.allow_missing, args.run_id, args.docs_url)
    return diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
