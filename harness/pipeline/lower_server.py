"""The run's lowering server: torch, executorch and the QNN AOT modules imported once, a forked child per case.

    python -m harness.pipeline.lower_server --socket PATH

Why: a fresh `python -m harness.pipeline.lower_job` spent about 5 s importing torch, executorch's exir,
the QNN quantizer and partitioner before lowering anything, on cases whose export, quantization and
lowering take 2-9 s. This is harness.fork_server with lower_job.main as the entry point: every case
still gets a process of its own (a crash fails one case; the QNN log printed by C++ to fd 2 is captured
per case; no program is run in the process that lowered it), it just starts already imported.
No QNN library is loaded by these imports (fork_server checks); each child dlopens its own.

The controller starts one per run with the toolchain's child_env and stops it at the end; every worker's
lower_case hands its cases to it (and runs `python -m harness.pipeline.lower_job` itself when there is
no server).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness import fork_server
from harness.pipeline import lower_job

PRELOADED_MODULES = (
    "numpy", "torch", "torchao.quantization.pt2e.quantize_pt2e", "executorch.exir",
    "executorch.exir.passes.init_mutable_pass", "executorch.backends.qualcomm.quantizer.quantizer",
    "executorch.backends.qualcomm.utils.utils", "executorch.backends.qualcomm._passes.qnn_pass_manager",
    "executorch.extension.llm.export.partitioner_lib", "harness.pipeline.stages", "harness.pipeline.eager",
)


def spawn_server(socket_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the lowering server without waiting (fork_server.wait_until_serving waits). Its log is PATH.log."""
    return fork_server.spawn_server(__name__, socket_path, env)


def main() -> None:
    fork_server.main(__doc__.splitlines()[0], PRELOADED_MODULES, lower_job.main, lower_job.__file__)


if __name__ == "__main__":
    main()
