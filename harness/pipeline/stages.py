"""The stages of one case, in the order data flows: export -> quantize -> lower -> serialize.

Runs inside the lowering child (harness.pipeline.lower_job), which imports executorch; the host side
never imports this module. Each stage returns facts (plain JSON data) that the checks read later.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from harness.pipeline.card import ModelCard

QUANT_DTYPES = {"16a8w": "use_16a8w", "8a8w": "use_8a8w", "16a4w": "use_16a4w"}


def export_facts(card: ModelCard, model: torch.nn.Module, example: tuple) -> dict[str, Any]:
    """buffers_to_mutate appear only after run_decompositions() (torch.export alone lists none)."""
    program = torch.export.export(copy.deepcopy(model), example).run_decompositions({})
    mutated = dict(program.graph_signature.buffers_to_mutate)
    return {"buffers_to_mutate": sorted(set(mutated.values())), "expected": sorted(card.mutated_buffers)}


def quantize(
    card: ModelCard, model: torch.nn.Module, dtype: str, calibration: list[tuple]
) -> tuple[torch.nn.Module, dict]:
    """PTQ with QnnQuantizer; MinMaxObserver so state that grows step by step is not clipped.

    Calibration runs the model, which mutates its buffers; they are reset to their registered values
    afterwards so calibration never leaks into the initial state the device starts from.
    """
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    initial = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    quantizer = QnnQuantizer()
    quantizer.set_default_quant_config(getattr(QuantDtype, QUANT_DTYPES[dtype]), act_observer=MinMaxObserver)
    graph_module = torch.export.export(model, calibration[0]).module()
    readers_before = buffer_readers(graph_module, card.mutated_buffers)
    prepared = prepare_pt2e(graph_module, quantizer)
    annotated = annotated_buffer_inputs(prepared, card.mutated_buffers)
    for inputs in calibration:
        prepared(*inputs)
    converted = convert_pt2e(prepared)
    _restore_buffers(converted, initial)
    readers_after = buffer_readers(converted, card.mutated_buffers)
    facts = {
        "annotated_buffer_inputs": annotated,
        "qdq_around_buffers": qdq_around_buffers(converted, card.mutated_buffers),
        "folded_buffer_reads": {
            name: {"before": readers_before[name], "after": readers_after.get(name, 0)}
            for name in readers_before
            if readers_after.get(name, 0) < readers_before[name]
        },
    }
    return converted, facts


def _restore_buffers(module: torch.nn.Module, initial: dict[str, torch.Tensor]) -> None:
    for name, buffer in module.named_buffers():
        if name in initial and buffer.shape == initial[name].shape:
            with torch.no_grad():
                buffer.copy_(initial[name])


def _buffer_nodes(graph_module: torch.fx.GraphModule, buffers: tuple[str, ...]) -> dict[torch.fx.Node, str]:
    return {
        node: str(node.target)
        for node in graph_module.graph.nodes
        if node.op == "get_attr" and str(node.target) in buffers
    }


def annotated_buffer_inputs(prepared: torch.fx.GraphModule, buffers: tuple[str, ...]) -> list[dict[str, str]]:
    """Ops whose quantization annotation covers a mutated buffer as an input."""
    buffer_nodes = _buffer_nodes(prepared, buffers)
    found = []
    for node in prepared.graph.nodes:
        annotation = node.meta.get("quantization_annotation")
        if annotation is None:
            continue
        for input_node in getattr(annotation, "input_qspec_map", {}) or {}:
            if input_node in buffer_nodes:
                found.append({"op": str(node.target), "buffer": buffer_nodes[input_node]})
        # Observers already inserted by prepare_pt2e on a buffer count too.
    for node in prepared.graph.nodes:
        if node.op == "call_module" and "activation_post_process" in str(node.target):
            for input_node in node.all_input_nodes:
                if input_node in buffer_nodes:
                    found.append({"op": "observer", "buffer": buffer_nodes[input_node]})
    return found


def buffer_readers(graph_module: torch.fx.GraphModule, buffers: tuple[str, ...]) -> dict[str, int]:
    """How many ops use each mutated buffer (observers and q/dq aside). If convert_pt2e has fewer
    than the exported graph, some reads were folded into constants: state frozen at calibration."""
    counts = {name: 0 for name in buffers}
    for node, name in _buffer_nodes(graph_module, buffers).items():
        counts[name] += sum(
            1
            for user in node.users
            if "activation_post_process" not in str(user.target) and "quantize" not in str(user.target)
        )
    return counts


def qdq_around_buffers(converted: torch.fx.GraphModule, buffers: tuple[str, ...]) -> list[dict[str, str]]:
    """quantize/dequantize nodes fed by a mutated buffer (it must reach the delegate unquantized)."""
    found = []
    for node, name in _buffer_nodes(converted, buffers).items():
        for user in node.users:
            if "quantize" in str(user.target):
                found.append({"buffer": name, "op": str(user.target)})
    return found


def lower(model: torch.nn.Module, example: tuple, soc_name: str, dtype: str, skip_mutable_buffer: bool):
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_soc_to_chipset_map,
        to_edge_transform_and_lower_to_qnn,
    )

    specs = generate_qnn_executorch_compiler_spec(
        soc_model=get_soc_to_chipset_map()[soc_name],
        backend_options=generate_htp_compiler_spec(use_fp16=dtype == "fp16"),
    )
    return to_edge_transform_and_lower_to_qnn(model, example, specs, skip_mutable_buffer=skip_mutable_buffer)


def partition_facts(edge_manager, buffers: tuple[str, ...]) -> dict[str, Any]:
    """Delegates in the lowered top-level graph, and which mutated buffers stayed outside them."""
    program = edge_manager.exported_program()
    graph_module = program.graph_module
    delegates = []
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            lowered = getattr(graph_module, str(node.args[0].target))
            delegates.append({"name": str(node.args[0].target), "backend": lowered.backend_id})
    outside_ops = sorted(
        {
            getattr(node.target, "__name__", str(node.target))
            for node in graph_module.graph.nodes
            if node.op == "call_function"
            and "executorch_call_delegate" not in str(node.target)
            and "getitem" not in str(node.target)
        }
    )
    buffers_outside = sorted(set(program.graph_signature.buffers_to_mutate.values()) & set(buffers))
    return {"delegates": delegates, "ops_outside": outside_ops, "buffers_outside": buffers_outside}


def backend_config(card: ModelCard):
    """Serialize with the card's buffers marked as initialised.

    ExecuTorch leaves mutable buffers uninitialised unless InitializedMutableBufferPass names them
    (measured: without it even the portable runtime starts an arange buffer at zeros). A stateful
    model that needs its registered value opts in this way, so the suite does too; what a backend
    then does with the initial value is what the initial-state check measures.
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    # The pass matches placeholder names, where an FQN's dots are underscores (b_layers_0_..._k_cache).
    patterns = [name.replace(".", "_") for name in card.mutated_buffers]
    return ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(patterns)])
