"""The emulated device's qnn_executor_runner: same flags and files as upstream's, on the HTP simulator.

    python -m harness.emulator.host_runner --model_path M.pte --input_list_path list.txt
        --output_folder_path out [--method_index 0] [--iteration 1]

One process per invocation, like the device runner: the program is loaded once and every line of
the input list runs on that one loaded method, so state carries from line to line. Line i's outputs
are written as out/output_{i}_{k}.raw. The interposer's execute trace goes to out/trace.jsonl (on an
emulated phone only where the harness asked for one, by QNNSUITE_TRACE, as on a phone).
It prints the byte its fresh heap allocations hold (`runner: heap pattern 0x40`, or `none` when they
vary), measured in this process: what a delegated buffer that is never initialised reads.
Fault switches for tests come from $EMULATED_FAULTS_FILE (runner_hang, runner_crash, runner_exit,
runner_killed: SIGKILLed at once, as Android's low-memory killer ends a process,
runner_fewer_outputs, runner_reload_each_line: a broken runner that loses state between steps;
runner_lose_delegate_state: one that refills the delegate's buffers with the heap pattern after each
step, so only state held inside the delegate is lost).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

from harness.runner import contract

# Set on an emulated phone's commands (harness/emulator/phone_runtime.py PHONE_ENV). Spelled here, not
# imported: a repro bundle carries this module and the runner contract, not phone_runtime.
PHONE_ENV = "QNNSUITE_EMULATED_PHONE"

# executorch ScalarType codes -> numpy dtype names (the raw files are plain little-endian arrays)
SCALAR_TYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Upstream's command line, as the runner contract spells it (harness/runner/contract.py)."""
    return contract.executor_arguments(argv)


def read_faults() -> dict:
    path = os.environ.get("EMULATED_FAULTS_FILE")
    if path and Path(path).is_file():
        try:
            faults = json.loads(Path(path).read_text() or "{}")
            # In force only once the device took its first programs (harness/emulator/device_fs.py active_faults;
            # spelled here, not imported: a repro bundle runs this file alone, without the harness).
            pending = faults.get("after_programs")
            return {} if isinstance(pending, int) and pending > 0 else faults
        except json.JSONDecodeError:
            return {}
    return {}


def apply_start_faults(faults: dict) -> None:
    if faults.get("runner_hang"):
        print("runner: hanging (fault switch)", flush=True)
        while True:
            time.sleep(3600)
    if faults.get("runner_crash"):
        print("runner: crashing (fault switch)", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    if faults.get("runner_killed"):
        print("runner: killed (fault switch)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if faults.get("runner_exit") is not None:
        print(f"runner: exiting {faults['runner_exit']} (fault switch)", flush=True)
        sys.exit(int(faults["runner_exit"]))


HEAP_PROBE_BYTES = (64, 4096, 1 << 20)  # small, medium and large (mmap-sized) allocations


def heap_pattern() -> int | None:
    """The byte glibc's MALLOC_PERTURB_ asks fresh allocations to hold, if every probe allocation of this
    process holds only it (a zero heap without the switch is luck, not a pattern)."""
    requested = os.environ.get("MALLOC_PERTURB_", "")
    if not requested.isdigit() or not 0 < int(requested) < 256:
        return None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    seen = set()
    for size in HEAP_PROBE_BYTES:
        address = libc.malloc(size)
        seen |= set(ctypes.string_at(address, size))
        libc.free(address)
    return seen.pop() if seen == {int(requested) ^ 0xFF} else None


def lose_delegate_state(trace: Path, fill: int) -> None:
    """The fault: overwrite every delegated buffer the last execute bound (mutbuf inputs) with fill."""
    lines = trace.read_text().splitlines() if trace.exists() else []
    if not lines:
        return
    for tensor in json.loads(lines[-1])["inputs"]:
        if "_mutbuf_" in tensor["name"] and tensor.get("mem") == "raw":
            ctypes.memset(int(tensor["addr"], 16), fill, int(tensor["bytes"]))


def runtime():
    """ExecuTorch's runtime extension, as portable_lib.py re-exports it but without that file's
    `import executorch.exir` (for a warning class: 2.9 s and 130 MB more in every process that has it, which
    made each run forked from the runner server twice as dear to fork and to end: 40 vs 21 ms, measured)."""
    import torch  # noqa: F401  the extension links against libtorch, which must be loaded first (portable_lib.py does so)

    try:
        from executorch.extension.pybindings import _C as extension
    except ImportError:  # executorch before 1.4 named it _portable_lib
        from executorch.extension.pybindings import _portable_lib as extension
    return extension


def method_name(model_path: Path, names: list[str], index: int) -> str:
    """--method_index counts methods in the program's order, as upstream's runner does
    (Program::get_method_name); the module lists them in no particular order (measured with the Meta llama
    flow's metadata methods)."""
    if len(names) == 1:
        return names[index]
    return runtime()._load_program(str(model_path)).get_method_name(index)


def write_new(path: Path, array) -> None:
    """Write an output file, replacing a file there but never following a link there (the folder is the
    device's: a device shell could plant one pointing at a host file)."""
    with suppress(FileNotFoundError):
        if path.is_symlink():
            path.unlink()
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "wb") as out:
        array.tofile(out)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # First, before any library logs: a line of its own that nothing else writes into.
    pattern = heap_pattern()
    print(f"runner: heap pattern {'none' if pattern is None else f'0x{pattern:02x}'}", flush=True)
    faults = read_faults()
    apply_start_faults(faults)
    output_dir = Path(args.output_folder_path)
    output_dir.mkdir(parents=True, exist_ok=True)
    if PHONE_ENV not in os.environ:  # a phone has a trace only where the harness pushed its interposer
        (output_dir / contract.TRACE_NAME).unlink(missing_ok=True)
        # Made here, never through a link, and named by descriptor: a link planted in its place meanwhile (by a
        # device shell, the folder being the device's) cannot send the interposer's writes elsewhere.
        try:
            trace = os.open(
                output_dir / contract.TRACE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
            )
        except FileExistsError:
            print(
                f"runner: {output_dir / contract.TRACE_NAME} appeared while the runner made it; run again",
                file=sys.stderr,
            )
            return 2
        # A jailed device command has no /proc (harness/emulator/jail.py): there the path, which inside the jail
        # reaches nothing outside the device's own folders.
        proc = os.path.isdir("/proc/self/fd")
        trace_name = f"/proc/self/fd/{trace}" if proc else str(output_dir / contract.TRACE_NAME)
        os.environ[contract.TRACE_VARIABLE] = trace_name

    import numpy as np
    import torch

    _load_for_executorch = runtime()._load_for_executorch

    model_path = Path(args.model_path)
    if not model_path.is_file():
        print(f"runner: model not found: {model_path}", file=sys.stderr)
        return 2
    try:  # loading is lazy: a corrupt program shows when its methods are first read
        module = _load_for_executorch(str(model_path))
        method = method_name(model_path, module.method_names(), args.method_index)
        meta = module.method_meta(method)
    except Exception as error:
        print(f"runner: cannot load {model_path}: {error}", file=sys.stderr)
        return 3
    lines = contract.read_input_list(Path(args.input_list_path))
    started = time.perf_counter()
    for iteration in range(args.iteration):
        for line_index, files in enumerate(lines):
            inputs = []
            for index, name in enumerate(files):
                info = meta.input_tensor_meta(index)
                array = np.fromfile(name, dtype=SCALAR_TYPES[int(info.dtype())]).reshape(info.sizes())
                inputs.append(torch.from_numpy(array))
            if faults.get("runner_reload_each_line") and line_index:
                module = _load_for_executorch(str(model_path))
            outputs = module.run_method(method, tuple(inputs))
            if faults.get("runner_lose_delegate_state"):
                lose_delegate_state(output_dir / contract.TRACE_NAME, pattern or 0)
            if iteration != args.iteration - 1:
                continue
            count = len(outputs) - (1 if faults.get("runner_fewer_outputs") else 0)
            for index, output in enumerate(outputs[:count]):
                write_new(output_dir / contract.output_name(line_index, index), output.detach().contiguous().numpy())
    elapsed_ms = (time.perf_counter() - started) * 1000
    print(f"runner: {len(lines)} line(s) x {args.iteration} iteration(s) in {elapsed_ms:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
