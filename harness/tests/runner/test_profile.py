"""--profile-level: the QNN profile per step in a case's evidence.

End to end (two child `pytest suites` runs of counter_add fp16 on one emulated SM8650, about 2-4 minutes): with
`--profile-level detailed` every run case's report.json timing holds the QNN backend's per-op events for every
step (names of the lowered graph's ops, non-negative, some positive), summary.md and report.html show the top
events; without the option there is none. A bad level is one usage line. The reader refuses what is not a
profiled ETDump, and the views never rank values of different units together."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.report.perf_gate import profile_top
from harness.runner.profile import MAX_EVENTS, ProfileError, ProfileEvent, profile_of, read_etdump
from harness.tests.child_suite import run_suite

SOC, CARD, STEPS = "SM8650", "counter_add", 4


def _suite(reports: Path, *extra: str) -> subprocess.CompletedProcess:
    arguments = ("-W", "ignore", "--emulate", SOC, "--dtype", "fp16", "-k", CARD, "--report-dir", str(reports), *extra)
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("QNNSUITE_EMULATOR_FAULTS", None)
    return run_suite(*arguments, env=env)


def _report(reports: Path, completed: subprocess.CompletedProcess) -> tuple[dict, str, str]:
    folder = reports / "latest" / SOC
    assert (folder / "report.json").is_file(), (completed.stdout + completed.stderr)[-3000:]
    return (
        json.loads((folder / "report.json").read_text()),
        (folder / "summary.md").read_text(),
        (folder / "report.html").read_text(),
    )


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[dict, str, str]:
    reports = tmp_path_factory.mktemp("profiled")
    return _report(reports, _suite(reports, "--profile-level", "detailed"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[dict, str, str]:
    reports = tmp_path_factory.mktemp("plain")
    return _report(reports, _suite(reports))


@pytest.mark.child_suite
def test_a_profiled_run_has_qnn_per_op_times_for_every_step(profiled):
    document, summary, page = profiled
    timed = [case for case in document["cases"] if case.get("timing")]
    assert {case["mode"] for case in timed} >= {"delegate_mutbuf", "skip_mutbuf"}
    for case in timed:
        profile = case["timing"]["profile"]
        assert profile["level"] == "detailed" and profile["omitted"] == 0
        events = profile["events"]
        assert {event["step"] for event in events} == set(range(STEPS)), case["case_id"]
        assert all(event["value"] >= 0 for event in events)
        for step in range(STEPS):
            # the lowered graph's ops, by the QNN backend's names (node:OpId_N), at least one with a cost
            ops = [e for e in events if e["step"] == step and ":OpId_" in e["event"] and e["unit"] == "cycles"]
            assert any(e["event"].startswith("aten_add_tensor") for e in ops), (case["case_id"], step, ops)
            assert any(e["value"] > 0 for e in ops), (case["case_id"], step, ops)
    assert "### QNN profile (--profile-level" in summary and "aten_add_tensor" in summary
    assert "QNN profile (--profile-level" in page


@pytest.mark.child_suite
def test_the_profiled_run_does_not_change_what_the_checks_read(profiled, plain):
    """The checks read the case's own (unprofiled) run: the same verdicts as a run without the option."""
    verdicts = [
        {
            (case["case_id"], name): check["verdict"]
            for case in document["cases"]
            for name, check in case["checks"].items()
        }
        for document in (profiled[0], plain[0])
    ]
    assert verdicts[0] == verdicts[1]


@pytest.mark.child_suite
def test_without_the_option_there_is_no_profile(plain):
    document, summary, page = plain
    assert all("profile" not in (case.get("timing") or {}) for case in document["cases"])
    assert "QNN profile" not in summary and "QNN profile" not in page


@pytest.mark.child_suite
@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("basic", "ERROR: --profile-level basic: executorch's QNN backend no longer profiles at the basic level"),
        ("fast", "ERROR: --profile-level 'fast': give one of off, detailed"),
    ],
)
def test_a_bad_profile_level_is_one_usage_line(value, line):
    completed = run_suite("--collect-only", "--profile-level", value, timeout=120)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 4 and line in output and "Traceback" not in output, output[-2000:]


def test_the_reader_refuses_what_is_not_an_etdump(tmp_path):
    path = tmp_path / "profile.etdp"
    path.write_bytes(b"not a flatbuffer at all" * 4)
    with pytest.raises(ProfileError, match="profile.etdp: not an ETDump"):
        read_etdump(path, STEPS)


def test_the_profile_is_bounded_and_keeps_the_earliest_steps():
    events = [ProfileEvent(step, f"op{index}:OpId_{index}", 1.0, "cycles") for step in range(9) for index in range(60)]
    profile = profile_of(events, "detailed")
    assert len(profile["events"]) == MAX_EVENTS and profile["omitted"] == len(events) - MAX_EVENTS
    assert profile["events"][0]["step"] == 0 and profile["events"][-1]["step"] == (MAX_EVENTS - 1) // 60


def test_the_top_events_rank_one_unit_never_mixing_them():
    events = [
        {"step": 0, "event": "Time for HVX power on", "value": 9e6, "unit": "us"},
        {"step": 0, "event": "a:OpId_1", "value": 10.0, "unit": "cycles"},
        {"step": 0, "event": "b:OpId_2", "value": 30.0, "unit": "cycles"},
        {"step": 1, "event": "a:OpId_1", "value": 10.0, "unit": "cycles"},
        {"step": 1, "event": "b:OpId_2", "value": 5.0, "unit": "cycles"},
    ]
    document = {
        "cases": [{"case_id": "c", "timing": {"profile": {"level": "detailed", "events": events, "omitted": 0}}}]
    }
    rows = profile_top(document, count=5)
    assert [(row.event, row.values) for row in rows] == [("b:OpId_2", (30.0, 5.0)), ("a:OpId_1", (10.0, 10.0))]
    assert profile_top({"cases": [{"case_id": "c", "timing": {"steps_us": [1]}}]}) == []


@pytest.mark.qnn
def test_the_runners_etdump_holds_the_profile_only_of_a_profiled_program(toolchain, tmp_path):
    """counter_add fp16 delegated, lowered without and with profile_level 2, each run through the compiled
    runner with --etdump_path: the unprofiled program's ETDump has no backend event (the reader says so),
    the profiled one's has the ops of every step, and both programs give the same output bytes."""
    from fixtures import zoo  # noqa: F401  (registers the cards)
    from harness.device.kinds import EmulatedKind
    from harness.pipeline import card as cards
    from harness.pipeline.lower import lower_case
    from harness.runner import build as runner_build, run as runner_run
    from harness.tests.runner.test_compiled_runner import _raw_inputs
    from harness.vocabulary import Case, Mode

    case = Case(cards.find("fixtures.zoo:counter_add"), "fp16", Mode("delegate_mutbuf"), SOC)
    files = _raw_inputs(case.card.steps(STEPS), tmp_path / "inputs")
    plan = runner_run.write_plan([("forward", row) for row in files], tmp_path / "plan.txt")
    env = EmulatedKind.heap_environment(runner_run.runner_env(toolchain))  # the same heap bytes in both runs
    outputs = {}
    for level in (0, 2):
        lowered = lower_case(case, toolchain, tmp_path / f"lowered{level}", STEPS, profile_level=level)
        assert lowered.ok, lowered.failure
        etdump = tmp_path / f"profile{level}.etdp"
        ran = runner_run.run_plan(
            runner_build.build(), lowered.pte, plan, tmp_path / f"out{level}", env, ("--etdump_path", str(etdump))
        )
        assert ran.exit_code == 0 and "runner: etdump_bytes " in ran.stdout, (ran.stdout + ran.stderr)[-3000:]
        outputs[level] = [path.read_bytes() for path in sorted((tmp_path / f"out{level}").glob("output_*.raw"))]
        if level == 0:
            with pytest.raises(ProfileError, match="no backend profile events"):
                read_etdump(etdump, STEPS)
        else:
            events = read_etdump(etdump, STEPS)
            for step in range(STEPS):
                assert any(e.step == step and e.event.startswith("aten_add_tensor:OpId_") for e in events), step
    assert len(outputs[0]) >= STEPS and outputs[0] == outputs[2], "the profiled program computed something else"


def test_the_runner_is_built_with_etdump_only_where_executorch_ships_it(tmp_path):
    """Without the ETDump header and library the build leaves the profile out (the runner then refuses
    --etdump_path with exit 11) instead of failing to compile; with both it defines and links it."""
    from harness.runner import build as runner_build

    install = runner_build.ExecutorchInstall(tmp_path / "executorch", tmp_path / "torch" / "include")
    (install.lib).mkdir(parents=True)
    (install.include / runner_build.ETDUMP_HEADER).parent.mkdir(parents=True)
    (install.include / runner_build.ETDUMP_HEADER).write_text("")
    command = runner_build.compile_command("g++", install, tmp_path / "out")
    assert "-DSUITE_RUNNER_ETDUMP" not in command and "-lexecutorch_etdump" not in command, "a header alone"
    (install.lib / f"lib{runner_build.ETDUMP_LIBRARY}.so").write_bytes(b"")
    command = runner_build.compile_command("g++", install, tmp_path / "out")
    assert "-DSUITE_RUNNER_ETDUMP" in command and "-lexecutorch_etdump" in command
