"""Child process that turns one case into a .pte plus facts: `python -m harness.pipeline.lower_job REQUEST`,
or the same entry point in a child forked by the run's lowering server (harness/process/services.py).

A child per lowering because running a program in the process that lowered it crashed (measured),
because a crash in executorch must fail one case and not the pytest worker, and because the QNN
log (printed by C++ to fd 2) is only cleanly captured per process. The request and the facts are
typed (harness.pipeline.facts); see harness.pipeline.lower.
"""

from __future__ import annotations

import hashlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from harness.files import write_bytes_atomically
from harness.pipeline.facts import (
    LoweringFacts,
    LoweringRequest,
    PartitionFacts,
    ProgramFacts,
    QuantizationFailed,
    lowering_error,
    quantizes,
)
from harness.pipeline.structure import OpTypeRecorder, graphs_of, structure_of
from harness.vocabulary import Mode


def main(argv: list[str]) -> int:
    """argv: [the request's JSON file]."""
    request = LoweringRequest.read(Path(argv[0]))
    out_dir = Path(request.out_dir)
    facts = LoweringFacts()
    recorder = OpTypeRecorder()  # the QNN op types of the graphs this lowering makes (structure.py)
    started = time.perf_counter()

    def stage_done(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        facts.timings_s[name] = round(now - started, 3)
        started = now

    try:
        from harness.pipeline import card as card_registry
        from harness.pipeline.eager import build_model

        card = card_registry.find(request.card)
        model = build_model(card)
        calibration = card.steps(request.steps)
        stage_done("import_and_build")
        recorder.start()
        _lower_plan(request, card, model, calibration, facts, stage_done, recorder)
        program = (out_dir / "model.pte").read_bytes()  # every path: what the cache checks before serving it
        facts.program = ProgramFacts(hashlib.sha256(program).hexdigest(), len(program))
    except QuantizationFailed as failed:  # here, or in the case that made the card and dtype's entry
        facts.error, facts.quantized = failed.error, failed.made
    except Exception as error:
        facts.error = lowering_error(error, traceback.format_exc())
    finally:
        recorder.stop()
    facts.write(out_dir / "facts.json")
    return 0


def _lower_plan(
    request: LoweringRequest, card, model, calibration: list[tuple], facts: LoweringFacts, stage_done, recorder
) -> None:
    """The card's methods (forward alone for a single-method card) exported, quantized as a program each
    calibrated along the plan (as users do, which is where two encodings of one buffer come from) and lowered
    together, then serialized with share_mutable_buffers as the case says. The export facts and the quantized
    methods are the card's and the card x dtype's shared entries (prepared.py)."""
    from harness.pipeline import prepared, stages

    examples = {method: rows[0] for method, rows in stages.method_calibration(card, calibration).items()}
    facts.export, facts.exported = prepared.export_facts(_path(request.exported_dir), card, model, examples, stage_done)
    methods = {method: stages.method_view(model, method) for method in card.method_names}
    if quantizes(request.dtype, request.mode):
        shared = prepared.quantized(
            _path(request.prepared_dir),
            card,
            model,
            request.dtype,
            calibration,
            stage_done,
            facts.export.methods or None,
        )
        facts.quantize, facts.quantized, methods = shared.facts, shared.made, shared.module
        facts.buffer_encodings, facts.modelled = shared.buffer_encodings, shared.modelled
    if request.mode is Mode.META_LLAMA:
        _lower_meta_llama(request, card, len(model.layers), facts, recorder)
        stage_done("export_llama")
        return
    edge = stages.lower(
        methods,
        examples,
        request.soc,
        request.dtype,
        request.mode.skip_mutable_buffer,
        online_prepare=card.online_prepare,
        profile_level=request.profile_level,
        shared_buffer=card.shared_buffer,
    )
    facts.partitions = PartitionFacts.of(stages.partition_facts(edge, card))
    graphs = graphs_of(edge, card.method_names, recorder)
    stage_done("lower")
    program = edge.to_executorch(stages.backend_config(card, request.share_mutable_buffers))
    if card.multi_method:  # a single-method program's facts name no methods
        facts.methods = [plan.name for plan in program.executorch_program.execution_plan]
    write_bytes_atomically(Path(request.out_dir) / "model.pte", program.buffer)
    facts.structure = structure_of(graphs, program)
    stage_done("serialize")


def _path(text: str) -> Path | None:
    return Path(text) if text else None


def server_entry() -> Callable[[list[str]], int]:
    """Called once when the lowering server starts (harness/process/services.py): a tiny stateful module
    exported, quantized and exported again, so that every forked child starts with these paths warmed up.

    A process's first export, quantization and lowering of a quantized program cost more than its next ones
    (caches and lazy initialisation filled on first use). A lowering that reads its card's prepared program
    neither exports nor quantizes before it lowers, so without this each child paid those first-use costs
    inside the lowering (measured: 1.2-1.5 s more per quantized case, all of the prepared program's saving).
    Its tensors have two elements, below any parallel kernel's grain: no thread pool starts, and no thread
    may (a forked child would lack it): checked, or the server does not start.
    """
    import os

    import torch
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from tqdm import tqdm

    class Warm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("state", torch.zeros(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.state.add_(x)
            return self.state.clone()

    tqdm.monitor_interval = 0  # no progress-bar monitor thread (torch._dynamo makes a tqdm)
    threads = len(os.listdir("/proc/self/task"))
    example = (torch.ones(2),)
    torch.export.export(Warm(), example, strict=True).run_decompositions({})
    prepared = prepare_pt2e(torch.export.export(Warm(), example).module(), QnnQuantizer())
    prepared(*example)
    torch.export.export(convert_pt2e(prepared), example, strict=True).run_decompositions({})
    started = len(os.listdir("/proc/self/task")) - threads
    if started:
        raise RuntimeError(f"warming the lowering up started {started} thread(s), which forked children would lack")
    return main


def prepare_in_server(argv: list[str]) -> None:
    """Called by the lowering server just before it forks the child for a request (harness/process/services.py):
    the card's module is imported and its quantized program in the dtype read there once, for every child
    that lowers the card and dtype, instead of in each (harness/pipeline/prepared.py preload)."""
    from harness.pipeline import card as card_registry, prepared

    request = LoweringRequest.read(Path(argv[0]))
    card_registry.find(request.card)
    if request.prepared_dir:
        prepared.preload(Path(request.prepared_dir))


def _lower_meta_llama(request: LoweringRequest, card, n_layers: int, facts: LoweringFacts, recorder) -> None:
    """executorch's export flow (it quantizes, lowers and writes model.pte itself), first with
    ConvertBmmToMatmul made a no-op, for the record: the count, or why it did not lower."""
    from harness.pipeline import meta_llama, stages

    out_dir = Path(request.out_dir)
    try:
        without = meta_llama.export(n_layers, request.dtype, request.soc, out_dir / "without_convert_bmm", False)
        facts.partitions_without_convert_bmm = PartitionFacts.of(stages.partition_facts(without.edge_manager, card))
    except Exception as error:
        text = str(error).strip()
        facts.without_convert_bmm_error = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    builder = meta_llama.export(n_layers, request.dtype, request.soc, out_dir)
    facts.partitions = PartitionFacts.of(stages.partition_facts(builder.edge_manager, card))
    methods = [plan.name for plan in builder.export_program.executorch_program.execution_plan]
    facts.method_index = methods.index("forward")  # the runtime numbers methods in this order
    graphs = graphs_of(builder.edge_manager, ("forward",), recorder)  # serialized already: out variants included
    facts.structure = structure_of(graphs, builder.export_program)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
