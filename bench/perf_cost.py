"""Benchmark of what issue 33's measuring costs a cold default run (`--perf-repeats 1`) against the suite before it.

    .venv/bin/python bench/perf_cost.py [--pairs 3] [--workers 2] [--before REV] [--after REV] [-- SELECTION]

Issue 33 asks that the cost of measuring stays under 5% of a cold default run. "Before" is 0f8e5ea, the first
parent of 08ec24d ("Merge branch 'perf' into runwt"), the merge that brought issue 33 in; "after" is that
merge. The compiled runner already timed every execute and read its peak RSS before it (report.json's
`timing`: steps_us, first_step_us, peak_rss_kb), so what the comparison prices is what issue 33 added to a
default run: the p50/p90 of each case's steps in its record, the step-time tables, the delegation speed-up
and the per card x dtype SVG charts in summary.md and report.html, and the plumbing of --perf-repeats at 1
(no repeat runs). The performance gate itself runs only with --baseline, which a default run has not.

Both revisions are checked out as git worktrees in a private temporary folder (0700, removed at the end),
each set up (`python -m harness setup`, and its compiled runner built) before any timing. Then the same
selection runs cold (an empty --cache-dir and --report-dir of its own per run) with `-n WORKERS`, in pairs,
alternating which revision goes first (before/after, after/before, ...) so the machine's drift falls on
both sides. It prints the median wall times, the per-pair after / before ratios with their median, least
and greatest, and the time the after revision's run spent writing the step-time parts of its reports,
timed directly (summary.md and report.html rendered with and without the cases' timings, median of
--render-repeats each). Everything goes to bench/perf_cost-results.json, rewritten after every pair.

A whole cold default run takes 15-40 minutes on the 2-core development machine, so the default selection
is a slice: five zoo cards on SM8650, every dtype and mode (SLICE_CARDS; the zoo's ten cards made a cold
run of 13 minutes while the machine was loaded, too long to pair three times). Give the selection after `--`
(`-- ` with nothing else: the whole default matrix) to run another one on a quiet machine.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEFORE = "0f8e5ea"  # first parent of the merge: the compiled runner's per-step timing, none of issue 33's
AFTER = "08ec24d"  # Merge branch 'perf' into runwt: issue 33's measuring
# Five of fixtures/zoo.py's cards, the default slice's -k (no other default card's id holds these names):
# a counter, two KV-cache writes, a ring buffer and a running average, each delegated and skipped.
SLICE_CARDS = ("counter_add", "kv_index_copy_dim1", "kv_index_put", "ring_buffer", "running_average")
DEFAULT_SLICE = ("--soc", "SM8650", "-k", " or ".join(SLICE_CARDS))
BUDGET = 0.05  # issue 33: the cost of measuring stays under 5% of a cold default run
OUTPUT = REPO / "bench" / "perf_cost-results.json"


def _suite_bench():
    """bench/bench.py, whose run_suite is the one body of "a cold suite run and what its reports say"."""
    spec = importlib.util.spec_from_file_location("qnnsuite_bench", REPO / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, checked: a bad value ends the program with one line naming it and the fix."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="before/after pairs of cold runs (default 3)")
    parser.add_argument("--workers", default="2", help="pytest -n for every run (default 2)")
    parser.add_argument("--before", default=BEFORE, metavar="REV", help=f"the suite without the measuring ({BEFORE})")
    parser.add_argument("--after", default=AFTER, metavar="REV", help=f"the suite with it ({AFTER})")
    parser.add_argument("--render-repeats", type=int, default=15, help="timings of each report view (default 15)")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("selection", nargs=argparse.REMAINDER, help="after --: pytest selection arguments")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: give 1 or more (3 or more to see the spread)")
    if args.render_repeats < 1:
        parser.error(f"--render-repeats {args.render_repeats}: give 1 or more")
    if args.workers != "auto" and not (args.workers.isdigit() and int(args.workers) >= 1):
        parser.error(f"--workers {args.workers!r}: give a count of 1 or more, or auto")
    if args.output.is_dir() or not args.output.parent.is_dir():
        parser.error(f"--output {args.output}: give a file path in an existing folder")
    if args.selection[:1] == ["--"]:
        args.selection = args.selection[1:]
        args.explicit_selection = True
    else:
        args.explicit_selection = bool(args.selection)
    if not args.explicit_selection:
        args.selection = list(DEFAULT_SLICE)
    return args


def commit_of(rev: str) -> str:
    """REV as a full commit id of this repository, or a one-line exit naming it."""
    resolved = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise SystemExit(f"perf_cost: {rev!r} is not a commit of this repository; give a commit, tag or branch")
    return resolved.stdout.strip()


def prepare(checkout: Path) -> float:
    """The checkout's QNN tree and compiled runner, made before any timing (a cold run is cold in its
    artifacts, not in the toolchain every run of the machine shares); returns the seconds it took."""
    started = time.perf_counter()
    for command in (
        [sys.executable, "-m", "harness", "setup"],
        [sys.executable, "-c", "from harness.runner.build import build; build()"],
    ):
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"perf_cost: setting up {checkout.name} failed ({shlex.join(command[1:])}): "
                f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}"
            )
    return time.perf_counter() - started


def order(pair: int) -> tuple[str, str]:
    """Which revision runs first in a pair: alternating, so a machine slowing down or speeding up over the
    benchmark adds to both sides alike."""
    return ("before", "after") if pair % 2 == 0 else ("after", "before")


def summarise(runs: dict[str, list[dict]], render: dict | None) -> dict:
    """Medians, the per-pair after / before ratios (the pairs alternate, so each ratio is of two runs made
    close together), and whether the median ratio's excess is within the budget."""
    pairs = min(len(runs["before"]), len(runs["after"]))
    ratios = [runs["after"][i]["wall_s"] / runs["before"][i]["wall_s"] for i in range(pairs)]
    median = {kind: statistics.median(run["wall_s"] for run in found) for kind, found in runs.items() if found}
    summary: dict = {"pairs": pairs, "median_wall_s": median}
    if ratios:
        ratio = statistics.median(ratios)
        summary |= {
            "ratios_after_over_before": ratios,
            "ratio_median": ratio,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cost_pct": (ratio - 1) * 100,
            "within_budget": ratio - 1 < BUDGET,
            "same_cases": len({run["cases"] for run in runs["before"][:pairs] + runs["after"][:pairs]}) == 1,
            # 1 is the suite finding failures (its job); anything else (a signal, a crash) ended a run early
            "complete": all(run["exit_status"] in (0, 1) for run in runs["before"][:pairs] + runs["after"][:pairs]),
        }
    if render is not None and "after" in median:
        # the sections built directly; the views' with - without also holds the template's part (and noise)
        delta = sum(max(0.0, view["with"] - view["without"]) for view in render["views_s"].values())
        summary |= {
            "report_perf_parts_s": render["perf_parts_s"],
            "report_perf_parts_share": render["perf_parts_s"] / median["after"],
            "report_views_delta_s": delta,
            "report_views_delta_share": delta / median["after"],
        }
    return summary


def write(output: Path, result: dict) -> None:
    """The result file, written whole each time (an interrupted benchmark keeps the pairs it measured)."""
    partial = output.with_name(output.name + ".partial")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    partial.replace(output)


def time_reports(reports: list[Path], repeats: int) -> dict:
    """Run inside the after checkout (its harness on sys.path), on its run's report.json files, summed over
    them: the step-time sections built directly (markdown's and the page's _performance: the tables, the
    speed-up rows and the SVG charts; step_stats over every case), and as a cross-check the whole summary.md
    and report.html rendered with the cases' timings and without (renders alternating, median of REPEATS)."""
    from harness.record import step_stats
    from harness.report.render import markdown, page

    def median_s(build, argument: object) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            build(argument)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    sections = dict.fromkeys(("summary.md _performance", "report.html _performance", "step_stats"), 0.0)
    views: dict[str, dict[str, float]] = {"summary.md": {}, "report.html": {}}
    for report in reports:
        document = json.loads(report.read_text())
        untimed = copy.deepcopy(document)
        for case in untimed["cases"]:
            case["timing"] = None
        steps = [case["timing"]["steps_us"] for case in document["cases"] if isinstance(case.get("timing"), dict)]
        sections["summary.md _performance"] += median_s(markdown._performance, document)
        sections["report.html _performance"] += median_s(page._performance, document)
        sections["step_stats"] += median_s(lambda runs: [step_stats(s) for s in runs], steps)
        for name, render in (("summary.md", markdown.render), ("report.html", page.render)):
            times: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(repeats):
                for kind, which in (("with", document), ("without", untimed)):
                    started = time.perf_counter()
                    render(which)
                    times[kind].append(time.perf_counter() - started)
            for kind, found in times.items():
                views[name][kind] = views[name].get(kind, 0.0) + statistics.median(found)
    return {
        "reports": len(reports),
        "timed_cases": sum(len(json.loads(r.read_text())["cases"]) for r in reports),
        "repeats": repeats,
        "sections_s": sections,
        "views_s": views,
        "perf_parts_s": sum(sections.values()),
    }


def render_cost(checkout: Path, report_dir: Path, repeats: int) -> dict | None:
    """time_reports in the after checkout, on the report.json files of one of its runs (None: none written)."""
    reports = sorted(p for p in report_dir.glob("*/*/report.json") if not p.parent.parent.is_symlink())
    if not reports:
        return None
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--time-reports", str(repeats), *map(str, reports)],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"perf_cost: timing the reports failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict:
    """The pairs of cold runs in two temporary worktrees, and the after run's report-writing cost."""
    suite = _suite_bench()
    commits = {"before": commit_of(args.before), "after": commit_of(args.after)}
    result = {
        "before": args.before,
        "after": args.after,
        "commits": commits,
        "selection": shlex.join(args.selection) or "default (pytest suites)",
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "budget": BUDGET,
    }
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    render = None
    with tempfile.TemporaryDirectory(prefix="qnnsuite-perfcost-") as scratch:  # mkdtemp: 0700
        root = Path(scratch)
        checkouts = {kind: root / kind for kind in commits}
        try:
            for kind, checkout in checkouts.items():
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(checkout), commits[kind]],
                    check=True,
                )
                result.setdefault("setup_s", {})[kind] = prepare(checkout)
            for pair in range(args.pairs):
                for kind in order(pair):
                    folder = root / f"{kind}-{pair}"
                    runs[kind].append(
                        suite.run_suite(
                            args.selection, args.workers, folder / "cache", folder / "reports", checkouts[kind]
                        )
                    )
                    found = runs[kind][-1]
                    print(
                        f"pair {pair + 1}/{args.pairs} {kind}: {found['wall_s']:.0f} s, {found['cases']} cases, "
                        f"exit {found['exit_status']}, {found['verdicts']}",
                        flush=True,
                    )
                if render is None:  # a revision without the step-time sections costs the figure, not the pairs
                    try:
                        render = render_cost(
                            checkouts["after"], root / f"after-{pair}" / "reports", args.render_repeats
                        )
                    except SystemExit as error:
                        print(error, flush=True)
                write(args.output, {**result, **summarise(runs, render), "render": render, "runs": runs})
        finally:
            for checkout in checkouts.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=False)
    return {**result, **summarise(runs, render), "render": render, "runs": runs}


def table(result: dict) -> str:
    """The figures as Markdown rows, for docs/PERFORMANCE.md."""
    median = result["median_wall_s"]
    rows = [
        f"| `{result['selection']}`, `-n {result['workers']}`, cold | {result['pairs']} pairs | |",
        "| --- | --- | --- |",
        f"| before ({result['before']}) | {median['before']:.1f} s | median |",
        f"| after ({result['after']}) | {median['after']:.1f} s | median |",
        f"| after / before | {result['ratio_median']:.3f} | per pair {result['ratio_min']:.3f} - "
        f"{result['ratio_max']:.3f}; budget < {1 + BUDGET:.2f}, {'met' if result['within_budget'] else 'NOT met'} |",
    ]
    if result.get("report_perf_parts_s") is not None:
        rows.append(
            f"| step-time parts of the reports, timed directly | {result['report_perf_parts_s'] * 1000:.0f} ms | "
            f"{result['report_perf_parts_share']:.2%} of the after run |"
        )
        rows.append(
            f"| summary.md + report.html with timings - without | {result['report_views_delta_s'] * 1000:.0f} ms | "
            f"{result['report_views_delta_share']:.2%} of the after run |"
        )
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--time-reports"]:  # the after checkout's side of render_cost
        print(json.dumps(time_reports([Path(p) for p in argv[2:]], int(argv[1]))))
        return
    args = parse(argv)
    result = run(args)
    write(args.output, result)
    if not result.get("same_cases", False):
        raise SystemExit("perf_cost: the two revisions ran different cases; the ratio compares nothing")
    if not result["complete"]:
        raise SystemExit("perf_cost: a run ended early (see exit_status in the result file); run the benchmark again")
    print(table(result))


if __name__ == "__main__":
    main(sys.argv[1:])
