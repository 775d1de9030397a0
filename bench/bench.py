"""Benchmark of the suite's own cost: cold vs warm runs, -n 1 vs -n auto, and where the time goes.

    .venv/bin/python bench/bench.py [--repeats 3] [--workers auto] [-- PYTEST SELECTION ARGS]
    .venv/bin/python bench/bench.py --against REV [--repeats 2] [--workers 2] [-- PYTEST SELECTION ARGS]

--against REV checks REV out in a temporary git worktree and runs the same selection cold with `-n WORKERS`
in this checkout and in REV, alternating (this, REV, this, REV, ...; each cold run with an empty cache of
its own), plus a warm run of this checkout on each of its cold caches; it reports the median wall times,
REV / this (the speed-up) and warm / cold, and records them under "against" in the output file, each run
with its exports, quantizations and lowerings (report.json's work fields; a revision without them is
counted from its stage timings, and the run says so).

Without selection arguments it measures the default matrix (`pytest suites`: every card, dtype and mode on
the emulated SM8650 and SM8750). Each measurement is a real suite run on emulated devices; per repeat:
a cold `-n 1` run and a cold `-n WORKERS` run (each with an empty artifact cache), then a warm
`-n WORKERS` run on the second one's cache. Figures are medians over --repeats. Times are for this
machine; the ratios are what the targets (docs/PERFORMANCE.md) are about:
  warm / cold wall            <= 0.07   (lowered artifacts reused from the content-keyed cache)
  harness overhead / cold     <= 0.05   (all but export, quantize, lower and the runner's own execution)
  cold -n 1 / cold -n WORKERS >= 1.6    (2 workers on 2 cores)
  --against: REV / this (cold) >= 1.25, and this checkout's cold runs export each card once and quantize
  each card x quantized dtype once (report.json work fields against the cards and dtypes the run has)
  a cached case's device run on an emulated device (bench/device_run.py), compiled runner <= 0.5 s
Writes bench/results.json (every run, with its verdict counts, so runs can be told apart) and prints a
Markdown table for docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Per-case stages from report.json timings; "lower" includes serialising the program, and the Meta llama
# flow's export_llama (executorch's own export, quantize and lower in one, which the harness cannot split).
CASE_STAGES = {
    "export": ("export",),
    "quantize": ("quantize",),
    "lower": ("lower", "serialize", "export_llama"),
    "lowering process start": ("import_and_build", "read_exported", "read_prepared"),
    "device wait": ("device_wait",),
    "push": ("push",),
    "device command": ("run",),
    "runner_exec": ("runner_exec",),
    "pull": ("pull",),
    "eager reference": ("eager_reference",),
}
WORK = ("export", "quantize", "lower")  # what the harness counts per case (report.json's work fields)
PRODUCTIVE = ("export", "quantize", "lower")  # plus the runner's own execution (runner_exec)
TARGETS = {
    "warm_over_cold": ("<=", 0.07),
    "harness_overhead_over_cold_n1": ("<=", 0.05),
    "speedup_nN_over_n1": (">=", 1.6),
    "device_run_s": ("<=", 0.5),
}
AGAINST_SPEEDUP = 1.25  # --against: REV's cold wall over this checkout's


def run_suite(matrix: list[str], workers: str, cache_dir: Path, report_dir: Path, checkout: Path = REPO) -> dict:
    """One suite run (of the suite in checkout): its wall time, verdict counts, work counts and the per-stage
    sums read from its report.json files."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "suites",
        "-q",
        "-W",
        "ignore",
        "-p",
        "no:cacheprovider",
        "--cache-dir",
        str(cache_dir),
        "--report-dir",
        str(report_dir),
        *matrix,
    ]
    if workers != "1":
        command += ["-n", workers]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    wall = time.perf_counter() - started
    # The run's own folder, not `latest`: a revision whose report writing fails after report.json
    # (0aa5dfd's HTML page lacks the not_measured label) leaves `latest` unset; such a run is measured
    # and marked with its exit status.
    reports = sorted(path for path in report_dir.glob("*/*/report.json") if not path.parent.parent.is_symlink())
    if completed.returncode not in (0, 1) and not reports:  # 1: the suite found failures, which is its job
        raise SystemExit(
            f"suite run failed ({completed.returncode}): {shlex.join(command)}\n"
            f"{completed.stdout[-3000:]}{completed.stderr[-2000:]}"
        )
    stages = dict.fromkeys([*CASE_STAGES, "compare"], 0.0)
    verdicts: Counter[str] = Counter()
    work: Counter[str] = Counter()
    counted_by = set()
    cards: set[str] = set()
    quantized: set[tuple[str, str]] = set()
    cases = cached = 0
    for report in reports:
        for case in json.loads(report.read_text())["cases"]:
            cases += 1
            cards.add(case["card"])
            if case["dtype"] != "fp16" and case["mode"] != "meta_llama":  # the Meta flow quantizes by itself
                quantized.add((case["card"], case["dtype"]))
            timings = case.get("timings_s", {})
            case_work, source = _work(case)
            work.update(case_work)
            counted_by.add(source)
            for stage, keys in CASE_STAGES.items():
                stages[stage] += sum(float(timings.get(key) or 0.0) for key in keys)
            checks = case["checks"].values()
            stages["compare"] += sum(float(check.get("check_s") or 0.0) for check in checks)
            cached += any(check.get("cached_lowering") for check in checks)
            verdicts.update(check["verdict"] for check in checks)
    stages["compare"] += stages.pop("eager reference")
    return {
        "wall_s": wall,
        "exit_status": completed.returncode,
        "cases": cases,
        "cached_lowerings": cached,
        "verdicts": dict(sorted(verdicts.items())),
        "work": {stage: work[stage] for stage in WORK},
        # what a cold run must do at least: each card exported once, each card x quantized dtype quantized once
        "work_needed": {"export": len(cards), "quantize": len(quantized), "lower": cases},
        "work_counted_by": sorted(counted_by),
        "stages_s": stages,
    }


def _work(case: dict) -> tuple[dict[str, int], str]:
    """The case's exports, quantizations and lowerings in its run, and where the counts come from: the
    harness's own work field, or (a revision that has none) which stages have a time in this run."""
    if isinstance(case.get("work"), dict):
        return {stage: int(case["work"].get(stage, 0)) for stage in WORK}, "report work fields"
    timings = case.get("timings_s", {})
    return {stage: int(stage in timings) for stage in WORK}, "stage timings (no work fields in this revision)"


def against(rev: str, matrix: list[str], workers: str, rounds: int, output: Path) -> dict:
    """Cold runs of this checkout and of REV (in a temporary worktree), alternating, and warm runs of this one."""
    runs: dict[str, list[dict]] = {"head_cold": [], "rev_cold": [], "head_warm": []}
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    resolved = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise SystemExit(f"bench: --against {rev!r} is not a commit of this repository; give a commit, tag or branch")
    commit = resolved.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="qnnsuite-bench-") as scratch:  # mkdtemp: 0700
        root = Path(scratch)
        checkout = root / "rev"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(checkout), commit], check=True
        )
        try:
            for round_ in range(rounds):
                for kind, where in (("head_cold", REPO), ("rev_cold", checkout)):
                    folder = root / f"{kind}-{round_}"
                    runs[kind].append(run_suite(matrix, workers, folder / "cache", folder / "reports", where))
                    _say(round_, rounds, kind, runs[kind][-1])
                    if kind == "head_cold":
                        runs["head_warm"].append(run_suite(matrix, workers, folder / "cache", folder / "reports-warm"))
                        _say(round_, rounds, "head_warm", runs["head_warm"][-1])
                summary = _against_summary(rev, commit, matrix, workers, round_ + 1, started, runs)
                _write_against(output, summary)  # after every round: an interrupted benchmark keeps what it measured
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=False)
    return summary


def _say(round_: int, rounds: int, kind: str, run: dict) -> None:
    print(
        f"round {round_ + 1}/{rounds} {kind}: {run['wall_s']:.0f} s, {run['cases']} cases, work {run['work']}, "
        f"{run['verdicts']}",
        flush=True,
    )


def _against_summary(
    rev: str, commit: str, matrix: list[str], workers: str, rounds: int, started: str, runs: dict[str, list[dict]]
) -> dict:
    median = {kind: statistics.median(run["wall_s"] for run in found) for kind, found in runs.items()}
    ratios = {
        "rev_over_head_cold": median["rev_cold"] / median["head_cold"],
        "head_warm_over_cold": median["head_warm"] / median["head_cold"],
    }
    met = {
        "rev_over_head_cold": ratios["rev_over_head_cold"] >= AGAINST_SPEEDUP,
        "head_warm_over_cold": ratios["head_warm_over_cold"] <= TARGETS["warm_over_cold"][1],
        "work_once": all(run["work"] == run["work_needed"] for run in runs["head_cold"]),
    }
    return {
        "against": rev,
        "against_commit": commit,
        "matrix": shlex.join(matrix) or "default (pytest suites)",
        "workers": workers,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "started": started,
        "median_wall_s": median,
        "ratios": ratios,
        "targets_met": met,
        "runs": runs,
    }


def _write_against(output: Path, summary: dict) -> None:
    """Beside the default benchmark's figures in the same file, not over them."""
    try:
        data = json.loads(output.read_text())
    except (OSError, ValueError):
        data = {}
    data["against"] = summary
    output.write_text(json.dumps(data, indent=1) + "\n")


def _keep_against(output: Path, summary: dict) -> None:
    """The default benchmark rewrites the file but keeps an --against comparison recorded there."""
    try:
        previous = json.loads(output.read_text()).get("against")
    except (OSError, ValueError, AttributeError):
        previous = None
    if previous is not None:
        summary["against"] = previous


def against_table(summary: dict) -> str:
    median, ratios = summary["median_wall_s"], summary["ratios"]
    work = {kind: summary["runs"][kind][-1]["work"] for kind in summary["runs"]}
    rows = [
        f"| `{summary['matrix']}`, `-n {summary['workers']}` | median of {summary['rounds']} | exports / "
        f"quantizations / lowerings |",
        "| --- | --- | --- |",
    ]
    for kind, label in (
        ("head_cold", "this checkout, cold"),
        ("rev_cold", f"{summary['against']}, cold"),
        ("head_warm", "this checkout, warm"),
    ):
        rows.append(
            f"| {label} | {median[kind]:.0f} s | {work[kind]['export']} / {work[kind]['quantize']} / "
            f"{work[kind]['lower']} |"
        )
    met, mark = summary["targets_met"], {True: "met", False: "NOT met"}
    needed = summary["runs"]["head_cold"][-1]["work_needed"]
    rows += [
        f"| {summary['against']} / this (cold) | {ratios['rev_over_head_cold']:.2f}x | >= {AGAINST_SPEEDUP}x, "
        f"{mark[met['rev_over_head_cold']]} |",
        f"| warm / cold (this) | {ratios['head_warm_over_cold']:.2f} | <= {TARGETS['warm_over_cold'][1]}, "
        f"{mark[met['head_warm_over_cold']]} |",
        f"| work of a cold run here | {work['head_cold']['export']} / {work['head_cold']['quantize']} | "
        f"{needed['export']} cards / {needed['quantize']} card x quantized dtype, {mark[met['work_once']]} |",
    ]
    return "\n".join(rows)


def device_run(repeats: int) -> dict:
    """A cached case's device run: the compiled runner and the pybindings one (bench/device_run.py)."""
    completed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "device_run.py"), "--repeats", str(max(repeats, 10)), "--reference", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise SystemExit(f"device run benchmark failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def summarise(runs: dict[str, list[dict]], invocation: dict) -> dict:
    median = {kind: statistics.median(run["wall_s"] for run in runs[kind]) for kind in runs}
    stages = {
        stage: statistics.median(run["stages_s"][stage] for run in runs["cold_n1"])
        for stage in runs["cold_n1"][0]["stages_s"]
    }
    productive = sum(stages[stage] for stage in PRODUCTIVE) + stages["runner_exec"]
    measured = sum(seconds for stage, seconds in stages.items() if stage != "runner_exec")
    breakdown = {
        **stages,
        "other (start-up, collection, per-check bookkeeping, reports)": max(0.0, median["cold_n1"] - measured),
    }
    ratios = {
        "warm_over_cold": median["warm_nN"] / median["cold_nN"],
        "harness_overhead_over_cold_n1": max(0.0, median["cold_n1"] - productive) / median["cold_n1"],
        "speedup_nN_over_n1": median["cold_n1"] / median["cold_nN"],
        "device_run_s": invocation["suite_runner"]["median_s"],
    }
    met = {
        name: (value <= TARGETS[name][1]) if TARGETS[name][0] == "<=" else (value >= TARGETS[name][1])
        for name, value in ratios.items()
    }
    return {"median_wall_s": median, "cold_n1_breakdown_s": breakdown, "ratios": ratios, "targets_met": met}


def table(summary: dict, workers: str) -> str:
    median, ratios, met = summary["median_wall_s"], summary["ratios"], summary["targets_met"]
    invocation = summary["device_run"]
    mark = {True: "met", False: "NOT met"}
    rows = [
        f"| measure | median of {summary['repeats']} | target |",
        "| --- | --- | --- |",
        f"| cold run, `-n 1` | {median['cold_n1']:.0f} s | |",
        f"| cold run, `-n {workers}` | {median['cold_nN']:.0f} s | |",
        f"| warm run, `-n {workers}` | {median['warm_nN']:.0f} s | |",
        f"| warm / cold (`-n {workers}`) | {ratios['warm_over_cold']:.2f} | <= {TARGETS['warm_over_cold'][1]}, {mark[met['warm_over_cold']]} |",
        f"| harness overhead / cold (`-n 1`) | {ratios['harness_overhead_over_cold_n1']:.2f} | <= {TARGETS['harness_overhead_over_cold_n1'][1]}, "
        f"{mark[met['harness_overhead_over_cold_n1']]} |",
        f"| speed-up `-n {workers}` over `-n 1` (cold) | {ratios['speedup_nN_over_n1']:.2f}x | >= 1.6x, "
        f"{mark[met['speedup_nN_over_n1']]} |",
        f"| a cached case's device run, compiled runner (pybindings runner: "
        f"{invocation['qnn_executor_runner']['median_s']:.2f} s) | {ratios['device_run_s']:.2f} s | <= 0.5 s, "
        f"{mark[met['device_run_s']]} |",
        "",
        "| cold `-n 1` run, per stage (summed over cases) | seconds | share |",
        "| --- | --- | --- |",
    ]
    total = median["cold_n1"]
    for stage, seconds in summary["cold_n1_breakdown_s"].items():
        label = "(of which the runner's own execution)" if stage == "runner_exec" else stage
        rows.append(f"| {label} | {seconds:.1f} | {seconds / total:.0%} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="auto", help="-n for the parallel runs (default auto)")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results.json")
    parser.add_argument("--against", metavar="REV", help="compare cold runs with those of git revision REV")
    parser.add_argument("matrix", nargs=argparse.REMAINDER, help="after --: pytest selection arguments")
    args = parser.parse_args()
    matrix = [arg for arg in args.matrix if arg != "--"]
    if args.against:
        print(against_table(against(args.against, matrix, args.workers, args.repeats, args.output)))
        return

    runs: dict[str, list[dict]] = {"cold_n1": [], "cold_nN": [], "warm_nN": []}
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    invocation = device_run(args.repeats)
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            for kind, workers, cache in (
                ("cold_n1", "1", "cache1"),
                ("cold_nN", args.workers, "cacheN"),
                ("warm_nN", args.workers, "cacheN"),
            ):
                runs[kind].append(run_suite(matrix, workers, root / cache, root / f"reports-{kind}"))
                print(
                    f"repeat {repeat + 1}/{args.repeats} {kind}: {runs[kind][-1]['wall_s']:.0f} s, "
                    f"{runs[kind][-1]['cases']} cases, {runs[kind][-1]['verdicts']}",
                    flush=True,
                )
        # Written after every repeat: an interrupted benchmark keeps what it measured.
        summary = {
            "matrix": shlex.join(matrix) or "default (pytest suites)",
            "repeats": repeat + 1,
            "workers": args.workers,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "started": started,
            "cases": runs["cold_n1"][0]["cases"],
            **summarise(runs, invocation),
            "device_run": invocation,
            "runs": runs,
        }
        _keep_against(args.output, summary)
        args.output.write_text(json.dumps(summary, indent=1) + "\n")
    print(table(summary, args.workers))


if __name__ == "__main__":
    main()
