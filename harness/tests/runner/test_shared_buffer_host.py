"""docs/FINDINGS.md#F20, pinned: executorch's QNN backend outside Android marks its shared-buffer manager ready
without loading rpcmem, so QnnExecuTorchAllocCustomMem calls a null function pointer and the process dies
with SIGSEGV instead of getting null back. The suite's runner therefore never asks for rpcmem in a build for
another OS (suite_runner.cpp kHasRpcmem). When executorch fixes it, the call returns null (or memory) and
this test fails: then update F20 and let the host runner try rpcmem."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from harness.runner import build as runner_build

CALL = """
import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
alloc = library.QnnExecuTorchAllocCustomMem
alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
free = library.QnnExecuTorchFreeCustomMem
free.restype, free.argtypes = None, [ctypes.c_void_p]
print("calling", flush=True)
pointer = alloc(64, 64)
print("returned", pointer, flush=True)
"""


def _library() -> str:
    library = runner_build.find_executorch().lib / "libexecutorch_backend_qnn.so"
    if not library.is_file():
        pytest.fail(f"{library} is missing: the executorch wheel under test ships no QNN backend", pytrace=False)
    return str(library)


def _call(code: str, toolchain) -> subprocess.CompletedProcess:
    """code run in a fresh Python with the backend library's path as its argument (a crash ends only it)."""
    return subprocess.run(
        [sys.executable, "-c", code, _library()],
        env=toolchain.child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.qnn
def test_host_alloc_custom_mem_crashes_F20(toolchain):
    completed = _call(CALL, toolchain)
    assert "calling" in completed.stdout, completed.stderr[-2000:]
    assert completed.returncode == -signal.SIGSEGV, (
        f"QnnExecuTorchAllocCustomMem on the host ended with {completed.returncode} ({completed.stdout.strip()!r}), "
        "not SIGSEGV: F20 looks fixed in this executorch; update docs/FINDINGS.md#F20 and suite_runner.cpp kHasRpcmem"
    )


@pytest.mark.qnn
def test_host_free_of_null_does_not_crash(toolchain):
    """The twin that must not crash: the library loads and another entry point of the same manager runs (freeing
    null is refused with a log line), so the crash above is the allocator's, not the library's load."""
    call = CALL.split('print("calling"')[0] + "free(None)\nprint('freed', flush=True)\n"
    completed = _call(call, toolchain)
    assert completed.returncode == 0 and "freed" in completed.stdout, (completed.stdout + completed.stderr)[-2000:]
