"""The performance gate on real runs of emulated devices (about 2-3 minutes).

Three child `pytest suites` runs of one card on one emulated SM8650, fp16, both buffer modes, each with
`--perf-repeats 3`: a baseline, the same selection again (it must pass `--perf-gate`: no false alarm on this
noisy machine), and one with the emulated slowdown switch on the delegated mode's executes (runner_slow_execute,
docs/FAULTS.md), whose gate must fail naming exactly the delegated case. They share the user's artifact cache
(the default --cache-dir), so only the first run ever lowers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.report.perf_gate import FAIL, PASS, WARN
from harness.tests.child_suite import run_suite

SOC, CARD = "SM8650", "counter_add"
SLOWED = f"{CARD}-fp16-delegate_mutbuf-{SOC}"
UNTOUCHED = f"{CARD}-fp16-skip_mutbuf-{SOC}"
SLOWDOWN_MS = 200  # per execute: well beyond the simulator's noise here (steps of 0.3 to 40 ms)


def _suite(reports: Path, *extra: str, faults: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("QNNSUITE_EMULATOR_FAULTS", None)
    if faults:
        env["QNNSUITE_EMULATOR_FAULTS"] = json.dumps({SOC: faults})
    return run_suite(
        *("-W", "ignore", "--emulate", SOC, "--dtype", "fp16", "-k", CARD, "--perf-repeats", "3"),
        *("--report-dir", str(reports), *extra),
        env=env,
        timeout=600,
    )


def _gate(reports: Path) -> dict:
    return json.loads((reports / "latest" / SOC / "gate.json").read_text())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    reports = tmp_path_factory.mktemp("baseline")
    completed = _suite(reports)
    assert (reports / "latest" / SOC / "report.json").is_file(), (completed.stdout + completed.stderr)[-3000:]
    return reports / "latest"


@pytest.mark.child_suite
def test_the_same_selection_again_passes_the_performance_gate(baseline, tmp_path):
    reports = tmp_path / "reports"
    completed = _suite(reports, "--baseline", str(baseline), "--perf-gate")
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    performance = _gate(reports)["performance"]
    assert {entry["case_id"] for entry in performance} == {SLOWED, UNTOUCHED}, performance
    assert {entry["verdict"] for entry in performance} <= {PASS, WARN}, performance
    assert "no regressions; performance: " in output and "FAIL" not in output.split("performance: ", 1)[1][:60]
    report = json.loads((reports / "latest" / SOC / "report.json").read_text())
    assert all(len(case["timing"]["repeats_p50_us"]) == 3 for case in report["cases"]), "every repeat measured"


@pytest.mark.child_suite
def test_a_slowed_mode_fails_the_performance_gate_naming_exactly_its_cases(baseline, tmp_path):
    reports = tmp_path / "reports"
    slowdown = {"runner_slow_execute": {"ms": SLOWDOWN_MS, "match": "delegate_mutbuf"}}
    completed = _suite(reports, "--baseline", str(baseline), "--perf-gate", faults=slowdown)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output[-3000:]
    gate = _gate(reports)
    assert gate["ok"] is False and gate["checks"] == [], "only the performance gate fails: the checks still pass"
    assert [e["case_id"] for e in gate["performance"] if e["verdict"] == FAIL] == [SLOWED], gate["performance"]
    assert f"performance FAIL: {SOC} {SLOWED} fastest step" in output
    assert f"performance FAIL: {SOC} {UNTOUCHED}" not in output
    summary = (reports / "latest" / SOC / "summary.md").read_text()
    assert f"performance FAIL: {SOC} {SLOWED}" in summary
    slowed = next(
        c for c in json.loads((reports / "latest" / SOC / "report.json").read_text())["cases"] if c["case_id"] == SLOWED
    )
    assert min(slowed["timing"]["repeats_p50_us"]) >= SLOWDOWN_MS * 1000, "the sleep is counted in execute_us"
    twin = next(
        c
        for c in json.loads((reports / "latest" / SOC / "report.json").read_text())["cases"]
        if c["case_id"] == UNTOUCHED
    )
    assert min(twin["timing"]["repeats_p50_us"]) < SLOWDOWN_MS * 1000, "the other mode is not slowed"
