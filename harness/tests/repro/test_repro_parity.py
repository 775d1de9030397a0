"""A reproduction bundle of a runner_parity case judges runner_parity: the suite made the case's reference run
(qnn_executor_runner) before judging and the bundle carries it (case.json's reference_run, device/reference/);
the bundle's repro.py, alone in an empty folder, runs the steps through both runners on the simulator and
judges the check with the suite's own code. Where it cannot feed the check (no compiler, so the compiled
runner is not there), it says "not measured", never "pass now".
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.qnn.toolchain import prepare
from harness.repro import layout
from harness.tests.child_suite import run_suite

pytestmark = [pytest.mark.qnn, pytest.mark.child_suite]

CASE = "kv_pair_gather_written-fp16-delegate_mutbuf-SM8650"  # runner_parity's first card (checks.PARITY_CARDS)
SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", f"runner_parity and {CASE}", "--repro-all"]
QUIET = ["-W", "ignore"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repro_parity")
    reports = ["--cache-dir", str(root / "cache"), "--report-dir", str(root / "reports")]
    suite = run_suite(*QUIET, *SELECTION, *reports)
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    return (root / "reports" / "latest").resolve() / "SM8650" / layout.REPRO_DIR / CASE


def _run_alone(bundle: Path, into: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The bundle copied into an empty folder, its repro.py run there on the bundle's program, the harness
    not importable (no PYTHONPATH)."""
    shutil.copytree(bundle, into)
    env = {**prepare().child_env(), **(extra_env or {})}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "repro.py", "--pte", "model.pte"],
        cwd=into,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_bundle_carries_the_reference_run(bundle):
    case = json.loads((bundle / layout.CASE_FILE).read_text())
    assert case["checks"]["runner_parity"]["verdict"] == "passed"
    assert case["reference_run"]["runner"] == "qnn_executor_runner" and case["reference_run"]["error"] == ""
    assert (bundle / "device" / "reference" / "output_0_0.raw").is_file()
    assert (bundle / "device" / "reference" / "output_0_0.raw").read_bytes() == (
        bundle / "device" / "output_0_0.raw"
    ).read_bytes(), "the two runners' outputs the suite compared"


def test_the_bundle_judges_runner_parity(bundle, tmp_path):
    completed = _run_alone(bundle, tmp_path / "empty")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "runner_parity: PASSED  (as recorded)" in completed.stdout.splitlines()
    assert "verdict: NOT REPRODUCED (every check passes)" in completed.stdout.splitlines()
    out = tmp_path / "empty" / "repro-out"
    assert "step 0 method forward execute_us " in (out / "runner.log").read_text(), "the compiled runner ran it"
    assert (out / "reference" / "output_0_0.raw").is_file(), "and the reference runner, for the check"


def test_a_bundle_that_cannot_feed_runner_parity_says_not_measured(bundle, tmp_path):
    completed = _run_alone(bundle, tmp_path / "empty", {"CXX": str(tmp_path / "no-g++")})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert any(line.startswith("runner_parity: NOT_MEASURED ") for line in lines), completed.stdout[-2000:]
    assert "verdict: NOT REPRODUCED (runner_parity not measured)" in lines
    assert not any("pass" in line for line in lines if line.startswith("verdict:"))
