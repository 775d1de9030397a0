"""executorch's Meta llama export flow for QNN, driven offline: `export_llama_lib` with the options its
CLI takes (--qnn, -kv, --pt2e_quantize qnn_*), a params file written here and random weights (seeded;
no checkpoint, tokenizer or download).

The flow builds its own model from the params file, so the eager reference is built by the flow's own
loader too (same seed, same QNN source transformations): device results are compared with the model
that was lowered. Without a checkpoint the flow builds the model on the meta device and calls
to_empty and reset_parameters, which leaves buffers (rope tables, causal masks) and the RMSNorm weights
uninitialised memory (measured: norm weights of 1e35, NaN logits in eager); the suite fills those from
the same params built on the CPU, before the flow's source transformations run. Everything else is the shipped flow. The flow hard-wires skip_mutable_buffer=True (its KV caches stay outside the
delegate, copied by the runtime) and switches ConvertBmmToMatmul on; the pass can be made a no-op here
to record what it is worth. Imported only where executorch is (the lowering child, eager references).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

# The tiny llama of fixtures/llama.py, as a params.json of the flow.
PARAMS = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "norm_eps": 1e-5, "multiple_of": 32}
MAX_CONTEXT = 32
# The flow's --pt2e_quantize choices; it offers no 16a8w (its CLI and get_qnn_quantizer stop at
# 8a8w, 16a16w, 16a4w), so 16a8w goes through the same flow with QnnQuantizer's 16a8w config swapped in.
PT2E_QUANTIZE = {"16a4w": "qnn_16a4w", "8a8w": "qnn_8a8w", "16a8w": "qnn_16a4w"}
CACHE_BUFFERS = ("past_k_caches", "past_v_caches")  # what the flow's QNN transformation names the caches


def mutated_buffers(n_layers: int) -> tuple[str, ...]:
    return tuple(f"layers.{layer}.attention.kv_cache.{name}" for layer in range(n_layers) for name in CACHE_BUFFERS)


def config(n_layers: int, dtype: str, soc: str, directory: Path):
    """The flow's LlmConfig, parsed by its own argument parser from the options a user would give."""
    from executorch.examples.models.llama import export_llama_lib
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    params = directory / "params.json"
    params.write_text(json.dumps({**PARAMS, "n_layers": n_layers}))
    argv = [
        "--model",
        "llama3",
        "--params",
        str(params),
        "--use_kv_cache",
        "--qnn",
        "--disable_dynamic_shape",
        "--soc_model",
        soc,
        "--max_seq_length",
        str(MAX_CONTEXT),
        "--max_context_length",
        str(MAX_CONTEXT),
        "--output-dir",
        str(directory),
        "--output_name",
        str(directory / "model.pte"),
    ]
    if dtype in PT2E_QUANTIZE:
        argv += ["--pt2e_quantize", PT2E_QUANTIZE[dtype]]
    return LlmConfig.from_args(export_llama_lib.build_args_parser().parse_args(argv))


class DecodeStep(torch.nn.Module):
    """The flow's model called as forward(tokens[1, 1], input_pos[1]) (a runner passes tensors, not the
    dict the model takes); its modules are this module's own, so buffer names match the flow's program."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        for name, child in model.named_children():
            self.add_module(name, child)
        self._forward = model.forward

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens, {"input_pos": input_pos})


@contextlib.contextmanager
def _seeded_model_with_buffers() -> Iterator[None]:
    """The flow's model loader, seeded (random weights are the same in every process) and with the
    buffers to_empty left uninitialised filled from a CPU-built model of the same params."""
    from executorch.examples.models.llama import export_llama_lib
    from executorch.examples.models.llama.llama_transformer import construct_transformer

    original = export_llama_lib._load_llama_model

    def load(llm_config):
        torch.manual_seed(0)
        manager = original(llm_config)
        built = construct_transformer(manager.model.params)
        built_tensors = {**dict(built.named_parameters()), **dict(built.named_buffers())}
        with torch.no_grad():
            for module_name, module in manager.model.named_modules():
                # reset_parameters() re-initialised the parameters of modules that have it (seeded above)
                reset = callable(getattr(module, "reset_parameters", None))
                tensors = [
                    *module.named_buffers(recurse=False),
                    *([] if reset else module.named_parameters(recurse=False)),
                ]
                for name, tensor in tensors:
                    tensor.copy_(built_tensors[f"{module_name}.{name}" if module_name else name])
        return manager

    export_llama_lib._load_llama_model = load
    try:
        yield
    finally:
        export_llama_lib._load_llama_model = original


def build_model(n_layers: int) -> torch.nn.Module:
    """The flow's eager model, loaded and source-transformed as export_llama does."""
    from executorch.examples.models.llama import export_llama_lib

    with tempfile.TemporaryDirectory() as directory, _seeded_model_with_buffers():
        model = export_llama_lib._prepare_for_llama_export(config(n_layers, "fp16", "SM8650", Path(directory))).model
    return DecodeStep(model)


@contextlib.contextmanager
def _convert_bmm_to_matmul(enabled: bool) -> Iterator[None]:
    """The flow switches the pass on; off, it passes the graph through unchanged."""
    from executorch.backends.qualcomm._passes import ConvertBmmToMatmul
    from torch.fx.passes.infra.pass_base import PassResult

    original = ConvertBmmToMatmul.call
    if not enabled:
        ConvertBmmToMatmul.call = lambda self, graph_module: PassResult(graph_module, False)
    try:
        yield
    finally:
        ConvertBmmToMatmul.call = original


@contextlib.contextmanager
def _quantizer_for(dtype: str) -> Iterator[None]:
    """16a8w: the flow's quantizer set-up with QnnQuantizer's 16a8w config (as its 16a4w one, 8-bit weights)."""
    if dtype != "16a8w":
        yield
        return
    from executorch.backends.qualcomm.quantizer.custom_annotation import custom_annotate_llama_matmul_16a8w
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.examples.models.llama import export_llama_lib
    from torchao.quantization.pt2e import MinMaxObserver

    original = export_llama_lib.get_quantizer_and_quant_params

    def quantizer_16a8w(llm_config):
        quantizer = QnnQuantizer()
        quantizer.set_default_quant_config(
            QuantDtype.use_16a8w, is_conv_per_channel=True, is_linear_per_channel=True, act_observer=MinMaxObserver
        )
        quantizer.add_custom_quant_annotations((custom_annotate_llama_matmul_16a8w,))
        return None, [quantizer], QuantDtype.use_16a8w

    export_llama_lib.get_quantizer_and_quant_params = quantizer_16a8w
    try:
        yield
    finally:
        export_llama_lib.get_quantizer_and_quant_params = original


def export(n_layers: int, dtype: str, soc: str, directory: Path, convert_bmm_to_matmul: bool = True):
    """export_llama_lib._export_llama (what export_llama runs, short of saving): the LLMEdgeManager after
    to_backend and to_executorch; its edge_manager has the delegates, its export_program the program."""
    from executorch.examples.models.llama import export_llama_lib

    directory.mkdir(parents=True, exist_ok=True)
    llm_config = config(n_layers, dtype, soc, directory)
    with _seeded_model_with_buffers(), _convert_bmm_to_matmul(convert_bmm_to_matmul), _quantizer_for(dtype):
        return export_llama_lib._export_llama(llm_config)
