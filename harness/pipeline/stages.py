"""The stages of one case, in the order data flows: export -> quantize -> lower -> serialize.

Runs inside the lowering child (harness.pipeline.lower_job), which imports executorch; the host side
never imports this module. Each stage returns facts (plain JSON data) that the checks read later.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from harness.pipeline import eager
from harness.pipeline.card import ModelCard
from harness.vocabulary import BLOCK_DTYPE, QUANT_DTYPES

# 16a4w_block's block: 16 input channels of a linear weight [out, in] share a scale (upstream's LLM flow,
# llm_utils/qnn_decoder_model_manager.py, sets (1, 16) on every linear and its weight)
WEIGHT_BLOCK = 16


def export_facts(card: ModelCard, model: torch.nn.Module, examples: dict[str, tuple]) -> dict[str, Any]:
    """What the methods mutate, as their union: buffers_to_mutate appear only after run_decompositions()
    (torch.export alone lists none), and a buffer written by one method and read by another is mutated in the
    writer's program only. A multi-method card's also say what each method writes (the per-method checks'
    expectation)."""
    per_method: dict[str, list[str]] = {}
    for method, example in examples.items():
        program = torch.export.export(copy.deepcopy(method_view(model, method)), example).run_decompositions({})
        per_method[method] = sorted(set(program.graph_signature.buffers_to_mutate.values()))
    facts: dict[str, Any] = {
        "buffers_to_mutate": sorted({name for names in per_method.values() for name in names}),
        "expected": sorted(card.mutated_buffers),
    }
    return {**facts, "methods": per_method} if card.multi_method else facts


def quantize(
    card: ModelCard, model: torch.nn.Module, dtype: str, calibration: list[tuple]
) -> tuple[dict[str, torch.nn.Module], dict, dict[str, dict[str, dict[str, str]]]]:
    """PTQ with QnnQuantizer, each method as its own program; MinMaxObserver so state that grows step by step
    is not clipped. Calibrated as users calibrate: the card's plan run on the prepared methods with the state
    carried from one method to the next (decode calibrated on the cache prefill leaves, not on the zero
    cache), as a user's calibration loop runs prefill and then decode. Nothing in executorch's flow makes the
    methods agree on a shared buffer's encoding, which cross_method_state then weighs.

    Calibration runs the model, which mutates its state (the card's mutated buffers); the state is reset to
    its registered values around it so calibration never leaks into the initial state the device starts
    from. Only the state: QnnQuantizer's prepare rewrites constant buffers in place (an additive causal
    mask's -inf becomes -65535, the quantizer's range), and a mask given its -inf back is observed as -inf,
    an infinite scale QNN refuses ("Output def has a bad scale"). Returns the converted methods, their facts
    (merged, each entry naming its method, when there are several) and a multi-method card's buffer
    encodings by method.
    """
    initial = {name: buffer.detach().clone() for name, buffer in model.named_buffers() if name in card.mutated_buffers}
    per_method = method_calibration(card, calibration)
    prepared, before = {}, {}
    for method, rows in per_method.items():
        _restore_buffers(model, initial)
        prepared[method], before[method] = _prepare(card, method_view(model, method), dtype, rows[0])
        _restore_buffers(prepared[method], initial)
    plan = card.step_methods(len(calibration))
    eager.run_plan_as(prepared.__getitem__, _call_method, plan, calibration, "carried", card.mutated_buffers)
    converted, merged, encodings = {}, _JoinedQuantizeFacts(), {}
    for method in card.method_names:
        converted[method], facts = _convert(card, prepared[method], before[method], initial)
        merged.add(facts, f"{method}: " if card.multi_method else "")
        if card.multi_method:
            encodings[method] = buffer_encodings(converted[method], card.mutated_buffers)
    _restore_buffers(model, initial)
    return converted, merged.facts, encodings


class _JoinedQuantizeFacts:
    """The methods' quantization facts joined, each entry named by its method's prefix ("" for forward alone)."""

    def __init__(self) -> None:
        self.facts: dict[str, Any] = {
            "annotated_buffer_inputs": [],
            "qdq_around_buffers": [],
            "folded_buffer_reads": {},
        }

    def add(self, facts: dict[str, Any], prefix: str) -> None:
        for key in ("annotated_buffer_inputs", "qdq_around_buffers"):
            self.facts[key] += [{**entry, "op": f"{prefix}{entry['op']}"} for entry in facts[key]]
        self.facts["folded_buffer_reads"].update(
            {f"{prefix}{name}": counts for name, counts in facts["folded_buffer_reads"].items()}
        )


def _prepare(card: ModelCard, model: torch.nn.Module, dtype: str, example: tuple) -> tuple[torch.fx.GraphModule, dict]:
    """The model exported and prepared for calibration with QnnQuantizer in dtype, and what the annotation
    facts need from before convert (the annotated buffer inputs, each buffer's readers)."""
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    quantizer = QnnQuantizer()
    graph_module = torch.export.export(model, example).module()
    if dtype == BLOCK_DTYPE:  # as upstream's LLM flow sets LPBQ up: per-channel weights, blocks on the linears
        quantizer.set_default_quant_config(
            QuantDtype.use_16a4w_block,
            is_conv_per_channel=True,
            is_linear_per_channel=True,
            act_observer=MinMaxObserver,
        )
        quantizer.set_block_size_map(block_size_map(card, graph_module))
    else:
        quantizer.set_default_quant_config(getattr(QuantDtype, QUANT_DTYPES[dtype]), act_observer=MinMaxObserver)
    readers_before = buffer_readers(graph_module, card.mutated_buffers)
    prepared = prepare_pt2e(graph_module, quantizer)
    return prepared, {"readers": readers_before, "annotated": annotated_buffer_inputs(prepared, card.mutated_buffers)}


def _convert(
    card: ModelCard, prepared: torch.fx.GraphModule, before: dict, initial: dict[str, torch.Tensor]
) -> tuple[torch.nn.Module, dict]:
    """A calibrated module converted, its buffers back at their registered values, and its quantization facts."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    converted = convert_pt2e(prepared)
    _restore_buffers(converted, initial)
    readers_before, readers_after = before["readers"], buffer_readers(converted, card.mutated_buffers)
    facts = {
        "annotated_buffer_inputs": before["annotated"],
        "qdq_around_buffers": qdq_around_buffers(converted, card.mutated_buffers),
        "folded_buffer_reads": {
            name: {"before": readers_before[name], "after": readers_after.get(name, 0)}
            for name in readers_before
            if readers_after.get(name, 0) < readers_before[name]
        },
    }
    return converted, facts


def block_size_map(card: ModelCard, graph_module: torch.fx.GraphModule) -> dict[str, tuple[int, int]]:
    """QnnQuantizer's block sizes for 16a4w_block, by node name: each linear and its weight whose input
    channels are a multiple of WEIGHT_BLOCK. ValueError when the card has none: its 16a4w_block cases would be
    plain 16a4w under another name (a card opts in to the dtype for its linear layers)."""
    blocks = {}
    for node in graph_module.graph.nodes:
        if node.target is torch.ops.aten.linear.default:
            weight = node.args[1]
            shape = tuple(weight.meta["val"].shape) if "val" in weight.meta else ()
            if len(shape) == 2 and shape[1] % WEIGHT_BLOCK == 0:
                blocks[node.name] = blocks[weight.name] = (1, WEIGHT_BLOCK)
    if not blocks:
        raise ValueError(
            f"model card {card.name!r} declares {BLOCK_DTYPE} but has no linear layer whose input channels are a "
            f"multiple of {WEIGHT_BLOCK}: block quantization would change nothing; drop {BLOCK_DTYPE} from its dtypes"
        )
    return blocks


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


def lower(
    methods: dict[str, torch.nn.Module],
    examples: dict[str, tuple],
    soc_name: str,
    dtype: str,
    skip_mutable_buffer: bool,
    online_prepare: bool = False,
    profile_level: int = 0,
    shared_buffer: bool = False,
):
    """All methods lowered together, as one program (a dict of modules and inputs, one compiler spec, which
    to_edge_transform_and_lower_to_qnn takes as a method each; a lone module is its {"forward": module}).
    online_prepare: the card's ModelCard.online_prepare (the device composes the graph from QNN IR at load);
    shared_buffer: the card's ModelCard.shared_buffer (graph I/O in memory the application shares with QNN);
    profile_level: executorch's QNN profiling (--profile-level; 0 off), a program of its own (cached apart)."""
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        get_soc_to_chipset_map,
        to_edge_transform_and_lower_to_qnn,
    )

    specs = generate_qnn_executorch_compiler_spec(
        soc_model=get_soc_to_chipset_map()[soc_name],
        backend_options=generate_htp_compiler_spec(use_fp16=dtype == "fp16"),
        online_prepare=online_prepare,
        profile_level=profile_level,
        shared_buffer=shared_buffer,
    )
    with private_working_folder() if online_prepare else contextlib.nullcontext():
        return to_edge_transform_and_lower_to_qnn(methods, examples, specs, skip_mutable_buffer=skip_mutable_buffer)


@contextlib.contextmanager
def private_working_folder() -> Iterator[None]:
    """An online-prepared lowering in a fresh 0700 folder of its own, as its working directory.

    QNN's IR backend writes the graph to `<graph name>.dlc` (forward.dlc) in the working directory and
    executorch reads it back by that relative name (backends/qualcomm/runtime/backends/ir/host/IrContext.cpp
    GetContextBinary; measured: forward.dlc left in the folder the suite ran from). In a shared folder two
    lowerings would race on one file, a forward.dlc planted there would be read into the program, and the
    user's tree would keep it."""
    with tempfile.TemporaryDirectory(prefix="qnnsuite-dlc-") as folder, contextlib.chdir(folder):
        yield


def partition_facts(edge_manager, card: ModelCard) -> dict[str, Any]:
    """Delegates in each method's lowered top-level graph, and which mutated buffers stayed outside them. A
    multi-method card's joined: delegates named by method, ops and buffers outside as unions, each method's
    own under "methods" (what the partitions check judges per method)."""
    per_method = {
        method: _partition_facts_of(edge_manager.exported_program(method), card.mutated_buffers)
        for method in card.method_names
    }
    if not card.multi_method:
        return per_method["forward"]
    return {
        "delegates": [
            {**delegate, "name": f"{method}.{delegate['name']}"}
            for method, facts in per_method.items()
            for delegate in facts["delegates"]
        ],
        "ops_outside": sorted({op for facts in per_method.values() for op in facts["ops_outside"]}),
        "buffers_outside": sorted({name for facts in per_method.values() for name in facts["buffers_outside"]}),
        "methods": per_method,
    }


def _partition_facts_of(program, buffers: tuple[str, ...]) -> dict[str, Any]:
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


def backend_config(card: ModelCard, share_mutable_buffers: bool = False):
    """Serialize with the card's buffers marked as initialised, and memory planned as the case says
    (share_mutable_buffers: one allocation per mutable buffer for every method, as executorch's LLM export
    builder passes MemoryPlanningPass(share_mutable_buffers=True)).

    ExecuTorch leaves mutable buffers uninitialised unless InitializedMutableBufferPass names them
    (measured: without it even the portable runtime starts an arange buffer at zeros). A stateful
    model that needs its registered value opts in this way, so the suite does too; what a backend
    then does with the initial value is what the initial-state check measures.
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    # The pass matches placeholder names, where an FQN's dots are underscores (b_layers_0_..._k_cache).
    patterns = [name.replace(".", "_") for name in card.mutated_buffers]
    return ExecutorchBackendConfig(
        passes=[InitializedMutableBufferPass(patterns)],
        memory_planning_pass=memory_planning(card, share_mutable_buffers),
    )


def memory_planning(card: ModelCard, share_mutable_buffers: bool):
    """executorch's MemoryPlanningPass as the card's program needs it: a shared-buffer card's graph inputs and
    outputs unplanned, so the application supplies their memory (what upstream's export_utils.py does for
    shared_buffer); share_mutable_buffers: one allocation per mutable buffer for every method."""
    from executorch.exir.passes import MemoryPlanningPass

    return MemoryPlanningPass(
        share_mutable_buffers=share_mutable_buffers,
        alloc_graph_input=not card.shared_buffer,
        alloc_graph_output=not card.shared_buffer,
    )


def method_view(model: torch.nn.Module, method: str) -> torch.nn.Module:
    """The model with `method` as its forward, sharing the model's state (its __dict__: parameters and
    buffers are the same tensors, under the same names), so every method exports the buffer under one FQN,
    which is what share_mutable_buffers pairs across methods. forward is the model itself."""
    if method == "forward":
        return model
    cls = type(model)
    view_class = type(f"{cls.__name__}_{method}", (cls,), {"forward": getattr(cls, method)})
    view = view_class.__new__(view_class)
    view.__dict__ = model.__dict__
    return view


def method_calibration(card: ModelCard, calibration: list[tuple]) -> dict[str, list[tuple]]:
    """Each method's inputs from the card's plan, in the card's method order; the first is its example."""
    plan = card.step_methods(len(calibration))
    per_method = {
        method: [inputs for name, inputs in zip(plan, calibration) if name == method] for method in card.method_names
    }
    missing = [method for method, rows in per_method.items() if not rows]
    if missing:
        raise ValueError(
            f"model card {card.name!r}: its plan for {len(calibration)} steps never runs {missing}: "
            f"a plan must run every declared method"
        )
    return per_method


def _encoding(node: torch.fx.Node) -> str:
    """A quantize/dequantize node's encoding in words: scale, zero point, range and storage dtype."""
    scale, zero_point, low, high, dtype = node.args[1:6]
    return f"scale={float(scale):.6g} zero_point={int(zero_point)} range=[{low},{high}] {str(dtype).removeprefix('torch.')}"


def buffer_encodings(converted: torch.fx.GraphModule, buffers: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Per mutated buffer, the encoding this method's quantized program reads it through (the quantize op
    the buffer feeds) and writes it with (the dequantize op whose value is copied into it), where it has one."""
    found: dict[str, dict[str, str]] = {}
    nodes = _buffer_nodes(converted, buffers)
    for node, name in nodes.items():
        for user in node.users:
            if "quantize_per_tensor" in str(user.target) and "dequantize" not in str(user.target):
                found.setdefault(name, {})["read"] = _encoding(user)
    for node in converted.graph.nodes:
        if node.op == "call_function" and "copy_" in str(node.target) and node.args[0] in nodes:
            source = node.args[1]
            if isinstance(source, torch.fx.Node) and "dequantize_per_tensor" in str(source.target):
                found.setdefault(nodes[node.args[0]], {})["write"] = _encoding(source)
    return found


def _call_method(module: torch.nn.Module, method: str, inputs: tuple) -> object:
    """One step of a method's own program (its forward is the method)."""
    return module(*inputs)


# Output elements a card's modelled references may hold in the lowering's facts (JSON): the suite's cards hold a
# few hundred; a user's card with vocabulary-sized logits over many steps is judged without them.
MODELLED_ELEMENTS_MAX = 1 << 20


def quantized_models(
    card: ModelCard,
    converted: dict[str, torch.nn.Module],
    steps: list[tuple],
    writes: dict[str, list[str]] | None,
) -> dict[str, list[list[list[float]]]]:
    """The quantized CPU programs (each method's quantize/dequantize program) run on the plan as each of
    eager's STATE_MODELS: with the state carried across methods through each method's own encodings (what a
    device that shares the state computes, encodings and all), and the ways to lose it. By model, step and
    output, the flat values (JSON for the lowering's facts); {} when they would be too large to keep."""
    plan = card.step_methods(len(steps))
    models = {}
    for model in eager.STATE_MODELS:
        if model == "constant_read" and writes is None:
            continue
        outputs = eager.run_plan_as(
            lambda method: copy.deepcopy(converted[method]),
            _call_method,
            plan,
            steps,
            model,
            card.mutated_buffers,
            writes,
        )
        models[model] = [[array.astype("float64").reshape(-1).tolist() for array in row] for row in outputs]
    size = sum(len(values) for outputs in models.values() for row in outputs for values in row)
    return models if size <= MODELLED_ELEMENTS_MAX else {}
