"""The performance gates' sensitivity on this machine (issue 47): which injected slowdowns the timing gate
catches, how often it cries wolf on clean reruns, and whether the structural gate sees lowering changes.

    .venv/bin/python bench/perf_sensitivity.py [--soc SM8650] [-k counter_add] [--dtype fp16] [--repeats 4]
        [--clean 1] [--slowdowns 1ms,2ms,5ms,20ms,25%,50%] [--rounds 5] [--structural] [--out results.json]

Timing: one baseline suite run of the selection (`--perf-repeats`, on an emulated device, the user's artifact
cache so only the first run lowers), then per round `--clean` runs of the same code against it and one run
per slowdown with the emulated runner_slow_execute switch on the delegated mode's executes (N ms, or N% of the
execute's own time, added to each execute's time, docs/FAULTS.md), each with `--baseline --perf-gate`. Rounds
alternate clean and slowed runs, so the machine's drift over the hour falls on both; the skip-mode twin, never
slowed, is one more clean comparison in every run. With --perf-repeats of 2 or more the repeats run beside the
interleaved reference program and the gate judges the ratio (harness/report/perf_gate.py). Per run it keeps every case's timing
verdict (gate.json `performance`: verdict, growth, noise band, smallest detectable change, reason), the exit
code and the load average before and after (the machine's state is part of the result).
Structural (--structural): counter_add fp16 lowered once and five times more clean, and five times per injected
lowering change (harness/tests/pipeline/injected_lowering.py), each gated against the first clean lowering.
Prints one line per run and writes the JSON to --out; docs/PERFORMANCE.md shows what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DELEGATED = "delegate_mutbuf"
TIMING_KEPT = ("repeats_p50_us", "repeats_min_us", "drift_reference")


def slowdown_switch(slowdown: str) -> dict:
    """runner_slow_execute's setting for "5ms" or "25%" ({}: "0", a clean run)."""
    if slowdown.endswith("%"):
        return {"pct": int(slowdown[:-1])}
    milliseconds = int(slowdown.removesuffix("ms"))
    return {"ms": milliseconds} if milliseconds else {}


def suite(soc: str, select: str, dtype: str, repeats: int, reports: Path, *extra: str, slowdown: str = "0") -> dict:
    """One suite run; returns its exit code, wall time, load averages and the gate's performance entries."""
    command = [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q", "-W", "ignore"]
    command += ["--emulate", soc, "--dtype", dtype, "-k", select, "--perf-repeats", str(repeats)]
    command += ["--report-dir", str(reports), *extra]
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("QNNSUITE_EMULATOR_FAULTS", None)
    if switch := slowdown_switch(slowdown):
        env["QNNSUITE_EMULATOR_FAULTS"] = json.dumps({soc: {"runner_slow_execute": {**switch, "match": DELEGATED}}})
    load_before, started = os.getloadavg()[0], time.perf_counter()
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    result = {
        "exit": completed.returncode,
        "wall_s": round(time.perf_counter() - started, 1),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
    }
    gate = reports / "latest" / soc / "gate.json"
    result["performance"] = json.loads(gate.read_text())["performance"] if gate.is_file() else []
    report = reports / "latest" / soc / "report.json"
    if report.is_file():  # each case's timing as measured, so another rule can be tried on the same runs
        result["timing"] = {
            case["case_id"]: {key: (case["timing"] or {}).get(key) for key in ("steps_us", *TIMING_KEPT)}
            for case in json.loads(report.read_text())["cases"]
        }
    else:
        result["tail"] = (completed.stdout + completed.stderr)[-2000:]
    return result


def timing_curve(args: argparse.Namespace, root: Path) -> dict:
    """The baseline, then the rounds; what ran so far is kept beside --out after each run (a long bench)."""
    partial = args.out.with_suffix(".partial.json")
    baseline = suite(args.soc, args.k, args.dtype, args.repeats, root / "baseline")
    print(f"baseline: exit {baseline['exit']} in {baseline['wall_s']} s, load {baseline['load_before']}", flush=True)
    runs = []
    for round_index in range(args.rounds):
        plan = ["0"] * args.clean + args.slowdowns.split(",")
        for index, slowdown in enumerate(plan):
            reports = root / f"round{round_index}-{index}-{slowdown.replace('%', 'pct')}"
            extra = ("--baseline", str(root / "baseline" / "latest"), "--perf-gate")
            run = {
                "round": round_index,
                "slowdown": slowdown,
                **suite(args.soc, args.k, args.dtype, args.repeats, reports, *extra, slowdown=slowdown),
            }
            runs.append(run)
            partial.write_text(json.dumps({"baseline": baseline, "runs": runs}, indent=1) + "\n")
            said = ", ".join(
                f"{e['case_id'].split('-')[2]} {e['verdict']} {e['growth_pct']:+.0f}% (band {e['noise_band_pct']:.0f}%"
                f"{', ratio' if e['statistic'] == 'drift_reference' else ''})"
                for e in run["performance"]
            )
            print(f"{slowdown}: exit {run['exit']} load {run['load_before']}-{run['load_after']}: {said}", flush=True)
    return {"baseline": baseline, "runs": runs}


def structural(root: Path, runs: int = 5) -> dict:
    """A clean lowering and `runs` clean reruns, and each injection lowered `runs` times, each gated against
    the first clean lowering of its mode (verdict and line each): the must-show is a FAIL naming the op and the
    graph on every injected run and no change on any clean rerun."""
    from fixtures import zoo  # noqa: F401  (registers the cards)
    from harness.qnn.toolchain import prepare
    from harness.report.structure_gate import StructureVerdict, facts_of, judge
    from harness.tests.pipeline import test_structure_facts as lowerings
    from harness.vocabulary import Mode

    toolchain = prepare()
    clean = [(f"clean{n}", Mode.DELEGATE) for n in range(runs + 1)] + [("clean_skip", Mode.SKIP)]
    found = lowerings._lower(toolchain, root / "clean", "clean", clean)
    transposed = [(f"transpose_pair{n}", Mode.DELEGATE) for n in range(runs)]
    found |= lowerings._lower(toolchain, root / "transpose", "transpose_pair", transposed)
    found |= lowerings._lower(
        toolchain, root / "cpu", "mul_on_cpu", [(f"mul_on_cpu{n}", Mode.SKIP) for n in range(runs)]
    )
    pairs = [("clean0", f"clean{n}") for n in range(1, runs + 1)]
    pairs += [("clean0", f"transpose_pair{n}") for n in range(runs)]
    pairs += [("clean_skip", f"mul_on_cpu{n}") for n in range(runs)]
    results = []
    for before, after in pairs:
        verdict, changes = judge(facts_of(found[before]), facts_of(found[after]))
        line = StructureVerdict("SM8650", f"{before} -> {after}", verdict, changes).line()
        results.append({"before": before, "after": after, "verdict": verdict, "line": line})
        print(line, flush=True)
    return {"pairs": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soc", default="SM8650")
    parser.add_argument("-k", default="counter_add")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--clean", type=int, default=1, help="clean runs per round")
    parser.add_argument("--slowdowns", default="1ms,2ms,5ms,20ms,25%,50%", help="per round, e.g. 5ms or 25%%")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--structural", action="store_true")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "perf_sensitivity-results.json")
    args = parser.parse_args()
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="qnnsuite-sensitivity-") as folder:
        if args.structural:
            results["structural"] = structural(Path(folder) / "structural")
        if not args.no_timing:
            results["timing"] = timing_curve(args, Path(folder))
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
