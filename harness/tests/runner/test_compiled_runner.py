"""The suite's compiled runner (harness/runner/): built from nothing and cached, state carried across
steps and methods of one process, outputs bit-equal to executorch's Python runtime, and one line per bad input.

Lowering and the Python runtime run in child processes with the toolchain's environment (they load QNN); the
child entry points are this file's __main__ (`lower-two-method`, `pybindings`), so the test needs no file
outside the runner's own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from harness.paths import REPO_ROOT
from harness.runner import build as runner_build, run as runner_run

STEPS = 4
SOC = "SM8650"
ROW = 8  # the two-method program's buffer: (1, ROW) float32


@pytest.fixture(scope="module")
def runner_binary() -> Path:
    """The runner of the suite's state folder (a cache hit after the first build)."""
    try:
        return runner_build.build()
    except runner_build.RunnerBuildError as error:
        pytest.fail(str(error), pytrace=False)


def _child(
    toolchain, *args: str, env: dict[str, str] | None = None, timeout_s: float = 600
) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, __file__, *args],
        cwd=REPO_ROOT,
        env=env or toolchain.child_env(),
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-3000:]
    return completed


def _raw_inputs(steps: list[tuple], folder: Path) -> list[list[Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for step, inputs in enumerate(steps):
        row = []
        for index, tensor in enumerate(inputs):
            path = folder / f"input_{step}_{index}.raw"
            np.ascontiguousarray(tensor.detach().numpy()).tofile(path)
            row.append(path)
        files.append(row)
    return files


# --- (a) build from a clean state folder, then a cache hit ---------------------------------------------------


@pytest.mark.build
def test_build_from_clean_state_then_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("QNNSUITE_HOME", str(tmp_path / "home"))
    started = time.perf_counter()
    binary = runner_build.build()
    first_s = time.perf_counter() - started
    assert binary.is_file() and binary.is_relative_to(tmp_path / "home" / runner_build.CACHE_FOLDER)
    assert binary.stat().st_mode & 0o077 == 0, "the built runner is reachable by other local accounts"
    assert binary.parent.stat().st_mode & 0o077 == 0
    built_at = binary.stat().st_mtime_ns
    started = time.perf_counter()
    assert runner_build.build() == binary
    assert binary.stat().st_mtime_ns == built_at, "a cache hit must not rebuild"
    assert time.perf_counter() - started < first_s / 2
    assert not list(binary.parent.glob("*.partial"))


def test_cache_key_changes_with_the_source(tmp_path, monkeypatch):
    install = runner_build.find_executorch()
    before = runner_build.cache_key("g++", install)
    edited = tmp_path / "suite_runner.cpp"
    edited.write_text(runner_build.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(runner_build, "SOURCE", edited)
    assert runner_build.cache_key("g++", install) != before


def test_no_compiler_is_one_line_naming_apt_get(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(runner_build.RunnerBuildError) as raised:
        runner_build.find_compiler()
    assert "\n" not in str(raised.value) and "apt-get install g++" in str(raised.value)


def test_executorch_without_headers_is_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "executorch"
    (fake / "lib").mkdir(parents=True)
    real_find_spec = runner_build.importlib.util.find_spec
    monkeypatch.setattr(
        runner_build.importlib.util,
        "find_spec",
        lambda name: (
            types.SimpleNamespace(submodule_search_locations=[str(fake)])
            if name == "executorch"
            else real_find_spec(name)
        ),
    )
    with pytest.raises(runner_build.RunnerBuildError) as raised:
        runner_build.find_executorch()
    assert "\n" not in str(raised.value) and "has no C++ headers" in str(raised.value)
    # Headers but no QNN backend library: named, with the build switch.
    (fake / "include" / runner_build.PROBE_HEADER).parent.mkdir(parents=True)
    (fake / "include" / runner_build.PROBE_HEADER).write_text("")
    with pytest.raises(runner_build.RunnerBuildError, match="libexecutorch_backend_qnn.so.*EXECUTORCH_BUILD_QNN"):
        runner_build.find_executorch()


def test_failed_compile_is_one_line_with_the_first_error(tmp_path, monkeypatch):
    monkeypatch.setenv("QNNSUITE_HOME", str(tmp_path / "home"))
    broken = tmp_path / "broken-g++"
    broken.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'broken 1.0'; exit 0; }\n"
        "echo 'suite_runner.cpp:1:1: error: something the compiler disliked' >&2; exit 1\n"
    )
    broken.chmod(0o700)
    with pytest.raises(runner_build.RunnerBuildError) as raised:
        runner_build.build(str(broken))
    message = str(raised.value)
    assert "\n" not in message and "error: something the compiler disliked" in message
    assert not list((tmp_path / "home").rglob(runner_build.BINARY_NAME)), "a failed build left a binary in the cache"


def test_exit_codes_agree_with_the_source():
    declared = re.search(r"constexpr int (kUsage = 2[^;]*);", runner_build.SOURCE.read_text()).group(1)
    codes = sorted(int(value) for value in re.findall(r"= (\d+)", declared))
    assert codes == sorted(runner_run.EXIT_CODES)


# --- (b) two methods, one buffer: state crosses methods in one process ---------------------------------------


@pytest.fixture(scope="module")
def two_method_program(toolchain, tmp_path_factory) -> Path:
    pte = tmp_path_factory.mktemp("two_method") / "write_read.pte"
    _child(toolchain, "lower-two-method", str(pte))
    return pte


@pytest.fixture(scope="module")
def ones_input(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inputs") / "x.raw"
    np.ones((1, ROW), dtype=np.float32).tofile(path)
    return path


def _near(path: Path, value: float) -> bool:
    """Every element of a float32 output within fp16 rounding of value (the HTP computes in fp16 here and gives
    1.0000001 for 1: measured); 1, 2 and 3, the values told apart below, are far outside it."""
    found = np.fromfile(path, dtype=np.float32)
    return found.size == ROW and bool(np.allclose(found, value, rtol=1e-3, atol=0))


@pytest.mark.qnn
def test_state_crosses_methods_in_one_process(runner_binary, two_method_program, ones_input, toolchain, tmp_path):
    plan = runner_run.write_plan(
        [("write", [ones_input]), ("write", [ones_input]), ("read", [ones_input])], tmp_path / "plan.txt"
    )
    ran = runner_run.run_plan(
        runner_binary,
        two_method_program,
        plan,
        tmp_path / "out",
        runner_run.runner_env(toolchain),
        ("--share_memory_arenas",),
    )
    assert ran.exit_code == 0, (ran.stdout + ran.stderr)[-3000:]
    assert _near(tmp_path / "out" / "output_0_0.raw", 1.0)
    assert _near(tmp_path / "out" / "output_1_0.raw", 2.0)
    assert _near(tmp_path / "out" / "output_2_0.raw", 3.0), "read must see both writes: 2x + x"
    # One timing line per execute, each method loaded once, peak memory reported.
    assert [(step.step, step.method) for step in ran.steps] == [(0, "write"), (1, "write"), (2, "read")]
    assert all(step.execute_us > 0 for step in ran.steps)
    assert sorted(ran.load_us) == ["read", "write"] and ran.stdout.count("runner: load method write ") == 1
    assert ran.peak_rss_kb and ran.peak_rss_kb > 1000


@pytest.mark.qnn
def test_control_separate_processes_do_not_carry_state(
    runner_binary, two_method_program, ones_input, toolchain, tmp_path
):
    """The failing control: the same plan, one process per step, must lose the writes (read gives x)."""
    env = runner_run.runner_env(toolchain)
    for step, method in enumerate(("write", "write", "read")):
        plan = runner_run.write_plan([(method, [ones_input])], tmp_path / f"plan_{step}.txt")
        ran = runner_run.run_plan(
            runner_binary, two_method_program, plan, tmp_path / f"out_{step}", env, ("--share_memory_arenas",)
        )
        assert ran.exit_code == 0, (ran.stdout + ran.stderr)[-3000:]
    assert _near(tmp_path / "out_1" / "output_0_0.raw", 1.0), "a fresh process starts from zeros"
    assert _near(tmp_path / "out_2" / "output_0_0.raw", 1.0)


@pytest.mark.qnn
def test_without_shared_arenas_each_method_has_its_own_state(
    runner_binary, two_method_program, ones_input, toolchain, tmp_path
):
    """Module's default (share_memory_arenas=false) gives each method its own planned memory, so the buffer
    does not cross methods even in one process: why the flag exists (measured with executorch 1.5.1)."""
    plan = runner_run.write_plan(
        [("write", [ones_input]), ("write", [ones_input]), ("read", [ones_input])], tmp_path / "plan.txt"
    )
    ran = runner_run.run_plan(
        runner_binary, two_method_program, plan, tmp_path / "out", runner_run.runner_env(toolchain)
    )
    assert ran.exit_code == 0, (ran.stdout + ran.stderr)[-3000:]
    assert _near(tmp_path / "out" / "output_1_0.raw", 2.0), "state still carries across steps"
    assert _near(tmp_path / "out" / "output_2_0.raw", 1.0)


# --- (c) a zoo card: bit-equal to executorch's Python runtime at every step ----------------------------------


@pytest.mark.qnn
@pytest.mark.parametrize(
    "card_reference, mode",
    [
        ("fixtures.zoo:counter_add", "delegate_mutbuf"),
        ("fixtures.zoo:counter_add", "skip_mutbuf"),
        # A shared-buffer program (inputs and outputs unplanned): the runner supplies the outputs' memory, which
        # QNN writes (without it: "clientBuf is null", exit 9), ordinary memory on the host with --shared_buffer.
        ("fixtures.shared_buffer:shared_buffer_kv_write", "delegate_mutbuf"),
        ("fixtures.shared_buffer:shared_buffer_counter", "skip_mutbuf"),
    ],
)
def test_runner_bit_equal_to_python_runtime(card_reference, mode, runner_binary, toolchain, tmp_path):
    """Both runners run with an emulated device's heap (every fresh allocation holds one byte): the delegated
    buffer is never initialised (docs/FINDINGS.md F1), so without it the two processes read different heap
    bytes at step 0 and differ in the delegated mode only (measured: 2.0 vs 2.6e5 in element 0)."""
    from fixtures import shared_buffer, zoo  # noqa: F401  (registers the cards)
    from harness.device.kinds import EmulatedKind
    from harness.pipeline import card as cards
    from harness.pipeline.lower import lower_case
    from harness.vocabulary import Case, Mode

    case = Case(cards.find(card_reference), "fp16", Mode(mode), SOC)
    lowered = lower_case(case, toolchain, tmp_path / "lowered", STEPS)
    assert lowered.ok, lowered.failure
    files = _raw_inputs(case.card.steps(STEPS), tmp_path / "inputs")
    plan = runner_run.write_plan([("forward", row) for row in files], tmp_path / "plan.txt")
    env = EmulatedKind.heap_environment(runner_run.runner_env(toolchain))
    options = ("--shared_buffer",) if case.card.shared_buffer else ()
    compiled = runner_run.run_plan(runner_binary, lowered.pte, plan, tmp_path / "compiled", env, options)
    assert compiled.exit_code == 0, (compiled.stdout + compiled.stderr)[-3000:]
    assert len(compiled.steps) == STEPS
    assert compiled.io_memory == "ordinary", "the host build has no rpcmem: it must say it used ordinary memory"
    _child(toolchain, "pybindings", str(lowered.pte), str(plan), str(tmp_path / "python"), env=env)
    compared = 0
    for step in range(STEPS):
        for output in sorted((tmp_path / "python").glob(f"output_{step}_*.raw")):
            mine = (tmp_path / "compiled" / output.name).read_bytes()
            assert mine == output.read_bytes(), f"step {step} {output.name}: the runners differ"
            compared += 1
    assert compared >= STEPS, "the Python runtime wrote fewer outputs than steps"
    assert not (tmp_path / "compiled" / f"output_{STEPS}_0.raw").exists()


def test_parity_comparison_catches_a_one_bit_difference(tmp_path):
    """The must-fail input for the bit-equality above: one flipped bit in one float is a difference."""
    data = np.arange(8, dtype=np.float32)
    flipped = data.copy().view(np.uint32)
    flipped[3] ^= 1
    assert data.tobytes() != flipped.tobytes() and np.allclose(data, flipped.view(np.float32))


# --- (d) bad input: one line, a documented exit code ---------------------------------------------------------


def _bad_run(runner_binary, program: Path, plan_text: str | None, tmp_path: Path, *extra: str) -> runner_run.RunnerRun:
    plan = tmp_path / "plan.txt"
    if plan_text is not None:
        plan.write_text(plan_text)
    (tmp_path / "out").mkdir(exist_ok=True)
    completed = subprocess.run(
        [
            str(runner_binary),
            "--model_path",
            str(program),
            "--plan_path",
            str(plan),
            "--output_folder_path",
            str(tmp_path / "out"),
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LD_LIBRARY_PATH": ""},
    )
    return runner_run.parse(completed.returncode, completed.stdout, completed.stderr)


BAD_INPUTS = {
    # name: (plan text with {x} for a good input file, extra args, exit code, words the line must hold)
    "unknown_argument": ("qnnsuite-plan 1\nstep write {x}\n", ("--bogus",), 2, "unknown argument '--bogus'"),
    "bad_performance_mode": ("qnnsuite-plan 1\nstep write {x}\n", ("--performance_mode", "9"), 2, "from 0 to 8"),
    "missing_header": ("step write {x}\n", (), 3, "expected the header"),
    "bad_step_word": ("qnnsuite-plan 1\nrun write {x}\n", (), 3, "expected 'step METHOD"),
    "empty_plan": ("qnnsuite-plan 1\n# nothing\n", (), 3, "has no step"),
    "reload_at_the_end": ("qnnsuite-plan 1\nstep write {x}\nreload\n", (), 3, "ends with 'reload'"),
    "unknown_method": ("qnnsuite-plan 1\nstep forward {x}\n", (), 5, "no such method (it has: "),
    "method_index_beyond": ("qnnsuite-plan 1\nstep @7 {x}\n", (), 5, "@7 names no method of the program (it has 2)"),
    "missing_input_file": ("qnnsuite-plan 1\nstep write {x}.gone\n", (), 6, "cannot read input file"),
    "input_count": ("qnnsuite-plan 1\nstep write {x} {x}\n", (), 7, "2 input file(s) given, the method takes 1"),
    "input_size": ("qnnsuite-plan 1\nstep write {short}\n", (), 7, "has 12 bytes, input 0 takes 32"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_its_exit_code(name, runner_binary, two_method_program, ones_input, tmp_path):
    text, extra, code, words = BAD_INPUTS[name]
    short = tmp_path / "short.raw"
    np.ones(3, dtype=np.float32).tofile(short)
    ran = _bad_run(runner_binary, two_method_program, text.format(x=ones_input, short=short), tmp_path, *extra)
    assert ran.exit_code == code, ran.stderr[-2000:]
    assert runner_run.EXIT_CODES[code]
    errors = [line for line in ran.stderr.splitlines() if line.strip()]
    assert errors == [ran.error_line], f"more than the one line on stderr: {errors}"
    assert words in ran.error_line
    assert not ran.steps and not list((tmp_path / "out").iterdir()), "a bad input must stop before any step"


def test_missing_program_and_plan_are_one_line(runner_binary, tmp_path, ones_input):
    ran = _bad_run(runner_binary, tmp_path / "gone.pte", f"qnnsuite-plan 1\nstep write {ones_input}\n", tmp_path)
    assert ran.exit_code == 4 and "cannot read the program" in (ran.error_line or "")
    (tmp_path / "garbage.pte").write_bytes(b"not a program at all" * 10)
    ran = _bad_run(runner_binary, tmp_path / "garbage.pte", None, tmp_path)
    assert ran.exit_code == 4 and "is it a .pte" in (ran.error_line or ""), ran.stderr[-1000:]
    (tmp_path / "plan.txt").unlink()
    ran = _bad_run(runner_binary, tmp_path / "garbage.pte", None, tmp_path)
    assert ran.exit_code == 3 and "cannot read the plan file" in (ran.error_line or "")


@pytest.mark.qnn
def test_good_plan_gives_no_error_line(runner_binary, two_method_program, ones_input, toolchain, tmp_path):
    """The must-not-match twin of the bad inputs: a valid plan has exit 0 and no runner error line."""
    plan = runner_run.write_plan([("write", [ones_input])], tmp_path / "plan.txt")
    ran = runner_run.run_plan(
        runner_binary, two_method_program, plan, tmp_path / "out", runner_run.runner_env(toolchain)
    )
    assert ran.exit_code == 0 and ran.error_line is None, ran.stderr[-2000:]


@pytest.mark.qnn
def test_a_method_by_index_is_the_programs_method_in_program_order(
    runner_binary, two_method_program, ones_input, toolchain, tmp_path
):
    """ "@N" (what the device run writes when a case names no method: upstream's --method_index) runs the
    program's Nth method; both indices resolve, to the two methods, and the step line names the method."""
    plan = runner_run.write_plan([("@0", [ones_input]), ("@1", [ones_input])], tmp_path / "plan.txt")
    ran = runner_run.run_plan(
        runner_binary, two_method_program, plan, tmp_path / "out", runner_run.runner_env(toolchain)
    )
    assert ran.exit_code == 0 and ran.error_line is None, ran.stderr[-2000:]
    assert sorted(step.method for step in ran.steps) == ["read", "write"]


@pytest.mark.qnn
def test_backend_options_reach_the_qnn_backend(runner_binary, two_method_program, ones_input, toolchain, tmp_path):
    """--log_level and --performance_mode go through executorch's set_option to the QNN backend, which logs
    what it applied; without them it logs neither (the compile spec's level 1 hides the mode line)."""
    plan = runner_run.write_plan([("write", [ones_input])], tmp_path / "plan.txt")
    env = runner_run.runner_env(toolchain)
    given = runner_run.run_plan(
        runner_binary,
        two_method_program,
        plan,
        tmp_path / "given",
        env,
        ("--log_level", "3", "--performance_mode", "2"),
    )
    assert given.exit_code == 0, given.stderr[-2000:]
    log = given.stdout + given.stderr
    assert "create QNN Logger with log_level 3" in log and "performance_mode in htp_options: kHtpBurst" in log
    plain = runner_run.run_plan(runner_binary, two_method_program, plan, tmp_path / "plain", env)
    log = plain.stdout + plain.stderr
    assert "create QNN Logger with log_level 3" not in log and "kHtpBurst" not in log


@pytest.mark.parametrize(
    "method,inputs,words",
    [
        ("write x", ["a.raw"], "not an identifier"),
        ("write", ["a b.raw"], "whitespace"),
        ("write", ["a.raw\nstep read b.raw"], "whitespace"),
        ("write\nstep", ["a.raw"], "not an identifier"),
        ("@x", ["a.raw"], "not an identifier"),
        ("@1 read", ["a.raw"], "not an identifier"),
    ],
)
def test_write_plan_refuses_what_would_break_a_line(method, inputs, words, tmp_path):
    with pytest.raises(runner_run.PlanError, match=words):
        runner_run.write_plan([(method, [Path(name) for name in inputs])], tmp_path / "plan.txt")


def test_write_plan_writes_the_format(tmp_path):
    plan = runner_run.write_plan([("write", [tmp_path / "x.raw"]), ("read", [])], tmp_path / "plan.txt")
    assert plan.read_text() == f"qnnsuite-plan 1\nstep write {tmp_path / 'x.raw'}\nstep read\n"


# --- child processes (they load QNN, so they run with the toolchain's environment) ---------------------------


def _lower_two_method(output: str) -> None:
    """Methods `write` (buf += x) and `read` (buf + x) on one registered buffer, buffers kept outside the
    delegate (skip_mutable_buffer=True) and planned as one shared allocation (share_mutable_buffers).
    `read` also writes the buffer (buf *= 1): a method that only reads a buffer gets it frozen as a constant,
    its registered value, and never sees another method's writes (measured with executorch 1.5.1)."""
    import torch
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_soc_to_chipset_map,
        to_edge_transform_and_lower_to_qnn,
    )
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    class Write(torch.nn.Module):
        def __init__(self, buf: torch.Tensor) -> None:
            super().__init__()
            self.register_buffer("buf", buf)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.buf.add_(x)
            return self.buf + 0

    class Read(Write):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.buf.mul_(1.0)
            return self.buf + x

    buf, example = torch.zeros(1, ROW), (torch.ones(1, ROW),)
    specs = generate_qnn_executorch_compiler_spec(
        soc_model=get_soc_to_chipset_map()[SOC], backend_options=generate_htp_compiler_spec(use_fp16=True)
    )
    edge = to_edge_transform_and_lower_to_qnn(
        {"write": Write(buf), "read": Read(buf)},
        {"write": example, "read": example},
        {"write": specs, "read": specs},
        skip_mutable_buffer=True,
    )
    program = edge.to_executorch(
        ExecutorchBackendConfig(
            passes=[InitializedMutableBufferPass(["buf"])],
            emit_mutable_buffer_names=True,
            memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True),
        )
    )
    Path(output).write_bytes(program.buffer)


def _pybindings(program: str, plan: str, output_dir: str) -> None:
    """The same plan through executorch's Python runtime (one program, each method loaded once)."""
    import torch
    from executorch.runtime import Runtime

    loaded = Runtime.get().load_program(program)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [line.split() for line in Path(plan).read_text().splitlines()[1:] if line.strip()]
    for step, (_, method_name, *files) in enumerate(lines):
        method = loaded.load_method(method_name)
        meta = method.metadata
        inputs = []
        for index, name in enumerate(files):
            info = meta.input_tensor_meta(index)
            array = np.fromfile(name, dtype=_NUMPY_DTYPES[int(info.dtype())])
            inputs.append(torch.from_numpy(array.reshape(tuple(info.sizes()))))
        for index, value in enumerate(method.execute(inputs)):
            value.detach().contiguous().numpy().tofile(out / f"output_{step}_{index}.raw")


# executorch ScalarType codes -> numpy dtypes (harness/emulator/host_runner.py's table; not imported: that
# package is being rewritten, and this reference must not depend on it)
_NUMPY_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 11: "bool"}


if __name__ == "__main__":
    if sys.argv[1] == "lower-two-method":
        _lower_two_method(sys.argv[2])
    elif sys.argv[1] == "pybindings":
        _pybindings(*sys.argv[2:5])
    else:
        sys.exit(f"unknown child entry {sys.argv[1]!r}: lower-two-method or pybindings")
