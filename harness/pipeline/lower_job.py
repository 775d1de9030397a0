"""Child process that turns one case into a .pte plus facts: `python -m harness.pipeline.lower_job REQUEST`,
or the same entry point in a child forked by the run's lowering server (harness.pipeline.lower_server).

A child per lowering because running a program in the process that lowered it crashed (FACTS.md),
because a crash in executorch must fail one case and not the pytest worker, and because the QNN
log (printed by C++ to fd 2) is only cleanly captured per process. The request and the facts are
JSON; see harness.pipeline.lower.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    """argv: [the request's JSON file]."""
    request = json.loads(Path(argv[0]).read_text())
    out_dir = Path(request["out_dir"])
    facts: dict = {"timings_s": {}, "error": None}
    started = time.perf_counter()

    def stage_done(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        facts["timings_s"][name] = round(now - started, 3)
        started = now

    try:
        from harness.pipeline import card as card_registry
        from harness.pipeline import stages
        from harness.pipeline.eager import build_model

        card = card_registry.find(request["card"])
        model = build_model(card)
        calibration = card.steps(request["steps"])
        example = calibration[0]
        stage_done("import_and_build")
        facts["export"] = stages.export_facts(card, model, example)
        stage_done("export")
        if request["dtype"] != "fp16":
            model, facts["quantize"] = stages.quantize(card, model, request["dtype"], calibration)
            stage_done("quantize")
        if request["lowering"] == "meta_llama":
            without = stages.lower_meta_llama(build_model(card), example, request["soc"], convert_bmm_to_matmul=False)
            facts["partitions_without_convert_bmm"] = stages.partition_facts(without, card.mutated_buffers)
            edge = stages.lower_meta_llama(model, example, request["soc"], convert_bmm_to_matmul=True)
        else:
            edge = stages.lower(model, example, request["soc"], request["dtype"], request["skip_mutable_buffer"])
        facts["partitions"] = stages.partition_facts(edge, card.mutated_buffers)
        stage_done("lower")
        program = edge.to_executorch(stages.backend_config(card))
        (out_dir / "model.pte").write_bytes(program.buffer)
        stage_done("serialize")
    except Exception as error:
        facts["error"] = {"type": type(error).__name__, "message": str(error).strip().splitlines()[0] if str(error).strip() else "",
                          "traceback": traceback.format_exc()}
    (out_dir / "facts.json").write_text(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
