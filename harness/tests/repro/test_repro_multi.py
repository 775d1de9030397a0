"""Reproduction bundles of multi-method cases: a real suite run of mm_counter (fp16, SM8650, both
buffer modes) writes them, and each bundle's repro.py, alone in an empty folder, replays the card's plan
(advance, read, advance, read: each step on its method, in ONE loaded program) and gives the suite's verdict.

The two bundles fail differently (fixtures/known_failures.toml): delegate_mutbuf with cross_method_mismatch,
skip_mutbuf with state_per_method. Replaying every step as one method (what repro.py did before) makes the
skip_mutbuf bundle a DIFFERENT FAILURE (cross_method_mismatch, measured) and the delegate_mutbuf bundle's
per-step numbers differ from the report's (10.0 and 22.0 at steps 2 and 3, measured): the tests compare the
signature, the whole line and the per-step numbers with the report, so a replay of the wrong plan fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import adbutils
import pytest

from harness.device.payload import EMULATED_RUNNER, EMULATED_SUITE_RUNNER, SUITE_RUNNER_BINARY_NAME
from harness.emulator.launcher import EmulatorFleet
from harness.qnn.toolchain import prepare
from harness.repro import issue, layout
from harness.runner import build as runner_build
from harness.tests.child_suite import run_suite

pytestmark = [pytest.mark.qnn, pytest.mark.child_suite, pytest.mark.device]

DELEGATED = "mm_counter-fp16-delegate_mutbuf-SM8650"  # cross_method_mismatch (F16 with F1)
KEPT_OUT = "mm_counter-fp16-skip_mutbuf-SM8650"  # state_per_method (F16)
PLAN = ["advance", "read", "advance", "read"]
SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", f"{DELEGATED} or {KEPT_OUT}"]
QUIET = ["-W", "ignore"]
DEVICE_DIR = "/data/local/tmp/qnn"


@dataclass(frozen=True)
class Run:
    soc_folder: Path

    def bundle(self, case_id: str) -> Path:
        return self.soc_folder / layout.REPRO_DIR / case_id

    def checks(self, case_id: str) -> dict[str, dict]:
        cases = json.loads((self.soc_folder / "report.json").read_text())["cases"]
        return next(case for case in cases if case["case_id"] == case_id)["checks"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    root = tmp_path_factory.mktemp("repro_multi")
    suite = run_suite(*QUIET, *SELECTION, "--cache-dir", str(root / "cache"), "--report-dir", str(root / "reports"))
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    return Run((root / "reports" / "latest").resolve() / "SM8650")


def _standalone_env() -> dict[str, str]:
    env = prepare().child_env()
    env.pop("PYTHONPATH", None)
    return env


def _run_alone(
    bundle: Path, into: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Copy the bundle into an empty folder and run its repro.py there, the harness not importable."""
    shutil.copytree(bundle, into)
    env = {**_standalone_env(), **(extra_env or {})}
    probe = subprocess.run([sys.executable, "-c", "import harness"], cwd=into, env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "the harness is importable from the bundle's folder: the test would prove nothing"
    return subprocess.run(
        [sys.executable, "repro.py", *args], cwd=into, env=env, capture_output=True, text=True, timeout=600
    )


def _assert_as_recorded(run: Run, case_id: str, completed: subprocess.CompletedProcess, out: Path) -> None:
    """REPRODUCED, cross_method_state's whole line and signature as the report has them, and the numbers of
    every step equal to the report's (a replay of another plan differs in them)."""
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    recorded = run.checks(case_id)["cross_method_state"]
    assert recorded["verdict"] == "xfailed"
    line = f"cross_method_state: FAILED [{recorded['signature']}] {recorded['message']}  (as recorded)"
    assert line in completed.stdout.splitlines(), completed.stdout[-3000:]
    # Every check the report has failing fails again, and only those (with the per-method checks, advance's own
    # delegated copy starting from the heap pattern (F1) fails state and initial_state too).
    failing = sorted(name for name, check in run.checks(case_id).items() if check["verdict"] in ("failed", "xfailed"))
    assert f"verdict: REPRODUCED ({', '.join(failing)} fail as recorded)" in completed.stdout.splitlines()
    result = json.loads((out / "result.json").read_text())
    assert [(s["step"], s["mismatches"], f"{s['max_abs_error']:.6g}") for s in result["steps"]] == [
        (s["step"], s["mismatches"], f"{s['max_abs_error']:.6g}") for s in recorded["evidence"]["steps"]
    ]
    assert f"plan (one loaded program, a method per step): {', '.join(PLAN)}" in completed.stdout


def test_multi_method_bundles_record_and_show_the_plan(run):
    for case_id in (DELEGATED, KEPT_OUT):
        case = json.loads((run.bundle(case_id) / layout.CASE_FILE).read_text())
        assert case["plan"] == PLAN and case["card"]["methods"] == ["advance", "read"]
        assert case["share_mutable_buffers"] is False and "def _counter_plan" in case["card"]["plan_source"]
        text = (run.bundle(case_id) / "issue.md").read_text()
        assert "step 0 ` advance `, step 1 ` read `, step 2 ` advance `, step 3 ` read `." in text
        assert "without `share_mutable_buffers`" in text and "def _counter_plan" in text
        assert "MemoryPlanningPass(share_mutable_buffers=False)" in text
        assert "runs the plan above in one process" in text


def test_the_delegated_bundle_replays_the_plan_to_the_suites_verdict(run, tmp_path):
    """Lowered again by the bundle, run by the suite's compiled runner built from the bundle's source: each
    step on its method, one loaded program."""
    completed = _run_alone(run.bundle(DELEGATED), tmp_path / "empty")
    _assert_as_recorded(run, DELEGATED, completed, tmp_path / "empty" / "repro-out")
    log = (tmp_path / "empty" / "repro-out" / "runner.log").read_text()
    assert [f"step {step} method {method} " in log for step, method in enumerate(PLAN)] == [True] * len(PLAN)
    assert log.count("runner: load method advance ") == 1 and log.count("runner: load method read ") == 1


def test_the_bundle_kept_outside_replays_its_own_signature(run, tmp_path):
    """The other mode's bundle fails otherwise (state_per_method): each bundle gives its own case's verdict."""
    completed = _run_alone(run.bundle(KEPT_OUT), tmp_path / "empty", "--pte", "model.pte")
    _assert_as_recorded(run, KEPT_OUT, completed, tmp_path / "empty" / "repro-out")
    assert "FAILED [state_per_method]" in completed.stdout and "cross_method_mismatch" not in completed.stdout


def test_without_a_compiler_the_plan_runs_on_one_executorch_runtime_program(run, tmp_path):
    completed = _run_alone(
        run.bundle(DELEGATED),
        tmp_path / "empty",
        "--pte",
        "model.pte",
        extra_env={"CXX": str(tmp_path / "no-g++")},
    )
    _assert_as_recorded(run, DELEGATED, completed, tmp_path / "empty" / "repro-out")
    log = (tmp_path / "empty" / "repro-out" / "runner.log").read_text()
    assert "runner: 4 step(s) of advance, read on one executorch.runtime Program" in log
    assert "execute_us" not in log


def _fleet_adb(fleet: EmulatorFleet, serial: str, *commands: list[str]) -> None:
    adb_env = {**os.environ, **fleet.server.environment}
    for command in commands:
        done = subprocess.run(
            [adbutils.adb_path(), "-s", serial, *command], env=adb_env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, (command, done.stderr)


def test_on_a_phone_the_plan_runs_with_suite_runner_from_the_device_dir(run, tmp_path):
    """--serial: a device whose --device-dir holds only qnn_executor_runner cannot run a plan of two methods in
    one process: one line naming the fix, exit 2, nothing run. With suite_runner there (an emulated device's,
    as a maintainer would push theirs), the plan replays to the suite's verdict."""
    toolchain = prepare()
    with EmulatorFleet(
        ["SM8650"], tmp_path / "fleet", device_env={**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}
    ) as fleet:
        serial = fleet.devices[0].serial
        _fleet_adb(
            fleet,
            serial,
            ["shell", f"mkdir -p {DEVICE_DIR}"],
            ["push", str(EMULATED_RUNNER), f"{DEVICE_DIR}/qnn_executor_runner"],
            ["shell", f"chmod 755 {DEVICE_DIR}/qnn_executor_runner"],
        )
        phone = ("--pte", "model.pte", "--serial", serial, "--adb", adbutils.adb_path())
        refused = _run_alone(run.bundle(DELEGATED), tmp_path / "without", *phone, extra_env=fleet.server.environment)
        _fleet_adb(
            fleet,
            serial,
            ["push", str(EMULATED_SUITE_RUNNER), f"{DEVICE_DIR}/suite_runner"],
            ["push", str(runner_build.build()), f"{DEVICE_DIR}/{SUITE_RUNNER_BINARY_NAME}"],
            ["shell", f"chmod 755 {DEVICE_DIR}/suite_runner {DEVICE_DIR}/{SUITE_RUNNER_BINARY_NAME}"],
        )
        ran = _run_alone(run.bundle(DELEGATED), tmp_path / "with", *phone, extra_env=fleet.server.environment)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines() == [
        f"repro.py: the plan runs advance, read in one process, which qnn_executor_runner cannot (one method per "
        f"process), and {DEVICE_DIR}/suite_runner is not an executable on {serial}: build the suite's runner for "
        f"Android (suite/suite_runner.cpp; the suite's --android-ndk does it) and push it with its libraries to "
        f"--device-dir, or run without --serial"
    ]
    assert not (tmp_path / "without" / "repro-out" / "outputs").exists()
    assert f"on phone {serial}" in ran.stdout
    # A phone's heap is its own (the bundle sets no MALLOC_PERTURB_ there), so whether advance's uninitialised copy
    # reads the emulated pattern (F1: cross_method_mismatch) or zeros (then exactly F15: state_per_method) is the
    # phone's; either way the state did not cross methods.
    assert any(
        f"cross_method_state: FAILED [{signature}]" in ran.stdout
        for signature in ("cross_method_mismatch", "state_per_method")
    ), ran.stdout[-3000:] + ran.stderr[-2000:]
    assert "step 1 method read " in (tmp_path / "with" / "repro-out" / "runner.log").read_text()


def _case(**changes) -> dict:
    """A minimal case.json for issue.md."""
    check = {"verdict": "failed", "signature": "x", "message": "m", "known_failure": "", "finding": "", "upstream": ""}
    case = {
        "case_id": "c-fp16-delegate_mutbuf-SM8650",
        "dtype": "fp16",
        "mode": "delegate_mutbuf",
        "soc": "SM8650",
        "steps": 2,
        "skip_mutable_buffer": False,
        "card": {
            "name": "c",
            "file": "card/c.py",
            "mutated_buffers": ["count"],
            "build_source": "",
            "steps_source": "",
        },
        "environment": {
            "executorch": "1",
            "torch": "1",
            "torchao": "1",
            "python": "3",
            "qnn_build_id": "q",
            "qnn_sdk": "wheel",
            "device_config_bridge": False,
            "device_serial": "",
            "device_kind": "emulated",
            "exports": [],
        },
        "lowering": {"error": "", "traceback": ""},
        "numbers": [],
        "pte": {"file": "", "note": ""},
        "checks": {"state": check},
    }
    return {**case, **changes}


def test_a_single_method_issue_names_no_plan():
    """The plan paragraph belongs to multi-method bundles only; a single-method issue.md keeps its wording."""
    single = issue.render(_case())
    assert "**Plan**" not in single and "share_mutable_buffers" not in single
    assert "runs the 2 step(s)" in single and "one loaded method, state carried from step to step" in single
    multi = issue.render(
        _case(plan=["w", "r"], share_mutable_buffers=True, card={**_case()["card"], "methods": ["w", "r"]})
    )
    assert "step 0 ` w `, step 1 ` r `." in multi and "with `share_mutable_buffers`" in multi
    assert "lowers its methods ` w `, ` r ` together" in multi
