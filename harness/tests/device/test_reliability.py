"""Faults injected into real suite runs: the affected cases fail with one line naming the cause and
the fix, the other device's cases still pass, the report is written, nothing is left running.

Each scenario is a child `pytest suites` run on two emulated devices (SM8650 healthy, SM8750 with the
fault) over one small card; lowered artifacts are shared through one cache so only the first
scenario lowers. The faults arm after the device's first program, its health check (`after_programs`),
so these scenarios break a case's run; a device broken from the start is quarantined (test_health.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness import run_records
from harness.context import RunContext
from harness.tests.child_suite import run_suite, start_suite
from harness.tests.waiting import stopped_runners_under, wait_for

CARD = "kv_gather_written and not pair and delegate_mutbuf"
HEALTHY, FAULTY = "SM8650", "SM8750"
DEVICE_CHECKS = ("address_sharing", "state", "initial_state")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifact-cache")


class SuiteRun:
    def __init__(self, completed: subprocess.CompletedProcess, reports: Path) -> None:
        self.completed, self.reports = completed, reports
        self.output = completed.stdout + completed.stderr

    @property
    def context(self) -> RunContext:
        (folder,) = [p for p in self.reports.iterdir() if not p.is_symlink() and (p / "run-context.json").exists()]
        return RunContext.from_json((folder / "run-context.json").read_text())

    def report(self, soc: str) -> dict:
        return json.loads((self.reports / "latest" / soc / "report.json").read_text())

    def checks(self, soc: str) -> dict[str, dict]:
        (case,) = self.report(soc)["cases"]
        return case["checks"]

    def assert_nothing_left(self) -> None:
        context = self.context
        alive = [pid for pid in context.started_pids if _alive(pid)]
        assert alive == [], f"processes left running: {alive}"
        assert not context.work_dir.exists(), "the run's work dir (device sandboxes, workspaces) must be removed"
        stray = subprocess.run(["pgrep", "-f", str(context.work_dir)], capture_output=True, text=True).stdout.split()
        assert stray == [], f"processes still using {context.work_dir}: {stray}"


def _alive(pid: int) -> bool:
    """Running and not a zombie (run_records knows a process by its start time, None once it is gone)."""
    return run_records.start_time(pid) is not None


def _suite(tmp_path: Path, cache: Path, faults: dict | None = None, *extra: str, env: dict | None = None) -> SuiteRun:
    reports = tmp_path / "reports"
    arguments = (
        "-W",
        "ignore",
        "-rfE",
        "--emulate",
        f"{HEALTHY},{FAULTY}",
        "--dtype",
        "fp16",
        "-k",
        CARD,
        "-n",
        "2",
        "--cache-dir",
        str(cache),
        "--report-dir",
        str(reports),
        *extra,
    )
    armed = {"after_programs": 1, **faults} if faults else {}
    full_env = {**os.environ, "COLUMNS": "400", "QNNSUITE_EMULATOR_FAULTS": json.dumps({FAULTY: armed}), **(env or {})}
    completed = run_suite(*arguments, env=full_env)
    return SuiteRun(completed, reports)


def _assert_faulty_device_failed(run: SuiteRun, expected: str, verdict: str = "failed") -> None:
    """verdict: failed when the program's run failed (crash, hang, no outputs), infra_error when the device did."""
    assert run.completed.returncode == 1, run.output[-3000:]
    checks = run.checks(FAULTY)
    for name in DEVICE_CHECKS:
        assert checks[name]["verdict"] == verdict, (name, checks[name])
        assert expected in checks[name]["message"], (name, checks[name]["message"])
        assert "\n" not in checks[name]["message"]
    failed_lines = [line for line in run.output.splitlines() if line.startswith("FAILED")]
    assert failed_lines and all(FAULTY in line and expected in line for line in failed_lines), failed_lines
    _assert_healthy(run)


def _assert_healthy(run: SuiteRun, soc: str = HEALTHY) -> None:
    checks = run.checks(soc)
    assert {c["verdict"] for c in checks.values()} <= {"passed", "skipped"}, checks
    assert (
        sum(c["verdict"] == "passed" for c in checks.values()) == 4
    )  # annotation (fp16) and initial state (reads only written rows) skip
    # The emulated device ran the case through the suite's compiled runner, which timed every step.
    timing = run.report(soc)["cases"][0]["timing"]
    assert timing["runner"] == "suite_runner" and len(timing["steps_us"]) >= 2, timing
    assert timing["first_step_us"] == timing["steps_us"][0] and timing["peak_rss_kb"] > 10_000, timing


@pytest.mark.child_suite
@pytest.mark.parametrize("stage", ["push", "pull"])
def test_transient_disconnect_is_retried(tmp_path, shared_cache, stage):
    run = _suite(tmp_path, shared_cache, {"vanish_on": stage})
    assert run.completed.returncode == 0, run.output[-3000:]
    _assert_healthy(run, FAULTY)
    _assert_healthy(run)
    assert run.checks(FAULTY)["state"]["retries"] == 1, "the retry is in the report"
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_device_unplugged_during_run(tmp_path, shared_cache):
    run = _suite(tmp_path, shared_cache, {"vanish_on": "run", "vanish_permanently": True})
    _assert_faulty_device_failed(run, "lost during", "infra_error")
    assert "check the cable/connection and `adb devices`" in run.checks(FAULTY)["state"]["message"]
    failed_lines = [line for line in run.output.splitlines() if line.startswith("FAILED")]
    assert all("infrastructure error: " in line for line in failed_lines), "a lost device is the lab's failure"
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_device_frozen_during_the_run_is_lost_within_30_s(tmp_path, shared_cache):
    """The device keeps its link but stops answering while the runner runs (runner timeout 300 s): the
    watchdog's probes lose it within 30 s, its checks are infrastructure errors, the other device passes."""
    run = _suite(tmp_path, shared_cache, {"freeze_on": "run"})
    _assert_faulty_device_failed(run, "stopped answering while", "infra_error")
    assert run.report(FAULTY)["cases"][0]["timings_s"]["device_total"] < 30, run.report(FAULTY)["cases"][0]["timings_s"]
    run.assert_nothing_left()


@pytest.mark.child_suite
@pytest.mark.parametrize(
    "faults, expected, verdict",
    [
        ({"runner_crash": True}, "crashed with signal 11 SIGSEGV", "failed"),
        ({"runner_exit": 3}, "exited 3", "failed"),
        ({"runner_fewer_outputs": True}, "wrote no output_0_0.raw", "failed"),
        ({"storage_full": True}, "no space left on device pushing", "infra_error"),
        ({"corrupt_pte": True}, "exited 4 (last words: suite_runner: error: cannot load the program", "failed"),
    ],
)
def test_runner_and_device_faults(tmp_path, shared_cache, faults, expected, verdict):
    run = _suite(tmp_path, shared_cache, faults)
    _assert_faulty_device_failed(run, expected, verdict)
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_hung_runner_is_killed_after_the_timeout(tmp_path, shared_cache):
    run = _suite(tmp_path, shared_cache, {"runner_hang": True}, "--runner-timeout", "8")
    _assert_faulty_device_failed(run, "hung and was killed after 8 s")
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_runner_of_the_wrong_architecture(tmp_path, shared_cache):
    arm_runner = tmp_path / "qnn_executor_runner"
    arm_runner.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(11) + (183).to_bytes(2, "little") + bytes(44))
    run = _suite(tmp_path, shared_cache, None, "--runner", str(arm_runner))
    assert run.completed.returncode == 1
    for soc in (HEALTHY, FAULTY):  # the runner is every device's
        for name in DEVICE_CHECKS:
            assert "is built for arm64-v8a but the device is x86_64" in run.checks(soc)[name]["message"]
        assert run.checks(soc)["partitions"]["verdict"] == "passed", "compile-side checks still run"
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_keep_workspace_prints_where_it_is(tmp_path, shared_cache):
    run = _suite(tmp_path, shared_cache, None, "--keep-workspace", "-s")
    assert run.completed.returncode == 0, run.output[-2000:]
    kept = [line for line in run.output.splitlines() if line.startswith("kept workspace ")]
    assert len(kept) >= 2 and all("/data/local/tmp/qnnsuite/" in line for line in kept), run.output[-2000:]
    assert run.context.work_dir.exists(), "kept means kept"
    shutil.rmtree(run.context.work_dir)  # the emulated devices' storage: this test's to clean up


PASSED_DOT = re.compile(r"(^|\n)[sxXFE]*\.")  # a passed check on pytest's progress line


@pytest.mark.child_suite
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_in_a_parallel_run(tmp_path, shared_cache, stop):
    """SIGTERM (a cancelled CI job) ends the run as Ctrl-C does: what finished is reported, nothing is left."""
    reports = tmp_path / "reports"
    arguments = (
        "-W",
        "ignore",
        "--emulate",
        f"{HEALTHY},{FAULTY}",
        "--dtype",
        "fp16",
        "-k",
        "kv_gather_written or kv_index_put",
        "-n",
        "2",
        "--cache-dir",
        str(shared_cache),
        "--report-dir",
        str(reports),
    )
    # SIGINT as a terminal's Ctrl-C finds it: a shell without job control starts background jobs with SIGINT
    # ignored, and a run under such a job inherited that (measured: the run went on after the signal).
    child = start_suite(
        *arguments,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "QNNSUITE_EMULATOR_FAULTS": json.dumps({FAULTY: {"after_programs": 1, "runner_hang": True}}),
        },
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(lambda: child.stdout.read(1), "")), daemon=True)
    reader.start()
    # Some checks finished (pytest's progress dots; a fixed sleep was too short on a loaded machine), and
    # others are hanging on the faulty device.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not PASSED_DOT.search("".join(printed).rpartition("bringing up nodes...")[2]):
        time.sleep(0.5)
    wait_for(lambda: stopped_runners_under(child.pid), timeout_s=300, what="a runner hanging on the faulty device")
    child.send_signal(stop)
    try:
        child.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        child.kill()  # a run that did not stop must not outlive the test (what it started dies with it)
    output = "".join(printed)
    assert child.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert "KeyboardInterrupt" in output
    run = SuiteRun(subprocess.CompletedProcess(arguments, child.returncode, output, ""), reports)
    healthy = run.report(HEALTHY)
    assert healthy["summary"]["passed"] >= 1, "finished results are in the report"
    run.assert_nothing_left()


@pytest.mark.child_suite
def test_sigkill_of_pytest_leaves_no_adb_server_or_device(tmp_path, shared_cache):
    """Nothing can run in a SIGKILLed process: its adb server, emulated devices and servers die with it."""
    reports = tmp_path / "reports"
    arguments = (
        "-W",
        "ignore",
        "--emulate",
        HEALTHY,
        "--dtype",
        "fp16",
        "-k",
        CARD,
        "--cache-dir",
        str(shared_cache),
        "--report-dir",
        str(reports),
    )
    child = start_suite(*arguments, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(reports.glob("*/run-context.json")):
        time.sleep(0.2)
    context = RunContext.from_json(next(reports.glob("*/run-context.json")).read_text())
    assert context.started_pids, "the run recorded what it started"
    child.kill()
    child.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [pid for pid in context.started_pids if _alive(pid)]:
        time.sleep(0.2)
    assert [pid for pid in context.started_pids if _alive(pid)] == [], "left running after SIGKILL of pytest"
    shutil.rmtree(context.work_dir, ignore_errors=True)  # a killed run cannot clean its host folder


@pytest.mark.child_suite
def test_private_adb_server_killed_mid_run_starts_nothing_on_5037(tmp_path, shared_cache):
    """adbutils, finding no server, would start one on 5037: the run must instead fail the device cases
    (the lab failed, so infrastructure errors), write its report and leave nothing listening on 5037."""
    from harness.device import discovery

    default_was_listening = discovery.server_listening(5037)
    reports = tmp_path / "reports"
    arguments = (
        "-W",
        "ignore",
        "--emulate",
        f"{HEALTHY},{FAULTY}",
        "--dtype",
        "fp16",
        "-k",
        CARD,
        "-n",
        "2",
        "--runner-timeout",
        "60",
        "--cache-dir",
        str(shared_cache),
        "--report-dir",
        str(reports),
    )
    child = start_suite(
        *arguments,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "COLUMNS": "400",
            "QNNSUITE_EMULATOR_FAULTS": json.dumps({FAULTY: {"after_programs": 1, "runner_hang": True}}),
        },
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(reports.glob("*/run-context.json")):
        time.sleep(0.2)
    context = RunContext.from_json(next(reports.glob("*/run-context.json")).read_text())
    servers = [
        pid
        for pid in context.started_pids
        if _alive(pid)
        and b"server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"adb")
    ]
    assert len(servers) == 1, f"one private adb server among {context.started_pids}"
    # The faulty device's runner hangs; kill the server under it.
    wait_for(lambda: stopped_runners_under(child.pid), timeout_s=300, what="a runner hanging on the faulty device")
    os.kill(servers[0], signal.SIGKILL)
    output, _ = child.communicate(timeout=400)
    assert child.returncode == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    verdicts = {
        c["verdict"]
        for soc in (HEALTHY, FAULTY)
        for case in json.loads((reports / "latest" / soc / "report.json").read_text())["cases"]
        for c in case["checks"].values()
    }
    assert "infra_error" in verdicts, (verdicts, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    if not default_was_listening:
        assert not discovery.server_listening(5037), "a server was started on 5037"
    run = SuiteRun(subprocess.CompletedProcess(arguments, child.returncode, output, ""), reports)
    run.assert_nothing_left()
