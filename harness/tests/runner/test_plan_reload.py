"""A plan's `reload` line (a driver's fresh-load reset), and the emulated runtime faults that lose a driver's
state: the plan written with reload lines, cut into fresh processes where a fault loses the state, and a
qnn_executor_runner (one load per process) refusing a plan that reloads: not measured, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.device.execute import RunnerUnavailable, Workspace, choose_runner
from harness.device.payload import RUNNER_NAME, SUITE_RUNNER_NAME
from harness.emulator.compiled_runner import fault_starts, plan_segments, without_reloads
from harness.runner.run import write_plan

METHODS = ["step_4", "step_4", "step_1", "step_1", "step_4", "step_1"]


def _plan(tmp_path: Path, reloads: tuple[int, ...] = ()) -> Path:
    return write_plan([(method, [f"in_{i}.raw"]) for i, method in enumerate(METHODS)], tmp_path / "plan.txt", reloads)


def test_a_reload_line_comes_before_its_step(tmp_path):
    lines = _plan(tmp_path, (4,)).read_text().splitlines()
    assert lines[0] == "qnnsuite-plan 1" and lines[5] == "reload" and lines[6] == "step step_4 in_4.raw"
    assert "reload" not in without_reloads(_plan(tmp_path, (4,))).read_text().split()


def test_each_state_losing_fault_cuts_the_plan_where_it_loses_the_state():
    assert fault_starts({"runner_drop_prefill_chunks": {"method": "step_4"}}, METHODS) == {1}
    assert fault_starts({"runner_forget_at_turn": {"method": "step_4"}}, METHODS) == {4}
    assert fault_starts({"runner_reload_each_line": True}, METHODS) == set(range(len(METHODS)))
    # malformed or absent: no cut (the runner runs the plan as it is)
    assert fault_starts({"runner_forget_at_turn": True}, METHODS) is None and fault_starts({}, METHODS) is None


def test_segments_keep_every_step_once_and_drop_a_reload_a_fresh_process_makes(tmp_path):
    segments = plan_segments(_plan(tmp_path, (2, 4)), {4})
    assert [first for first, _ in segments] == [0, 4]
    assert segments[0][1][-1] == "step step_1 in_3.raw" and "reload" in segments[0][1]  # the reload before 2 stays
    assert segments[1][1][0] == "step step_4 in_4.raw"  # the reload before 4 is the fresh process itself


def test_a_plan_that_reloads_is_not_measurable_by_qnn_executor_runner():
    upstream_only = Workspace("/cases", "/payload", runners=(RUNNER_NAME,))
    with pytest.raises(RunnerUnavailable, match="cannot load the program again mid-plan .*before step 3"):
        choose_runner(upstream_only, SUITE_RUNNER_NAME, ["forward"] * 5, "d", reloads=(3,))
    both = Workspace("/cases", "/payload", runners=(RUNNER_NAME, SUITE_RUNNER_NAME))
    assert choose_runner(both, SUITE_RUNNER_NAME, ["forward"] * 5, "d", reloads=(3,)) == SUITE_RUNNER_NAME
