"""Nightly gating end to end: a real suite run against a baseline report.

An identical run passes the gate; a baseline in which a now-failing check had passed (an injected
regression) fails it and names exactly that case; so does a known failure that now passes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", "counter_ones_init or kv_gather_written and not pair"]


def _suite(reports: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q", "-W", "ignore", *SELECTION,
               "--cache-dir", str(cache), "--report-dir", str(reports), *extra]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "300"})


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gating")
    completed = _suite(root / "baseline", root / "cache")
    assert completed.returncode == 0, completed.stdout[-3000:]
    report = root / "baseline" / "latest" / "SM8650" / "report.json"
    return root, json.loads(report.read_text())


def _write_baseline(path: Path, document: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "report.json").write_text(json.dumps(document))
    return path / "report.json"


def test_identical_run_passes_the_gate(baseline_run):
    root, document = baseline_run
    baseline = _write_baseline(root / "same", document)
    completed = _suite(root / "again", root / "cache", "--baseline", str(baseline))
    assert completed.returncode == 0, completed.stdout[-3000:]
    assert "no regressions" in completed.stdout


def test_injected_regression_and_fixed_known_failure_fail_the_gate(baseline_run):
    root, document = baseline_run
    edited = json.loads(json.dumps(document))
    by_id = {case["case_id"]: case for case in edited["cases"]}
    # Pretend the known failure had passed before (a regression now) ...
    known = by_id["counter_ones_init-fp16-delegate_mutbuf-SM8650"]["checks"]["initial_state"]
    assert known["verdict"] == "xfailed"
    known["verdict"], known["known_failure"] = "passed", ""
    # ... and that a passing check was a known failure before (it now passes).
    fixed = by_id["kv_gather_written-fp16-skip_mutbuf-SM8650"]["checks"]["state"]
    assert fixed["verdict"] == "passed"
    fixed["verdict"], fixed["known_failure"] = "xfailed", "an old defect"
    baseline = _write_baseline(root / "edited", edited)
    completed = _suite(root / "gated", root / "cache", "--baseline", str(baseline))
    assert completed.returncode == pytest.ExitCode.TESTS_FAILED, completed.stdout[-3000:]
    gate_lines = [line.strip() for line in completed.stdout.splitlines() if line.startswith("  ")]
    named = [line for line in gate_lines if "SM8650" in line]
    assert len(named) == 2, completed.stdout[-3000:]
    assert any("counter_ones_init-fp16-delegate_mutbuf-SM8650" in line and "initial_state" in line for line in named)
    assert any("kv_gather_written-fp16-skip_mutbuf-SM8650" in line and "state" in line for line in named)
