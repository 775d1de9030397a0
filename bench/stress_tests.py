"""Stress of the timing-sensitive harness tests: the device, emulator, reliability and fault tests run N times
under a concurrent CPU load, and every failure is reported with its test id and run.

    .venv/bin/python bench/stress_tests.py [--runs 5] [--load suite|cpu|none] [--workers 2] [-- TEST PATHS]

Why: the test command is what gates a submission, and a test that fails by chance on a loaded machine (a fault
switch that lost a race to the runner, a fixed sleep before an assert) blocks a landing as surely as a real
defect. A single green run proves little about such races; this runs them repeatedly with the machine busy.

The load: `suite` (default) keeps a cold default suite run going beside the tests (restarted when it ends,
its reports and artifact cache in a private temporary folder), as on a developer's machine or a CI host
shared with a nightly; `cpu` keeps one busy process per core; `none` runs the tests alone. Each run is
`pytest -n WORKERS --dist loadfile` over the paths (default: harness/tests/device, harness/tests/emulator,
harness/tests/faults/test_faults.py), as the README's test command runs them, with a JUnit file read for the failed
test ids. The load's processes are one process group, killed at the end whatever happens. Results go to
bench/stress-results.json (per run: wall time, counts, failed ids) and a summary is printed; the exit code
is 1 if any run had a failure, 130 if Ctrl-C stopped it first (the runs made are summed up and kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PATHS = ("harness/tests/device", "harness/tests/emulator", "harness/tests/faults/test_faults.py")
RESULTS = REPO / "bench" / "stress-results.json"


@contextlib.contextmanager
def load(kind: str, scratch: Path) -> Iterator[None]:
    """The concurrent load for the duration of the block: its processes in one group, killed on the way out."""
    if kind == "none":
        yield
        return
    if kind == "cpu":
        burn = "import os\nwhile True: pass\n"
        command = [sys.executable, "-c", f"import os\nfor _ in range({os.cpu_count() or 1} - 1): os.fork()\n{burn}"]
    else:  # a default suite run, cold, again and again
        suite = f"{REPO / 'harness' / 'run.sh'} suite --no-cache --report-dir {scratch / 'reports'} -q"
        command = ["/bin/sh", "-c", f"while true; do {suite} >/dev/null 2>&1; done"]
    process = subprocess.Popen(command, cwd=REPO, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def failures_of(junit: Path) -> tuple[dict[str, int], list[str]]:
    """Counts and the ids of failed or errored tests from pytest's JUnit file (data: parsed, never run)."""
    if not junit.is_file():
        return {"tests": 0, "failures": 0, "errors": 1, "skipped": 0}, ["(no JUnit file: pytest did not finish)"]
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname', '')}::{case.get('name', '')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return counts, failed


def one_run(paths: list[str], workers: int, scratch: Path, index: int) -> tuple[dict, dict]:
    """One pytest run over the paths; its wall time, counts and failed test ids."""
    junit = scratch / f"junit-{index}.xml"
    command = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "--junitxml", str(junit)]
    command += ["-n", str(workers), "--dist", "loadfile"] if workers > 0 else []
    started = time.monotonic()
    finished = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    counts, failed = failures_of(junit)
    tail = finished.stdout.strip().splitlines()[-1:] if finished.stdout.strip() else []
    return {"run": index, "seconds": round(time.monotonic() - started, 1), "exit": finished.returncode, **counts}, {
        "failed": failed,
        "last_line": tail[0] if tail else "",
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", choices=("suite", "cpu", "none"), default="suite")
    parser.add_argument("--workers", type=int, default=2, help="pytest -n (0: no xdist)")
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS))
    options = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="qnnsuite-stress-") as scratch_name:  # 0700: mkdtemp's mode
        scratch = Path(scratch_name)
        with load(options.load, scratch), contextlib.suppress(KeyboardInterrupt):
            for index in range(1, options.runs + 1):
                summary, detail = one_run(options.paths, options.workers, scratch, index)
                runs.append({**summary, **detail})
                print(
                    f"run {index}/{options.runs}: {summary['tests']} tests, {summary['failures']} failed, "
                    f"{summary['errors']} errors in {summary['seconds']} s (load: {options.load}, "
                    f"load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                for test_id in detail["failed"]:
                    print(f"  FAILED {test_id}", flush=True)
                RESULTS.write_text(json.dumps({"load": options.load, "paths": options.paths, "runs": runs}, indent=1))
    failed = [(run["run"], test_id) for run in runs for test_id in run["failed"]]
    stopped = f" (interrupted: {options.runs - len(runs)} run(s) not made)" if len(runs) < options.runs else ""
    print(f"{len(runs)} runs, {len(failed)} failures{stopped}" + "".join(f"\n  run {r}: {t}" for r, t in failed))
    return 1 if failed else 130 if stopped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
