"""A cached case's device run on an emulated device: the compiled runner vs the pybindings runner (issue 31).

    .venv/bin/python bench/device_run.py [--repeats 50] [--reference N] [--card fixtures.zoo:counter_add]
        [--dtype fp16]

One emulated SM8650 device on the fleet's private adb server, started as a run starts it (the toolchain's
environment, the heap settings); the case is lowered once, then run on the device through the device
layer's run_case, alternating runner="suite_runner" (the suite's compiled runner, a fresh process in the
device's jail) and runner="qnn_executor_runner" (the pybindings runner, a fresh Python in the jail: --reference
runs of it, default --repeats, as each costs seconds). Each sample is run_case's wall time: push of the program
and inputs, the runner, the pull of the outputs and trace, i.e. a cached case's device run. The first run of
each is left out (the payload's first push). Before the compiled runner the pybindings runner ran in a child
forked from a per-device runner server; that comparison, made with this script, is in docs/PERFORMANCE.md. Prints one JSON line with the medians and percentiles; not a
timed test (the machine's speed varies too much for a bound in a test: docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures import zoo  # noqa: E402,F401  (registers the cards)
from harness.device import kinds  # noqa: E402
from harness.device.adb import AdbClient  # noqa: E402
from harness.device.device import Device  # noqa: E402
from harness.device.execute import Workspace, prepare_workspace, run_case  # noqa: E402
from harness.device.payload import RUNNER_COMMANDS, RUNNER_NAME, SUITE_RUNNER_NAME  # noqa: E402
from harness.emulator.launcher import EmulatorFleet  # noqa: E402
from harness.pipeline import card  # noqa: E402
from harness.pipeline.lower import lower_case  # noqa: E402
from harness.qnn.toolchain import prepare  # noqa: E402
from harness.vocabulary import Case, Mode  # noqa: E402

STEPS = 4
SOC = "SM8650"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--reference", type=int, help="runs of the pybindings runner (default: --repeats)")
    parser.add_argument("--card", default="fixtures.zoo:counter_add")
    parser.add_argument("--dtype", default="fp16")
    args = parser.parse_args()
    toolchain = prepare()
    chosen = card.find(args.card)
    with tempfile.TemporaryDirectory(prefix="qnnsuite-bench-") as scratch:
        root = Path(scratch)
        artifact = lower_case(Case(chosen, args.dtype, Mode.DELEGATE, SOC), toolchain, root / "artifact", STEPS)
        assert artifact.ok, artifact.failure
        device_env = {**kinds.EmulatedKind.heap_environment(toolchain.child_env()), "QNNSUITE_PYTHON": sys.executable}
        with EmulatorFleet([SOC], root / "fleet", device_env=device_env) as fleet:
            device = Device(fleet.devices[0].serial, AdbClient(server=fleet.server))
            payload = device.workspace("payload")
            files = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(toolchain.sdk))
            prepare_workspace(device, payload, files)
            runners = tuple(item.remote_name for item in files if item.remote_name in RUNNER_COMMANDS)
            assert SUITE_RUNNER_NAME in runners, "the suite's runner was not built: see harness/runner/build.py"
            workspace = Workspace(device.workspace("cases"), payload, runners=runners)
            steps = chosen.steps(STEPS)
            samples: dict[str, list[float]] = {SUITE_RUNNER_NAME: [], RUNNER_NAME: []}
            stages: dict[str, dict[str, list[float]]] = {runner: {} for runner in samples}
            for index in range(args.repeats + 1):
                for runner in samples:
                    if runner == RUNNER_NAME and index > (args.reference or args.repeats):
                        continue
                    started = time.perf_counter()
                    run = run_case(
                        device,
                        workspace,
                        f"{runner}-{index}",
                        artifact.pte,
                        steps,
                        root / "runs" / runner / str(index),
                        output_count=1,
                        runner=runner,
                    )
                    elapsed = time.perf_counter() - started
                    assert run.runner == runner and len(run.outputs) == STEPS
                    if index:  # the first: the workspace's first use
                        samples[runner].append(elapsed)
                        for stage, seconds in run.timings_s.items():
                            stages[runner].setdefault(stage, []).append(seconds)
    summary = {
        "card": args.card,
        "dtype": args.dtype,
        "repeats": args.repeats,
        **{
            runner: {
                "median_s": round(statistics.median(values), 4),
                "p10_s": round(percentile(values, 0.1), 4),
                "p90_s": round(percentile(values, 0.9), 4),
                **{f"{stage}_median_s": round(statistics.median(times), 4) for stage, times in stages[runner].items()},
            }
            for runner, values in samples.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
