"""The runner contract, in one place: what either device runner reads and writes, and how it is started.

Two runners take a program and inputs and write outputs: the suite's compiled `suite_runner`
(suite_runner.cpp: a step plan, every step in one process) and upstream's `qnn_executor_runner` (an input
list, one line per step, one method per process; on emulated devices harness/emulator/host_runner.py).
Everything that starts one, on a device (harness/device/execute.py), on the host (harness/runner/run.py, a
repro bundle's repro.py, the matrix's cross runs) or inside an emulated device (harness/emulator/), builds
and reads its command line here, names its files here and gives it the heap environment here: no other
module spells a runner flag (harness/tests/runner/test_contract.py). A repro bundle carries this module.

Kept light to import (no numpy, dataclasses or subprocess at import time): an emulated device's runner
command imports it at every start.
"""

from __future__ import annotations

import itertools
from pathlib import Path

SUITE_RUNNER = "suite_runner"  # the payload command names (harness/device/payload.py spells them too)
EXECUTOR_RUNNER = "qnn_executor_runner"

# The files of a run: the program, the step plan (suite_runner) or input list (qnn_executor_runner) beside
# the inputs, and the outputs folder with each step's outputs, the interposer's trace and the ETDump.
MODEL_NAME = "model.pte"
REFERENCE_MODEL_NAME = "reference.pte"  # suite_runner's reference program (--reference_model_path), beside it
PLAN_NAME = "plan.txt"
INPUT_LIST_NAME = "input_list.txt"
OUTPUTS_DIR = "outputs"
TRACE_NAME = "trace.jsonl"
ETDUMP_NAME = "profile.etdp"
TRACE_VARIABLE = "QNNSUITE_TRACE"  # read by the interposer (harness/qnn/interposer.c)
# The interposer's test-only fault: one QNN memory registration leaked per graph execute (interposer.c's header;
# an emulated device's fault switch runner_leak_registration sets it: harness/emulator/compiled_runner.py).
LEAK_REGISTRATION_VARIABLE = "QNNSUITE_LEAK_REGISTRATION"
PLAN_HEADER = "qnnsuite-plan 1"  # suite_runner.cpp's plan format, first line

_MODEL = "--model_path"
_PLAN = "--plan_path"
_INPUT_LIST = "--input_list_path"
_OUTPUTS = "--output_folder_path"
_METHOD_INDEX = "--method_index"
_SHARE_ARENAS = "--share_memory_arenas"
_SHARED_BUFFER = "--shared_buffer"
_ETDUMP = "--etdump_path"
_REFERENCE = "--reference_model_path"
# Every flag of either runner (suite_runner.cpp's option loop; upstream's qnn_executor_runner as
# host_runner.py takes them): the architecture test looks for these outside this package.
SUITE_RUNNER_FLAGS = (
    _MODEL,
    _PLAN,
    _OUTPUTS,
    "--log_level",
    "--performance_mode",
    _SHARE_ARENAS,
    _SHARED_BUFFER,
    _ETDUMP,
    _REFERENCE,
)
EXECUTOR_RUNNER_FLAGS = (
    _MODEL,
    _INPUT_LIST,
    _OUTPUTS,
    _METHOD_INDEX,
    "--iteration",
    "--warm_up",
    _SHARED_BUFFER,
    _ETDUMP,
)
RUNNER_FLAGS = tuple(dict.fromkeys(SUITE_RUNNER_FLAGS + EXECUTOR_RUNNER_FLAGS))

# The emulated heap: glibc fills malloc'd memory with MALLOC_PERTURB_ ^ 0xff, except chunks handed out from
# the per-thread cache (they keep a freed chunk's bytes): the cache is switched off. Read at process start.
_NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"
# Cost only, the fill is the same: the host libQnnHtp.so has a 5.5 MB thread-local block, which each of a
# runner's 13 simulator threads mallocs and writes twice (the fill, then zeros) on every run. Blocks of 1 MB
# and more are mmapped and marked for transparent huge pages where the kernel offers them (madvise mode):
# half the runner's page faults and 10% of its CPU (114-130 vs 134-144 ms a run, measured).
_HUGE_PAGES = ("glibc.malloc.mmap_threshold=1048576", "glibc.malloc.hugetlb=1")
HEAP_TUNABLES = (_NO_THREAD_CACHE, *_HUGE_PAGES)


def input_name(step: int, index: int) -> str:
    return f"input_{step}_{index}.raw"


def output_name(step: int, index: int) -> str:
    """What either runner calls output `index` of step `step` in its outputs folder."""
    return f"output_{step}_{index}.raw"


def heap_environment(env: dict[str, str], pattern: int | None) -> dict[str, str]:
    """env plus what makes every fresh heap allocation of a runner hold `pattern` (None: env as it is), and
    huge pages for large blocks; a GLIBC_TUNABLES the caller set is kept, less the tunables set here."""
    if pattern is None:
        return env
    ours = {tunable.partition("=")[0] for tunable in HEAP_TUNABLES}
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t.partition("=")[0] not in ours]
    return {**env, "MALLOC_PERTURB_": str(pattern ^ 0xFF), "GLIBC_TUNABLES": ":".join([*tunables, *HEAP_TUNABLES])}


def write_inputs(steps: list[tuple], directory: Path) -> list[list[Path]]:
    """One raw file per input per step (a tensor's or array's bytes, C order), [step][index]."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for step, inputs in enumerate(steps):
        row = []
        for index, tensor in enumerate(inputs):
            path = directory / input_name(step, index)
            np.ascontiguousarray(tensor.detach().numpy() if hasattr(tensor, "detach") else tensor).tofile(path)
            row.append(path)
        files.append(row)
    return files


def write_input_list(rows: list[list[str]], path: Path) -> Path:
    """qnn_executor_runner's input list: a line per step, its input files."""
    path.write_text("".join(" ".join(map(str, row)) + "\n" for row in rows))
    return path


def read_input_list(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def plan_options(methods: list[str]) -> list[str]:
    """The options a plan needs: one Module's planned arenas for every method when it runs several (what an
    application sharing state across methods needs, and programs exported with share_mutable_buffers rely
    on: suite_runner.cpp's --share_memory_arenas)."""
    return [_SHARE_ARENAS] if len(set(methods)) > 1 else []


def suite_runner_argv(
    model: str,
    plan: str,
    outputs: str,
    methods: list[str],
    etdump: str | None = None,
    shared_buffer: bool = False,
    reference: str | None = None,
) -> list[str]:
    """suite_runner's arguments (after its own path) for a plan whose steps run `methods`; reference: a program
    executed once after each step in a Module of its own, timed (the performance gate's drift meter)."""
    argv = [_MODEL, model, _PLAN, plan, _OUTPUTS, outputs, *plan_options(methods)]
    argv += [_ETDUMP, etdump] if etdump else []
    argv += [_REFERENCE, reference] if reference else []
    return argv + ([_SHARED_BUFFER] if shared_buffer else [])


def executor_runner_argv(
    model: str, input_list: str, outputs: str, method_index: int | None = 0, shared_buffer: bool = False
) -> list[str]:
    """qnn_executor_runner's arguments (after its own path); method_index None: the runner's default."""
    argv = [_MODEL, model, _INPUT_LIST, input_list, _OUTPUTS, outputs]
    argv += [_METHOD_INDEX, str(int(method_index))] if method_index is not None else []
    return argv + ([_SHARED_BUFFER] if shared_buffer else [])


def _option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def model_of(argv: list[str]) -> str | None:
    return _option(argv, _MODEL)


def plan_of(argv: list[str]) -> str | None:
    return _option(argv, _PLAN)


def outputs_of(argv: list[str]) -> str | None:
    return _option(argv, _OUTPUTS)


def with_plan(argv: list[str], plan: str, outputs: str) -> list[str]:
    """suite_runner's argv with another plan and outputs folder (its other options kept)."""
    changed = list(argv)
    for flag, value in ((_PLAN, plan), (_OUTPUTS, outputs)):
        changed[changed.index(flag) + 1] = value
    return changed


def runs_a_program(command: str) -> bool:
    """A device shell command that starts a runner on a program (the emulated device's fault switches)."""
    return _MODEL in command


def executor_arguments(argv: list[str]):
    """qnn_executor_runner's command line, parsed (argparse.Namespace: model_path, input_list_path,
    output_folder_path, method_index, iteration, warm_up, shared_buffer, etdump_path)."""
    import argparse

    parser = argparse.ArgumentParser(prog=EXECUTOR_RUNNER)
    parser.add_argument(_MODEL, required=True)
    parser.add_argument(_INPUT_LIST, required=True)
    parser.add_argument(_OUTPUTS, required=True)
    parser.add_argument(_METHOD_INDEX, type=int, default=0)
    parser.add_argument("--iteration", type=int, default=1)
    parser.add_argument("--warm_up", type=int, default=0)
    parser.add_argument(_SHARED_BUFFER, action="store_true")
    parser.add_argument(_ETDUMP, default="")
    return parser.parse_args(argv)


def read_outputs(folder: Path, counts: list[int]) -> tuple[list[list], list[str]]:
    """The runner's output files as flat byte arrays [step][index] (counts: the outputs of each step), and
    the names of those it did not write ([] when none is missing)."""
    import numpy as np

    names = [[output_name(step, index) for index in range(count)] for step, count in enumerate(counts)]
    missing = [name for row in names for name in row if not (folder / name).is_file()]
    if missing:
        return [], missing
    return [[np.fromfile(folder / name, dtype=np.uint8) for name in row] for row in names], []


def written_outputs(folder: Path, steps: int) -> list[list]:
    """Every output file a runner wrote for each step, in index order up to the first gap."""
    import numpy as np

    rows = []
    for step in range(steps):
        row, index = [], 0
        while (folder / output_name(step, index)).is_file():
            row.append(np.fromfile(folder / output_name(step, index), dtype=np.uint8))
            index += 1
        rows.append(row)
    return rows


def trace_of(folder: Path) -> Path | None:
    """The interposer's execute trace in a run's outputs folder, when one was written."""
    path = folder / TRACE_NAME
    return path if path.is_file() else None


def read_trace(path: Path) -> list[dict]:
    """The interposer's execute trace as records, one per line ([] when there is none)."""
    import json

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# Each execute record of the trace carries the process's QNN memory registrations so far, counted by the
# interposer since the library was loaded (harness/qnn/interposer.c): {"registrations": {"register_calls": N,
# "registered": N, "deregistered": N}}; a trace of an older interposer has none.


def _executes_with_counts(records: list[dict]) -> list[dict] | None:
    """The execute records' registration counts, in order; None when one has none (an older interposer)."""
    counts = [record.get("registrations") for record in records if record.get("event") == "execute"]
    if not counts or not all(isinstance(found, dict) for found in counts):
        return None
    return counts


def register_calls_per_execute(records: list[dict]) -> list[int]:
    """QnnMem_register calls made for each graph execute: since the process's previous one (the first's include
    those made at load); [] when the trace has no counts. A new process (another pid) starts from zero."""
    counts = _executes_with_counts(records)
    if counts is None:
        return []
    pids = [record.get("pid") for record in records if record.get("event") == "execute"]
    calls, before = [], 0
    for index, found in enumerate(counts):
        if index and pids[index] != pids[index - 1]:
            before = 0
        calls.append(int(found.get("register_calls", 0)) - before)
        before = int(found.get("register_calls", 0))
    return calls


def held_registrations(records: list[dict]) -> list[int]:
    """The memory handles the process held registered at each graph execute (registered minus deregistered so
    far); [] when the trace has no counts."""
    counts = _executes_with_counts(records)
    if counts is None:
        return []
    return [int(found.get("registered", 0)) - int(found.get("deregistered", 0)) for found in counts]


def per_step(per_execute: list[int], steps: int) -> list[int]:
    """A per-graph-execute series as one value per runner step: the value at each step's last graph execute
    when every step made the same number of them (a method of k graphs executes k times a step); [] when the
    executes cannot be told apart by step (none, or a count that is not a multiple of the steps)."""
    if steps <= 0 or not per_execute or len(per_execute) % steps:
        return []
    width = len(per_execute) // steps
    return [per_execute[(step + 1) * width - 1] for step in range(steps)]


def executes_per_step(graphs: list[str], methods: list[str]) -> list[int] | None:
    """How many graph executes each step made, from the executed graphs' names in order and the method each step
    ran: the one split of the executes in which every step of a method executes the same graphs in the same
    order and no graph is two methods' (a method of k graphs executes k times a step, another method another
    number). None when no split fits or more than one does (graphs whose names cannot tell them apart), and
    for a method that executes no graph (a step without an execute could be any step's)."""
    found: list[list[int]] = []

    def split(step: int, at: int, owned: dict[str, tuple[str, ...]], counts: list[int]) -> None:
        # the steps whose method's graphs are known already follow without a choice
        while step < len(methods) and methods[step] in owned:
            known = owned[methods[step]]
            if tuple(graphs[at : at + len(known)]) != known:
                return
            step, at, counts = step + 1, at + len(known), [*counts, len(known)]
        if step == len(methods):
            if at == len(graphs):
                found.append(counts)
            return
        others = {graph for names in owned.values() for graph in names}
        for count in range(1, len(graphs) - at + 1):
            names = tuple(graphs[at : at + count])
            if others & set(names) or len(found) > 1:
                return  # a longer run of this method's graphs would hold another's graph too
            split(step, at, {**owned, methods[step]: names}, counts)

    split(0, 0, {}, [])
    return found[0] if len(found) == 1 else None


def step_registrations(trace: Path | None, steps: int, methods: list[str] | None = None) -> list[int]:
    """The registrations held at each runner step's execute, from a run's trace ([] without one or its counts,
    or when its executes cannot be told apart by step). methods: the method each step ran (None: one method):
    a plan whose methods execute different numbers of graphs is split by the graphs' names."""
    if trace is None:
        return []
    records = read_trace(trace)
    held = held_registrations(records)
    if not methods or len(set(methods)) == 1 or not held:
        return per_step(held, steps)
    graphs = [str(record.get("graph", "")) for record in records if record.get("event") == "execute"]
    counts = executes_per_step(graphs, methods) if len(methods) == steps else None
    if counts is None:
        return []
    return [held[end - 1] for end in itertools.accumulate(counts)]  # at each step's last execute
