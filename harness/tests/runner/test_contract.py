"""The runner contract (harness/runner/contract.py) is the one place a runner's command line, files and heap
environment are written: no other module spells a runner flag, the flags it knows are the runners' own, the
heap environment keeps a user's tunables, and the device run's entry points take one request object."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

from harness.device import execute, retry
from harness.device.execute import DeviceRunRequest
from harness.paths import REPO_ROOT
from harness.runner import contract

RUNNER_SOURCE = REPO_ROOT / "harness" / "runner" / "suite_runner.cpp"
SCANNED = ("harness", "suites", "fixtures")
EXEMPT = (REPO_ROOT / "harness" / "runner", REPO_ROOT / "harness" / "tests")
FUNCTION_MAX_LINES = 80
# The modules this contract's change touched: none of their functions may grow past FUNCTION_MAX_LINES.
TOUCHED = (
    "harness/runner/contract.py",
    "harness/runner/run.py",
    "harness/device/execute.py",
    "harness/device/retry.py",
    "harness/case_store.py",
    "harness/matrix/cross.py",
    "harness/repro/bundle.py",
    "harness/repro/standalone.py",
    "harness/emulator/compiled_runner.py",
    "harness/emulator/host_runner.py",
)


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of a module but its docstrings (prose may name a flag; code may not)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def flags_spelled(source: str) -> list[str]:
    """The runner flags a module's code spells (in any string constant but a docstring)."""
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, contract.RUNNER_FLAGS)) + r")(?![\w-])")
    return sorted({match for node in _strings(ast.parse(source)) for match in pattern.findall(node.value)})


def _modules() -> list[Path]:
    found = []
    for top in SCANNED:
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if not any(path.is_relative_to(exempt) for exempt in EXEMPT):
                found.append(path)
    return found


def test_no_module_outside_the_runner_package_spells_a_runner_flag():
    spelled = {str(path.relative_to(REPO_ROOT)): flags_spelled(path.read_text()) for path in _modules()}
    offenders = {name: flags for name, flags in spelled.items() if flags}
    assert offenders == {}, (
        f"runner flags outside harness/runner/ (build them with harness.runner.contract): {offenders}"
    )


def test_the_flag_finder_catches_a_flag_in_code_and_not_in_prose():
    assert flags_spelled('argv = ["--model_path", "m.pte"]\n') == ["--model_path"]
    assert flags_spelled('command = f"runner --plan_path {plan}"\n') == ["--plan_path"]
    assert flags_spelled('"""Runs `runner --model_path M`."""\n\ndef f():\n    """--etdump_path too."""\n') == []
    assert flags_spelled('help_text = "--model_paths and --plan_path_x are other words"\n') == []


def test_the_contract_knows_every_flag_the_runners_take():
    compiled = set(re.findall(r'flag == "(--[a-z_]+)"', RUNNER_SOURCE.read_text()))
    assert compiled == set(contract.SUITE_RUNNER_FLAGS), "suite_runner.cpp's options and the contract's differ"
    parsed = contract.executor_arguments(["--model_path", "m", "--input_list_path", "l", "--output_folder_path", "o"])
    assert {f"--{name}" for name in vars(parsed)} == set(contract.EXECUTOR_RUNNER_FLAGS)


def test_argv_round_trips_through_the_readers():
    argv = contract.suite_runner_argv("m.pte", "plan.txt", "out", ["prefill", "decode"], "out/p.etdp", True)
    assert (contract.model_of(argv), contract.plan_of(argv), contract.outputs_of(argv)) == ("m.pte", "plan.txt", "out")
    assert contract.plan_options(["prefill", "decode"]) == ["--share_memory_arenas"] and "--shared_buffer" in argv
    moved = contract.with_plan(argv, "step.txt", "step_out")
    assert (contract.plan_of(moved), contract.outputs_of(moved), contract.model_of(moved)) == (
        "step.txt",
        "step_out",
        "m.pte",
    )
    assert contract.runs_a_program(" ".join(argv)) and not contract.runs_a_program("ls -l /data/local/tmp")
    upstream = contract.executor_runner_argv("m.pte", "list.txt", "out", 2)
    parsed = contract.executor_arguments(upstream)
    assert (parsed.model_path, parsed.input_list_path, parsed.method_index, parsed.shared_buffer) == (
        "m.pte",
        "list.txt",
        2,
        False,
    )


def test_the_heap_environment_keeps_a_users_tunables_and_sets_every_one_of_its_own():
    given = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=7", "PATH": "/bin"}
    env = contract.heap_environment(given, 0x40)
    tunables = env["GLIBC_TUNABLES"].split(":")
    assert "glibc.malloc.arena_max=2" in tunables and "glibc.malloc.tcache_count=7" not in tunables
    assert set(contract.HEAP_TUNABLES) <= set(tunables) and env["MALLOC_PERTURB_"] == str(0x40 ^ 0xFF)
    assert contract.heap_environment(given, None) == given, "no pattern: the environment as it was"


def test_inputs_and_outputs_use_the_contracts_names(tmp_path):
    rows = contract.write_inputs([(np.ones(2, np.float32),), (np.zeros(3, np.int32),)], tmp_path / "in")
    assert [[path.name for path in row] for row in rows] == [["input_0_0.raw"], ["input_1_0.raw"]]
    out = tmp_path / "out"
    out.mkdir()
    np.ones(2, np.float32).tofile(out / contract.output_name(0, 0))
    assert contract.read_outputs(out, [1, 1]) == ([], ["output_1_0.raw"])
    np.ones(1, np.float32).tofile(out / contract.output_name(1, 0))
    raw, missing = contract.read_outputs(out, [1, 1])
    assert missing == [] and [array.nbytes for row in raw for array in row] == [8, 4]
    assert [len(row) for row in contract.written_outputs(out, 3)] == [1, 1, 0]


def test_the_device_runs_entry_points_take_one_request():
    for function, before in ((execute.run_case, ["device", "workspace"]), (retry.run_with_reconnects, ["pool"])):
        parameters = inspect.signature(function).parameters
        assert [name for name in parameters if name not in ("holder",)] == [*before, "request"], function.__name__
        assert parameters["request"].annotation in (DeviceRunRequest, "DeviceRunRequest")
    with pytest.raises(AttributeError):
        DeviceRunRequest("case", Path("m.pte"), [], Path("."), 1).runner = "other"  # frozen: decided once


@pytest.mark.parametrize("module", TOUCHED)
def test_no_function_of_the_touched_modules_is_over_80_lines(module):
    tree = ast.parse((REPO_ROOT / module).read_text())
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


def _execute(pid: int, calls: int, registered: int, deregistered: int = 0) -> dict:
    mem = {"register_calls": calls, "registered": registered, "deregistered": deregistered}
    return {"event": "execute", "pid": pid, "inputs": [], "outputs": [], "registrations": mem}


def test_registrations_per_execute_and_held_per_step_are_read_from_the_traces_counts(tmp_path):
    # one process: 2 registered at load, then one more leaked at each execute and one released at the fourth
    records = [_execute(5, 2 + n, 2 + n, 1 if n == 3 else 0) for n in range(4)]
    assert contract.register_calls_per_execute(records) == [2, 1, 1, 1]
    assert contract.held_registrations(records) == [2, 3, 4, 4]
    # a second process (runner_reload_each_line) counts from zero again
    assert contract.register_calls_per_execute([_execute(5, 3, 3), _execute(6, 3, 3)]) == [3, 3]
    trace = tmp_path / contract.TRACE_NAME
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert contract.step_registrations(trace, 4) == [2, 3, 4, 4]
    assert contract.step_registrations(trace, 2) == [3, 4], "two graph executes a step: the step's last one"
    assert contract.step_registrations(trace, 3) == [], "executes that cannot be told apart by step"
    assert contract.step_registrations(None, 4) == []


def test_a_plan_whose_methods_execute_different_numbers_of_graphs_is_split_per_method(tmp_path):
    """A prefill method of two graphs and a decode method of one (a phone's multi-method program): the executes
    are split by the graphs' names, each step's count read at its own last execute; names that cannot tell the
    methods apart give nothing, never a wrong series."""
    methods = ["prefill", "decode", "decode", "prefill", "decode"]
    graphs = ["prefill_0", "prefill_1", "decode_0", "decode_0", "prefill_0", "prefill_1", "decode_0"]
    assert contract.executes_per_step(graphs, methods) == [2, 1, 1, 2, 1]
    trace = tmp_path / contract.TRACE_NAME
    leaking = [{**_execute(5, 2 + n, 2 + n), "graph": graph} for n, graph in enumerate(graphs)]  # one more a graph
    trace.write_text("".join(json.dumps(r) + "\n" for r in leaking))
    assert contract.step_registrations(trace, 5) == [], "7 executes over 5 steps: not by count alone"
    assert contract.step_registrations(trace, 5, methods) == [3, 4, 5, 7, 8]
    assert contract.executes_per_step(["g"] * 7, methods) is None, "every graph named alike: no split"
    assert contract.executes_per_step(graphs[:-1], methods) is None, "a step's graphs missing"
    assert contract.executes_per_step(["a", "b"], ["one", "other"]) == [1, 1]
    # a method that executes no graph (all on the CPU): its step could be any step's executes
    assert contract.executes_per_step(["a", "a"], ["step", "read", "step"]) is None
    assert contract.step_registrations(trace, 5, ["decode"] * 5) == [], "one method: the uniform rule"


def test_a_trace_without_counts_gives_no_registrations():
    """An older interposer's trace (no `registrations`), or one with a record lacking it: nothing, never zeros."""
    bare = {"event": "execute", "pid": 5, "inputs": [], "outputs": []}
    assert contract.held_registrations([bare]) == contract.register_calls_per_execute([bare]) == []
    assert contract.held_registrations([_execute(5, 1, 1), bare]) == []
    assert contract.per_step([], 4) == [] and contract.per_step([1, 2], 0) == []
