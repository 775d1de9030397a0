"""The suite's fork service, declared once: what it keeps imported and what each request runs.

- lowering_server: at most one per run, started by the controller (harness/session.py) with the toolchain's
  child_env once collection shows a case the artifact cache lacks. A fresh `python -m harness.pipeline.lower_job` spent about 5 s importing torch, executorch's exir,
  the QNN quantizer and partitioner before lowering anything, on cases whose export, quantization and lowering
  take 2-9 s. The server also reads each card x dtype's quantized program once, before it forks the first
  lowering that starts from it, instead of each of its four lowerings reading it (up to 1.7 s for a llama
  slice). Every case still gets a process of its own (a crash fails one case; the QNN log printed by C++
  to fd 2 is captured per case; no program is run in the process that lowered it), it just starts imported.

The emulated devices had a runner server too, until their programs ran through the suite's compiled runner,
a fresh process in the device's jail that costs less than a forked Python child did (docs/PERFORMANCE.md).

No QNN library is loaded by these imports (fork_server checks); each child dlopens its own. Only names here:
importing this module costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Service:
    name: str  # also in the server's command line, so its processes can be recognised
    entry: str  # module whose main(argv) serves one request; `python -m entry ARGV` is the same request, slowly
    preload: tuple[str, ...]  # imported once by the server, before any request
    # "module:function" called once at server start, returning the per-request entry (default: entry's main)
    server_entry: str | None = None
    # "module:function" called in the server with a request's argv just before its child is forked: what it
    # loads, that child and every later one start with (harness/process/fork_server.py)
    prepare: str | None = None

    def __post_init__(self) -> None:
        SERVICES[self.name] = self


SERVICES: dict[str, Service] = {}

LOWERING = Service(
    "lowering_server",
    "harness.pipeline.lower_job",
    (
        "numpy",
        "torch",
        "torchao.quantization.pt2e.quantize_pt2e",
        "executorch.exir",
        "executorch.exir.passes.init_mutable_pass",
        "executorch.backends.qualcomm.quantizer.quantizer",
        "executorch.backends.qualcomm.utils.utils",
        "executorch.backends.qualcomm._passes.qnn_pass_manager",
        "executorch.extension.llm.export.partitioner_lib",
        "harness.pipeline.stages",
        "harness.pipeline.eager",
    ),
    server_entry="harness.pipeline.lower_job:server_entry",  # torch.export warmed up before any fork
    prepare="harness.pipeline.lower_job:prepare_in_server",
)  # a card's quantized program read once, not per case
