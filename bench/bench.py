"""Benchmark of the suite's own cost: cold vs warm runs, -n 1 vs -n N, and where the time goes.

    .venv/bin/python bench/bench.py [--repeats 3] [--workers 2] [-- PYTEST SELECTION ARGS]

Each measurement is a real `pytest suites` run on emulated devices; the numbers are medians over
--repeats runs. Times are for this machine; the ratios are what the targets (README) are about:
  warm / cold wall            <= 0.25   (lowered artifacts reused from the content-keyed cache)
  harness overhead / cold     <= 0.10   (all but export, quantize, lower and the runner's execution)
  cold -n 1 / cold -n N       >= 1.6    (N = 2 on 2 cores)
  runner invocation: fresh process / runner server >= 5
Writes bench/results.json and prints a Markdown table for the README.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A slice of the default matrix small enough to repeat: the full one takes ~30 min per cold run here.
DEFAULT_MATRIX = ["--soc", "SM8650", "--dtype", "fp16", "--dtype", "16a8w",
                  "-k", "kv_index_copy_dim1 or kv_gather_written or counter_add or causal_mask"]
STAGES = ("export", "quantize", "lower", "runner_exec")


def run_suite(matrix: list[str], workers: int, cache_dir: Path, report_dir: Path) -> dict:
    """One suite run; returns its wall time and the per-stage sums read from its report.json files."""
    command = [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q", "-W", "ignore",
               "--cache-dir", str(cache_dir), "--report-dir", str(report_dir), *matrix]
    if workers > 1:
        command += ["-n", str(workers)]
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if completed.returncode not in (0, 1):  # 1: the suite found failures, which is its job
        raise SystemExit(f"suite run failed ({completed.returncode}):\n{completed.stdout[-3000:]}{completed.stderr[-2000:]}")
    stages = {stage: 0.0 for stage in STAGES}
    cases = 0
    for report in (report_dir / "latest").glob("*/report.json"):
        for case in json.loads(report.read_text())["cases"]:
            cases += 1
            timings = case.get("timings_s", {})
            for stage in STAGES:
                stages[stage] += float(timings.get(stage, 0.0) or 0.0)
    return {"wall_s": wall, "cases": cases, "stages_s": stages}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def runner_invocation(repeats: int) -> dict:
    """Fresh-process runner vs runner server (bench/runner_invocation.py)."""
    completed = subprocess.run([sys.executable, str(REPO / "bench" / "runner_invocation.py"), "--repeats", str(max(repeats, 5))],
                               cwd=REPO, capture_output=True, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"runner invocation benchmark failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("matrix", nargs=argparse.REMAINDER, help="after --: pytest selection arguments")
    args = parser.parse_args()
    matrix = [arg for arg in args.matrix if arg != "--"] or DEFAULT_MATRIX

    results: dict[str, list[dict]] = {"cold_n1": [], "cold_nN": [], "warm_nN": []}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            results["cold_n1"].append(run_suite(matrix, 1, root / "cache1", root / "reports1"))
            results["cold_nN"].append(run_suite(matrix, args.workers, root / "cacheN", root / "reportsN"))
            results["warm_nN"].append(run_suite(matrix, args.workers, root / "cacheN", root / "reportsN2"))
        print(f"repeat {repeat + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]['wall_s']:.0f} s" for k, v in results.items()), flush=True)

    cold, cold_n1, warm = (median_of(results[k], "wall_s") for k in ("cold_nN", "cold_n1", "warm_nN"))
    cold_stages = {stage: statistics.median(run["stages_s"][stage] for run in results["cold_n1"]) for stage in STAGES}
    productive = sum(cold_stages.values())
    overhead = max(0.0, cold_n1 - productive)
    summary = {
        "matrix": shlex.join(matrix), "repeats": args.repeats, "workers": args.workers,
        "cases": results["cold_n1"][0]["cases"],
        "median_wall_s": {"cold_n1": cold_n1, "cold_nN": cold, "warm_nN": warm},
        "cold_n1_stages_s": cold_stages,
        "ratios": {"warm_over_cold": warm / cold, "harness_overhead_over_cold_n1": overhead / cold_n1,
                   "speedup_nN_over_n1": cold_n1 / cold},
        "runner_invocation": runner_invocation(args.repeats),
        "runs": results,
    }
    (REPO / "bench" / "results.json").write_text(json.dumps(summary, indent=1))
    print("\n| measure | median | target |\n|---|---|---|")
    print(f"| cold run, -n 1 | {cold_n1:.0f} s | |")
    print(f"| cold run, -n {args.workers} | {cold:.0f} s | |")
    print(f"| warm run, -n {args.workers} | {warm:.0f} s | |")
    print(f"| warm / cold | {warm / cold:.2f} | <= 0.25 |")
    print(f"| harness overhead / cold (-n 1) | {overhead / cold_n1:.2f} | <= 0.10 |")
    print(f"| speed-up -n {args.workers} vs -n 1 | {cold_n1 / cold:.2f}x | >= 1.6x |")
    invocation = summary["runner_invocation"]
    print(f"| runner invocation: fresh process {invocation['fresh_process_s']:.2f} s, server "
          f"{invocation['runner_server_s']:.2f} s | {invocation['ratio']:.1f}x | >= 5x |")


if __name__ == "__main__":
    main()
