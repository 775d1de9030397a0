"""Health checks, device logs and provenance.

The suite runs are child `pytest suites` runs on two emulated devices (SM8650 healthy, SM8750 broken by a
fault switch) over one small card, sharing one artifact cache, as in test_reliability.py. The rest are
unit tests of the pieces: the health verdict, the emulated device's log and logcat, provenance and its
warnings, and their place in report.json (schema) and report.html.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

from harness import health
from harness.context import RunContext
from harness.device import provenance
from harness.device.execute import DeviceRun
from harness.device.kinds import PayloadInputs
from harness.device.pool import DeviceSpec
from harness.emulator import device_log, logcat
from harness.emulator.device_fs import active_faults
from harness.environment import provenance_per_soc
from harness.outcome import CaseOutcome
from harness.paths import REPO_ROOT
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk
from harness.record import RECORD_PROPERTY
from harness.report import write_run
from harness.report.render import page
from harness.tests.child_suite import run_suite
from harness.tests.report.test_report import COLUMNS, environments, make_records, typed

CARD = "kv_gather_written and not pair and delegate_mutbuf"
HEALTHY, FAULTY = "SM8650", "SM8750"
DEVICE_CHECKS = ("address_sharing", "state", "initial_state")
SCHEMA = json.loads((REPO_ROOT / "harness" / "report" / "report.schema.json").read_text())
HOST_BUILD = "v2.51.0.260929181845"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifact-cache")


SERVER = "127.0.0.1:5037"


def _suite(tmp_path: Path, cache: Path, faults: dict) -> tuple[subprocess.CompletedProcess, Path]:
    reports = tmp_path / "reports"
    env = {**os.environ, "COLUMNS": "400", "QNNSUITE_EMULATOR_FAULTS": json.dumps({FAULTY: faults})}
    completed = run_suite(
        *("-W", "ignore", "-rfE", "--emulate", f"{HEALTHY},{FAULTY}", "--dtype", "fp16", "-k", CARD, "-n", "2"),
        *("--cache-dir", str(cache), "--report-dir", str(reports)),
        env=env,
    )
    return completed, reports


def _report(reports: Path, soc: str) -> dict:
    document = json.loads((reports / "latest" / soc / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    return document


def _device_provenance(document: dict) -> dict:
    (found,) = document["provenance"]["devices"]
    return found


@pytest.mark.child_suite
def test_a_device_failing_its_health_check_gets_infrastructure_errors_the_other_passes(tmp_path, shared_cache):
    completed, reports = _suite(tmp_path, shared_cache, {"runner_exit": 3})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output[-3000:]
    quarantine = [line for line in completed.stderr.splitlines() if "quarantined" in line]
    assert len(quarantine) == 1 and f"({FAULTY}) quarantined" in quarantine[0], completed.stderr[-2000:]
    assert "exited 3 (last words: runner: exiting 3 (fault switch))" in quarantine[0]
    assert "health check: 1/2 device(s) healthy" in completed.stderr

    broken = _report(reports, FAULTY)
    for name in DEVICE_CHECKS:
        check = broken["cases"][0]["checks"][name]
        assert check["verdict"] == "infra_error", check
        assert "quarantined: it failed the health check" in check["message"] and "\n" not in check["message"]
    assert broken["cases"][0]["checks"]["partitions"]["verdict"] == "passed", "compile-side checks still run"
    failed_lines = [line for line in output.splitlines() if line.startswith("FAILED")]
    assert failed_lines and all(FAULTY in line and "infrastructure error: " in line for line in failed_lines), (
        failed_lines
    )

    healthy = _report(reports, HEALTHY)
    assert {c["verdict"] for c in healthy["cases"][0]["checks"].values()} <= {"passed", "skipped"}

    for document, verdict in ((healthy, "passed"), (broken, "runner on")):
        found = _device_provenance(document)
        assert found["health"].startswith(verdict), found
        runner = found["runner"]
        assert runner["pushed"] and runner["sha256"] == runner["device_sha256"], "measured on the device"
        compiled = found["suite_runner"]  # the binary the cases ran with, not the command that starts it
        assert compiled["name"] == "suite_runner.bin" and compiled["sha256"] == compiled["device_sha256"], compiled
        assert found["backend"]["name"] == "libexecutorch_backend_qnn.so" and not found["backend"]["pushed"]
        assert found["qnn_build_id"] == document["provenance"]["host"]["qnn_build_id"]
        assert document["provenance"]["warnings"] == []
    html = (reports / "latest" / HEALTHY / "report.html").read_text()
    assert 'id="provenance"' in html and _device_provenance(healthy)["runner"]["sha256"] in html
    assert _device_provenance(healthy)["suite_runner"]["sha256"] in html


@pytest.mark.child_suite
def test_a_failed_run_brings_its_device_log_into_the_evidence(tmp_path, shared_cache):
    # after_programs: the health check's program goes through; the case's program arrives truncated.
    completed, reports = _suite(tmp_path, shared_cache, {"after_programs": 1, "corrupt_pte": True})
    assert completed.returncode == 1, (completed.stdout + completed.stderr)[-3000:]
    assert "health check: 2/2 device(s) healthy" in completed.stderr
    check = _report(reports, FAULTY)["cases"][0]["checks"]["state"]
    # The compiled runner's own line, and executorch's C++ log line (level E) in the device log.
    assert check["verdict"] == "failed" and "suite_runner: error: cannot load the program" in check["message"]
    log = check["evidence"]["device_log"]
    assert " E ExecuTorch: program.cpp:" in log and "File size is too small" in log, log
    assert "qnn_executor_runner" not in log, "only ExecuTorch and QNN tags are pulled"
    (bundle,) = [p for p in (reports / "latest" / FAULTY / "repro").iterdir() if p.is_dir()]
    assert "File size is too small" in (bundle / "device" / "device.log").read_text()


# --- the health verdict ----------------------------------------------------------------------------
def _outcome(device_values: list[float] | None, run_error: str = "") -> CaseOutcome:
    case = health.health_case("SM8650")
    steps = case.card.steps(2)
    reference = [[(step[0] * 2).numpy()] for step in steps]
    run = None
    if device_values is not None:
        outputs = [[np.asarray(device_values, dtype=np.float32).view(np.uint8)] for _ in steps]
        run = DeviceRun(outputs, [], None, "")
    return CaseOutcome(case, steps, artifact=None, reference=reference, run=run, run_error=run_error or None)


@pytest.mark.child_suite
def test_an_unlowered_health_program_starts_the_lowering_server_with_the_devices(tmp_path):
    """A run selecting no case still runs the health check: on an empty cache its program must be lowered,
    so the lowering server is started at once, while the emulated device comes up, and the check lowers
    through it; once the program is cached, such a run starts no lowering server at all."""
    cache = tmp_path / "cache"
    started = {}
    for run in ("cold", "warm"):
        reports = tmp_path / run
        completed = run_suite(
            *("--emulate", HEALTHY, "-k", "no_case_is_named_this", "--cache-dir", str(cache)),
            *("--report-dir", str(reports)),
            timeout=600,
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode == 5 and "1/1 device(s) healthy" in output, output[-3000:]
        (context,) = reports.glob("*/run-context.json")
        started[run] = RunContext.from_json(context.read_text()).lowering_server_pid
    assert started["cold"] is not None, "the health program was lowered without the lowering server"
    assert started["warm"] is None, "nothing to lower, yet a lowering server was started"


def test_health_verdict_passes_eager_outputs_and_catches_wrong_ones():
    case = health.health_case("SM8650")
    steps = case.card.steps(2)
    right = _outcome(None)
    right.run = DeviceRun([[(s[0] * 2).numpy().view(np.uint8).ravel()] for s in steps], [], None, "")
    assert health.verdict(right) is None
    wrong = _outcome([0.0] * 8)
    assert health.verdict(wrong).startswith("its output differs from eager: ")
    short = _outcome([0.0] * 4)
    assert health.verdict(short).startswith("its output is not the program's: ")
    crashed = _outcome(None, "runner on S crashed with signal 11 SIGSEGV (exit 139) (last words: x); its log:\nx")
    assert health.verdict(crashed) == "runner on S crashed with signal 11 SIGSEGV (exit 139) (last words: x)"


def test_the_health_program_is_never_a_case():
    from harness.pipeline import card, cases

    assert health.health_case("SM8650").card in card.cards()
    assert all(
        c.card is not health.health_case("SM8650").card for c in cases.matrix(card.cards(), ("fp16",), ["SM8650"])
    )


# --- the emulated device's log and logcat ------------------------------------------------------------
def _logcat(log_path: Path, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setenv(device_log.LOG_ENV, str(log_path))
        code = logcat.main(list(argv))
    return code, out.getvalue()


def test_emulated_logcat_filters_by_tag_priority_and_time(tmp_path, capsys):
    log_path = tmp_path / "log.jsonl"
    read_end, write_end = os.pipe()
    lines = b"[ERROR] [Qnn ExecuTorch]: QnnDsp <E> graph failed\n[program.cpp:114] too small\nplain runner line\n"
    os.write(write_end, lines)
    os.close(write_end)
    copy = tmp_path / "stderr"
    with open(copy, "wb") as copy_file:
        device_log.tee(read_end, copy_file.fileno(), open(log_path, "a"), 4242)
    assert copy.read_bytes() == lines, "the runner's stderr passes through unchanged"
    code, out = _logcat(log_path, "-d", "-v", "threadtime", "ExecuTorch:V", "[Qnn ExecuTorch]:V", "*:S")
    assert code == 0
    shown = out.splitlines()
    assert len(shown) == 2 and shown[0].endswith(" 4242  4242 E [Qnn ExecuTorch]: QnnDsp <E> graph failed"), shown
    assert " I ExecuTorch: [program.cpp:114] too small" in shown[1]
    assert "plain runner line" in _logcat(log_path, "-d")[1], "no filter: everything"
    assert _logcat(log_path, "-d", "[Qnn ExecuTorch]:E", "*:S")[1].count("\n") == 1
    assert _logcat(log_path, "-d", "-T", "12-31 23:59:59.999")[1] == "", "nothing since a later time"
    assert _logcat(log_path, "-d", "-T", "01-01 00:00:00.000")[1].count("\n") == 3
    assert _logcat(log_path, "-t", "1")[1].count("\n") == 1
    capsys.readouterr()
    assert _logcat(log_path, "-d", "-v", "brief")[0] == 1
    assert _logcat(log_path)[0] == 1, "it cannot follow"
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(line.startswith("logcat: ") for line in errors), errors


def test_held_back_faults_are_not_in_force():
    assert active_faults({"after_programs": 1, "runner_crash": True}) == {}
    assert active_faults({"after_programs": 0, "runner_crash": True})["runner_crash"] is True


# --- provenance -------------------------------------------------------------------------------------
def _library(tmp_path: Path, build_id: str) -> Path:
    path = tmp_path / build_id / "libQnnHtp.so"
    path.parent.mkdir()
    path.write_bytes(b"\x7fELF" + bytes(64) + f"QNN build {build_id} here".encode() + bytes(64))
    return path


def _found(tmp_path: Path, build_id: str, device_sha256: str | None = None) -> dict:
    runner = tmp_path / "qnn_executor_runner"
    runner.write_text("#!/bin/sh\n")
    runner_entry = provenance.file_entry("qnn_executor_runner", runner, True, device_sha256)
    if device_sha256 is None:
        runner_entry["device_sha256"] = runner_entry["sha256"]
    library = provenance.file_entry("libQnnHtp.so", _library(tmp_path, build_id), True)
    library["device_sha256"] = library["sha256"]
    return {
        "serial": "S1",
        "soc": "SM8650",
        "kind": "phone",
        "health": "passed",
        "runner": runner_entry,
        "backend": None,
        "qnn_libraries": [library],
        "qnn_build_id": library["build_id"],
        "problem": "",
    }


def test_build_id_is_read_from_the_pushed_library_bytes_and_a_mismatch_warns(tmp_path):
    same = _found(tmp_path, HOST_BUILD)
    assert same["qnn_build_id"] == HOST_BUILD
    assert provenance.warnings({"S1": same}, HOST_BUILD) == []
    other = _found(tmp_path, "v2.50.0.260801000000")
    (line,) = provenance.warnings({"S1": other}, HOST_BUILD)
    assert "S1" in line and "v2.50.0.260801000000" in line and HOST_BUILD in line and "--qnn-sdk" in line


def test_a_pushed_file_that_differs_on_the_device_warns(tmp_path):
    (line,) = provenance.warnings({"S1": _found(tmp_path, HOST_BUILD, device_sha256="0" * 64)}, HOST_BUILD)
    assert "another qnn_executor_runner than the one pushed" in line


def test_provenance_goes_into_report_json_valid_against_the_schema_and_the_html(tmp_path):
    spec = DeviceSpec("S1", "SM8650", 75, "arm64-v8a", "Pixel", "phone", SERVER)
    context = RunContext(
        "run1", (spec,), {}, (), tmp_path, provenance={spec.label: _found(tmp_path, "v2.50.0.260801000000")}
    )
    toolchain = SimpleNamespace(probe=SimpleNamespace(build_id=HOST_BUILD))
    per_soc = provenance_per_soc(context, toolchain)
    assert len(per_soc["SM8650"]["warnings"]) == 1
    records = typed(make_records(socs=("SM8650",)))
    folder = write_run(records, environments(("SM8650",)), tmp_path / "reports", "run1", COLUMNS, provenance=per_soc)[
        "SM8650"
    ]
    document = json.loads((folder / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["provenance"]["devices"][0]["qnn_build_id"] == "v2.50.0.260801000000"
    html = (folder / "report.html").read_text()
    assert "runs QNN v2.50.0.260801000000 but the programs were lowered with" in html
    assert document["provenance"]["devices"][0]["runner"]["sha256"] in html
    broken = json.loads(json.dumps(document))
    broken["provenance"]["devices"][0]["runner"]["sha256"] = "not a hash"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)
    assert page._provenance({"cases": []}) is None, "older reports have no provenance block"


def test_health_check_quarantines_only_devices_at_fault(monkeypatch, tmp_path):
    """Stubbed runs: a lowering failure is not the device's (not checked, takes cases); a failed run and
    a surprise each quarantine their device alone, with one line naming it."""
    specs = tuple(
        DeviceSpec(f"S{i}", soc, 75, "x86_64", "m", "emulated", SERVER) for i, soc in enumerate(("SM8650",) * 4)
    )
    fates = {"S0": "ok", "S1": "no program", "S2": "runner failed", "S3": "surprise"}

    def executed(store, case):
        fate = fates[store._pool.specs[0].serial]
        if fate == "surprise":
            raise RuntimeError("adb went strange\nsecond line")
        outcome = _outcome(
            None, "runner on S2 exited 1 (last words: no); its log:\nno" if fate == "runner failed" else ""
        )
        if fate == "ok":
            outcome.run = DeviceRun([[(s[0] * 2).numpy().view(np.uint8).ravel()] for s in outcome.steps], [], None, "")
        outcome.artifact = SimpleNamespace(ok=fate != "no program", failure="lowering failed: QnnError: boom")
        return outcome

    monkeypatch.setattr(health.CaseStore, "executed", executed)
    toolchain = SimpleNamespace(sdk=QnnSdk(root=tmp_path / "no-sdk", origin=WHEEL_ORIGIN))
    given = PayloadInputs(toolchain.sdk, None, None, None)
    results = health.HealthCheck(specs, "run1", toolchain, tmp_path, given, 300, None, None).run()
    assert set(results.quarantined) == {f"{SERVER}/S2", f"{SERVER}/S3"}, results.quarantined
    assert results.quarantined[f"{SERVER}/S2"].endswith(
        "quarantined: it failed the health check (a one-op program): runner on S2 exited 1 (last words: no)"
    )
    assert results.quarantined[f"{SERVER}/S3"].endswith("RuntimeError: adb went strange")
    assert results.provenance[f"{SERVER}/S0"]["health"] == "passed"
    assert results.provenance[f"{SERVER}/S1"]["health"].startswith("not checked: its program could not be lowered")
    assert all("\n" not in line for line in results.lines) and len(results.lines) == 3, results.lines
    unreachable = results.provenance[
        f"{SERVER}/S0"
    ]  # no adb server on port 1: its hashes cannot be taken, and it says so
    assert unreachable["problem"] and unreachable["runner"]["device_sha256"] is None and unreachable["runner"]["sha256"]


@pytest.mark.parametrize("device_build, warned", [(HOST_BUILD, 0), ("v2.50.0.260801000000", 1)])
def test_the_terminal_summary_warns_once_where_device_and_host_qnn_builds_differ(
    tmp_path, monkeypatch, device_build, warned
):
    from harness import reporter as reporter_module

    toolchain = SimpleNamespace(
        probe=SimpleNamespace(
            build_id=HOST_BUILD,
            bridge_device_config=False,
            bridge_compose_graphs=False,
            library_api="2.40.0",
            built_for_api="2.27.0",
        ),
        sdk=SimpleNamespace(root=tmp_path, origin="QNN_SDK_ROOT"),
    )
    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: toolchain)
    spec = DeviceSpec("S1", "SM8650", 75, "arm64-v8a", "Pixel", "phone", SERVER)
    context = RunContext(
        "run1", (spec,), {}, (), tmp_path / "work", provenance={spec.label: _found(tmp_path, device_build)}
    )
    options = SimpleNamespace(
        qnn_sdk=None, report_dir=tmp_path / "reports", baseline=None, allow_missing=False, shard=None, perf_budget=10.0
    )
    reporter = reporter_module.ConformanceReporter(options, context, None)
    for record in make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",)):
        reporter.pytest_runtest_logreport(
            SimpleNamespace(nodeid=record["nodeid"], user_properties=[(RECORD_PROPERTY, record)])
        )
    reporter.pytest_sessionfinish(SimpleNamespace(exitstatus=0))
    warnings = [line for line in reporter._lines if line.startswith("warning: ")]
    assert len(warnings) == warned and all(
        f"device {SERVER}/S1 runs QNN v2.50.0.260801000000" in line for line in warnings
    )


def test_a_runners_own_lines_are_logged_under_its_name():
    """The compiled runner's lines are tagged suite_runner (was: qnn_executor_runner, the other runner's name);
    a library's prefixed line keeps the library's tag whichever runner wrote it."""
    assert device_log.entry("step 0 method forward execute_us 9", 1, 0.0)["tag"] == "qnn_executor_runner"
    assert device_log.entry("step 0 method forward execute_us 9", 1, 0.0, "suite_runner")["tag"] == "suite_runner"
    assert device_log.entry("[ERROR] [Qnn ExecuTorch]: failed", 1, 0.0, "suite_runner")["tag"] == "[Qnn ExecuTorch]"
