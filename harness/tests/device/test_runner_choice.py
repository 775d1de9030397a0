"""Which runner a case's device run uses (harness/device/execute.py run_case's `runner` and `methods`), what it
reads of the runner's per-step times, and the case record's `timing` they become (report.json).

A recording stand-in for the device: these tests are about the choice and the files, not about a device, so
nothing here needs the emulated fleet (the fleet's own run of both runners: harness/tests/emulator/)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from harness.device.device import RunResult
from harness.device.execute import DeviceRun, DeviceRunRequest, RunnerUnavailable, Workspace, choose_runner, run_case
from harness.device.payload import RUNNER_NAME, SUITE_RUNNER_NAME
from harness.report.intake import SCHEMA_PATH

BOTH = Workspace("/data/local/tmp/cases", "/data/local/tmp/payload", runners=(SUITE_RUNNER_NAME, RUNNER_NAME))
UPSTREAM_ONLY = Workspace("/data/local/tmp/cases", "/data/local/tmp/payload", runners=(RUNNER_NAME,))


class RecordingDevice:
    """Answers run_case as a device whose runner wrote every output and printed `stdout`."""

    serial = "stand-in"

    def __init__(self, stdout: str, output_count: int, steps: int) -> None:
        self.stdout, self.output_count, self.steps = stdout, output_count, steps
        self.pushed: dict[str, bytes] = {}
        self.argv: list[str] = []

    def push_files(self, pairs: list[tuple[Path, str]]) -> int:
        self.pushed.update({remote: local.read_bytes() for local, remote in pairs})
        return sum(len(data) for data in self.pushed.values())

    def run(self, argv: list[str], cwd: str, timeout_s: float, **_: object) -> RunResult:
        self.argv = argv
        return RunResult(" ".join(argv), 0, self.stdout, 0.1)

    def pull_files(self, remote: str, local: Path, limits: dict[str, int]) -> list[str]:
        local.mkdir(parents=True, exist_ok=True)
        names = [f"output_{step}_{index}.raw" for step in range(self.steps) for index in range(self.output_count)]
        for name in names:
            np.zeros(2, dtype=np.float32).tofile(local / name)
        return names


def _run(tmp_path: Path, workspace: Workspace, stdout: str, **kwargs: object) -> tuple[DeviceRun, RecordingDevice]:
    steps = [(np.ones(2, dtype=np.float32),), (np.ones(2, dtype=np.float32),)]
    device = RecordingDevice(stdout, 1, len(steps))
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"program")
    run = run_case(
        device, workspace, DeviceRunRequest("case", pte, steps, tmp_path / "local", output_count=1, **kwargs)
    )
    return run, device


SUITE_STDOUT = (
    "runner: heap pattern 0x40\nrunner: load method forward load_us 900\n"
    "step 0 method forward execute_us 1500 peak_rss_kb 64000\n"
    "[INFO] [Qnn ExecuTorch]: step 1 method forward execute_us 700 peak_rss_kb 65000\n"
    "runner: peak_rss_kb 65000\n"
)


def test_suite_runner_runs_a_plan_and_its_step_times_are_kept(tmp_path):
    run, device = _run(tmp_path, BOTH, SUITE_STDOUT)
    assert device.argv[0] == f"{BOTH.payload}/{SUITE_RUNNER_NAME}" and "--plan_path" in device.argv
    plan = device.pushed[f"{BOTH.cases}/case/plan.txt"].decode().splitlines()
    # No methods given: the program's method by index, every step (upstream's --method_index counts the same way)
    assert plan == ["qnnsuite-plan 1", "step @0 input_0_0.raw", "step @0 input_1_0.raw"]
    assert "--share_memory_arenas" not in device.argv  # one method: Module's default arenas
    assert (run.runner, run.step_times_us, run.peak_rss_kb, run.heap_pattern) == (
        SUITE_RUNNER_NAME,
        [1500, 700],
        65000,
        0x40,
    )
    assert run.step_rss_kb == [64000, 65000] and run.step_registrations == [], "no trace: no registrations"


def test_a_runner_whose_step_lines_carry_no_rss_gives_none_per_step(tmp_path):
    """A runner built before the per-step RSS (or one line without it): no series, never a partial one."""
    older = SUITE_STDOUT.replace(" peak_rss_kb 64000", "")
    run, _ = _run(tmp_path, BOTH, older)
    assert (run.step_times_us, run.step_rss_kb, run.peak_rss_kb) == ([1500, 700], [], 65000)


def test_named_methods_go_into_the_plan(tmp_path):
    _, device = _run(tmp_path, BOTH, SUITE_STDOUT, methods=["prefill", "decode"])
    plan = device.pushed[f"{BOTH.cases}/case/plan.txt"].decode().splitlines()
    assert plan[1:] == ["step prefill input_0_0.raw", "step decode input_1_0.raw"]
    assert device.argv[-1] == "--share_memory_arenas"  # several methods: one Module's arenas (run.plan_options)


def test_without_suite_runner_a_single_method_plan_falls_back_to_upstreams_runner(tmp_path):
    run, device = _run(tmp_path, UPSTREAM_ONLY, "runner: 2 line(s) x 1 iteration(s) in 3.0 ms\n", method_index=2)
    assert device.argv[0] == f"{UPSTREAM_ONLY.payload}/{RUNNER_NAME}"
    assert device.argv[-2:] == ["--method_index", "2"]
    assert device.pushed[f"{UPSTREAM_ONLY.cases}/case/input_list.txt"] == b"input_0_0.raw\ninput_1_0.raw\n"
    assert (run.runner, run.step_times_us, run.peak_rss_kb) == (RUNNER_NAME, [], None)


def test_asking_for_upstreams_runner_gets_it_where_both_are_there(tmp_path):
    run, device = _run(tmp_path, BOTH, "", runner=RUNNER_NAME)
    assert device.argv[0].endswith(f"/{RUNNER_NAME}") and run.runner == RUNNER_NAME


@pytest.mark.parametrize(
    "workspace,runner,words",
    [
        (UPSTREAM_ONLY, SUITE_RUNNER_NAME, "this device has no suite_runner"),
        (BOTH, RUNNER_NAME, "qnn_executor_runner runs one method per process"),
    ],
)
def test_a_plan_of_several_methods_without_suite_runner_is_not_measurable(workspace, runner, words):
    with pytest.raises(RunnerUnavailable, match=f"^device d: {words}, and the plan runs 2 methods .*--android-ndk"):
        choose_runner(workspace, runner, ["prefill", "decode", "decode"], "d")
    # one method repeated is still a single-method plan: upstream's runner can run it
    assert choose_runner(UPSTREAM_ONLY, SUITE_RUNNER_NAME, ["decode", "decode"], "d") == RUNNER_NAME


def test_unknown_runner_and_a_method_count_mismatch_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown runner 'adb'"):
        choose_runner(BOTH, "adb", None, "d")
    with pytest.raises(ValueError, match="1 method"):
        _run(tmp_path, BOTH, SUITE_STDOUT, methods=["forward"])


def _case_record(timing: dict | None) -> dict:
    return {
        "case_id": "c-fp16-delegate_mutbuf-SM8650",
        "card": "c",
        "tags": [],
        "dtype": "fp16",
        "mode": "delegate_mutbuf",
        "soc": "SM8650",
        "device_serial": None,
        "delegates": 1,
        "timings_s": {},
        "checks": {},
        "timing": timing,
    }


def test_the_outcomes_timing_validates_against_the_report_schema_and_a_bad_one_does_not(tmp_path):
    from harness.outcome import CaseOutcome

    run, _ = _run(tmp_path, BOTH, SUITE_STDOUT)
    outcome = CaseOutcome(None, [], None, [], run=run)  # type: ignore[arg-type]
    assert outcome.timing == {
        "runner": SUITE_RUNNER_NAME,
        "steps_us": [1500, 700],
        "first_step_us": 1500,
        "peak_rss_kb": 65000,
        "steps_rss_kb": [64000, 65000],
        "steps_registrations": [],
        "device_kind": None,
        "p50_us": 700,
        "p90_us": 700,
        "repeats_p50_us": [700],
        "repeats_min_us": [700],
    }
    assert CaseOutcome(None, [], None, []).timing is None  # type: ignore[arg-type]
    schema = json.loads(SCHEMA_PATH.read_text())
    case_schema = {"$defs": schema["$defs"], **schema["$defs"]["case"]}

    jsonschema.validate(_case_record(outcome.timing), case_schema)
    jsonschema.validate(_case_record(None), case_schema)
    for broken in ({**outcome.timing, "runner": "python"}, {**outcome.timing, "steps_us": [-1]}, {"runner": "x"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(_case_record(broken), case_schema)


def test_a_run_the_device_cannot_make_is_not_measured_and_any_other_missing_run_fails():
    from types import SimpleNamespace

    from harness.check_registry import CheckFailure, NotMeasured
    from harness.checks import common

    outcome = SimpleNamespace(
        artifact=SimpleNamespace(ok=True),
        run=None,
        run_error="device d: this device has no suite_runner, ...",
        run_error_is_infrastructure=False,
        run_error_is_not_measured=True,
        device_log="",
    )
    with pytest.raises(NotMeasured, match="no suite_runner"):
        common.require_run(outcome)
    outcome.run_error_is_not_measured = False
    with pytest.raises(CheckFailure, match="no suite_runner"):
        common.require_run(outcome)
