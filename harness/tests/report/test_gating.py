"""Nightly gating end to end: a real suite run against a baseline report.

An identical run passes the gate; a baseline in which a now-failing check had passed (an injected
regression) fails it and names exactly that case; so does a known failure that now passes, a failing check
the baseline does not have, and a baseline check this run lacks (unless --allow-missing). The baseline is
read before the run writes anything, so `--baseline reports/latest` is the previous run, not this one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.tests.child_suite import run_suite

SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", "counter_ones_init or kv_gather_written and not pair"]


def _suite(
    reports: Path, cache: Path, *extra: str, faults: dict | None = None, selection: list[str] = SELECTION
) -> subprocess.CompletedProcess:
    return run_suite(
        *("-W", "ignore", *selection, "--cache-dir", str(cache), "--report-dir", str(reports), *extra),
        env={**os.environ, "COLUMNS": "300", "QNNSUITE_EMULATOR_FAULTS": json.dumps({"SM8650": faults or {}})},
    )


def _gate_lines(completed: subprocess.CompletedProcess) -> list[str]:
    return [line.strip() for line in completed.stdout.splitlines() if line.startswith("  ") and "SM8650" in line]


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


@pytest.mark.child_suite
def test_identical_run_passes_the_gate(baseline_run):
    root, document = baseline_run
    baseline = _write_baseline(root / "same", document)
    completed = _suite(root / "again", root / "cache", "--baseline", str(baseline))
    assert completed.returncode == 0, completed.stdout[-3000:]
    assert "no regressions" in completed.stdout


@pytest.mark.child_suite
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


@pytest.mark.child_suite
def test_baseline_latest_is_the_previous_run_not_this_one(baseline_run):
    """reports/latest is repointed to this run at the end; the gate must have read the previous run first."""
    root, document = baseline_run
    edited = json.loads(json.dumps(document))
    by_id = {case["case_id"]: case for case in edited["cases"]}
    known = by_id["counter_ones_init-fp16-delegate_mutbuf-SM8650"]["checks"]["initial_state"]
    known["verdict"], known["known_failure"] = "passed", ""  # an injected regression
    reports = root / "nightly"
    _write_baseline(reports / "previous-run" / "SM8650", edited)
    (reports / "latest").symlink_to("previous-run", target_is_directory=True)
    completed = _suite(reports, root / "cache", "--baseline", str(reports / "latest"))
    assert completed.returncode == pytest.ExitCode.TESTS_FAILED, completed.stdout[-3000:]
    lines = _gate_lines(completed)
    assert len(lines) == 1 and lines[0].startswith(
        "regression: SM8650 counter_ones_init-fp16-delegate_mutbuf-SM8650 initial_state passed -> xfailed: "
    ), completed.stdout[-3000:]
    assert (reports / "latest").resolve() != (reports / "previous-run").resolve(), "latest points at the new run"
    gate_file = json.loads(((reports / "latest") / "SM8650" / "gate.json").read_text())
    assert gate_file["ok"] is False and [e["kind"] for e in gate_file["checks"]] == ["regression"]


@pytest.mark.child_suite
def test_a_new_failing_check_fails_the_gate(baseline_run):
    """A state check that now fails (a runner losing state between steps) and is absent from the baseline."""
    root, document = baseline_run
    edited = json.loads(json.dumps(document))
    by_id = {case["case_id"]: case for case in edited["cases"]}
    del by_id["kv_gather_written-fp16-skip_mutbuf-SM8650"]["checks"]["state"]
    baseline = _write_baseline(root / "without-state", edited)
    completed = _suite(
        root / "new-failure", root / "cache", "--baseline", str(baseline), faults={"runner_reload_each_line": True}
    )
    assert completed.returncode == pytest.ExitCode.TESTS_FAILED, completed.stdout[-3000:]
    named = {
        tuple(line.split(":")[1].split()[1:5]) for line in _gate_lines(completed) if line.startswith("new failure: ")
    }
    assert ("kv_gather_written-fp16-skip_mutbuf-SM8650", "state", "absent", "->") in named, named
    # The broken runner also fails checks the baseline had as known failures, differently than expected:
    # those are new failures too (a known failure must not mask a new one).
    others = named - {("kv_gather_written-fp16-skip_mutbuf-SM8650", "state", "absent", "->")}
    assert others and all(before == "xfailed" for _, _, before, _ in others), named


@pytest.mark.child_suite
def test_a_narrowed_run_leaves_out_what_it_did_not_select_and_a_dropped_check_still_fails(baseline_run):
    """-k left kv_gather_written out: its baseline checks are counted as outside the selection, not missing
    (the gate passes, and says so); a check the baseline has in a case this run did run is missing, and the
    gate fails naming --allow-missing, which lets it pass."""
    root, document = baseline_run
    narrower = ["--emulate", "SM8650", "--dtype", "fp16", "-k", "counter_ones_init"]
    baseline = _write_baseline(root / "whole", document)
    completed = _suite(root / "narrowed", root / "cache", "--baseline", str(baseline), selection=narrower)
    assert completed.returncode == 0, completed.stdout[-3000:]
    left_out = sum(len(c["checks"]) for c in document["cases"] if c["case_id"].startswith("kv_gather_written"))
    said = (
        f"{left_out} baseline check(s) outside this run's selection (-k counter_ones_init --dtype fp16): not compared"
    )
    assert said in completed.stdout, completed.stdout[-3000:]
    gate = json.loads((root / "narrowed" / "latest" / "SM8650" / "gate.json").read_text())
    assert gate["ok"] and gate["excluded"] == left_out and gate["missing"] == 0 and gate["checks"] == []
    assert gate["baseline"] == {
        "night": "",
        "run_id": document["run_id"],
        "executorch": document["environment"]["executorch"],
    }
    edited = json.loads(json.dumps(document))
    case = next(c for c in edited["cases"] if c["case_id"].startswith("counter_ones_init"))
    case["checks"]["retired_check"] = {**next(iter(case["checks"].values())), "verdict": "passed", "known_failure": ""}
    baseline = _write_baseline(root / "with-retired-check", edited)
    dropped = _suite(root / "dropped", root / "cache", "--baseline", str(baseline), selection=narrower)
    assert dropped.returncode == pytest.ExitCode.TESTS_FAILED, dropped.stdout[-3000:]
    lines = _gate_lines(dropped)
    assert lines == [
        f"missing: SM8650 {case['case_id']} retired_check passed -> absent: in the baseline, not in this run "
        "(renamed, not collected or a collection error?)"
    ], dropped.stdout[-3000:]
    assert (
        "1 check(s) of the baseline are missing: if this run left them out on purpose, gate it with --allow-missing"
        in dropped.stdout
    )
    allowed = _suite(
        root / "allowed", root / "cache", "--baseline", str(baseline), "--allow-missing", selection=narrower
    )
    assert allowed.returncode == 0, allowed.stdout[-3000:]
    assert "gate against" in allowed.stdout and "no regressions" in allowed.stdout
