"""Emulated runner invocation: a fresh `python -m harness.emulator.host_runner` vs the runner server.

Prints one JSON line: medians of --repeats runs of the same lowered .pte and inputs, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fixtures import zoo  # noqa: E402,F401  (registers the cards)
from harness.device.execute import write_inputs  # noqa: E402
from harness.pipeline import card  # noqa: E402
from harness.pipeline.lower import lower_case  # noqa: E402
from harness.process.fork_server import start_server, stop_server  # noqa: E402
from harness.process.services import RUNNER  # noqa: E402
from harness.qnn.toolchain import prepare  # noqa: E402
from harness.vocabulary import Case, Mode  # noqa: E402


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    toolchain = prepare()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        kv = card.find("fixtures.zoo:kv_gather_written")
        artifact = lower_case(Case(kv, "fp16", Mode.DELEGATE, "SM8650"), toolchain, root / "artifact", 4)
        rows = write_inputs(kv.steps(4), root)
        (root / "inputs.txt").write_text("".join(" ".join(p.name for p in row) + "\n" for row in rows))
        env = {**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}
        flags = ["--model_path", str(artifact.pte), "--input_list_path", "inputs.txt", "--output_folder_path", "out"]
        fresh = [
            timed([sys.executable, "-m", "harness.emulator.host_runner", *flags], root, env)
            for _ in range(args.repeats)
        ]
        server = start_server(RUNNER, root / "runner.sock", env)
        try:
            served_env = {**env, "QNNSUITE_RUNNER_SOCKET": str(root / "runner.sock")}
            served = [
                timed([sys.executable, "-m", "harness.emulator.runner_client", *flags], root, served_env)
                for _ in range(args.repeats)
            ]
        finally:
            stop_server(server)
    fresh_s, served_s = statistics.median(fresh), statistics.median(served)
    print(json.dumps({"fresh_process_s": fresh_s, "runner_server_s": served_s, "ratio": fresh_s / served_s}))


if __name__ == "__main__":
    main()
