"""16a4w_block (LPBQ): its quantizer config is upstream's block quantization, it runs only on SoCs
whose HTP has it (V69 and newer), and only the cards that opt in have it."""

from __future__ import annotations

import pytest
import torch

import harness.checks  # noqa: F401  (registers the checks' signatures, which the manifest is checked against)
from harness.check_registry import CheckFailure
from harness.known_failures import matching
from harness.numerics import TOLERANCES
from harness.pipeline import card as cards, cases, stages
from harness.verdicts import decide
from harness.vocabulary import (
    BLOCK_DTYPE,
    CARD_DTYPES,
    DTYPES,
    FLOAT_DTYPE,
    MIN_HTP_ARCH,
    QUANT_DTYPES,
    Mode,
    ModelCard,
    Verdict,
)

IN_FEATURES, OUT_FEATURES = 64, 8


class ProjectedState(torch.nn.Module):
    """A linear projection whose output accumulates in a buffer, and the buffer feeds the result."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)
        self.register_buffer("state", torch.zeros(1, OUT_FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(self.proj(x))
        return self.state * 2


class NoLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(1, OUT_FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x)
        return self.state + 1


def _steps(width: int, n: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(1, width, generator=generator),) for _ in range(n)]


PROJECTED = ModelCard(
    "lpbq_projected", ProjectedState, lambda n: _steps(IN_FEATURES, n), ("state",), dtypes=(BLOCK_DTYPE,)
)
NO_LINEAR = ModelCard("lpbq_no_linear", NoLinear, lambda n: _steps(OUT_FEATURES, n), ("state",), dtypes=(BLOCK_DTYPE,))


def _weight_dequantizations(converted: torch.fx.GraphModule) -> list[dict]:
    """What the dequantization feeding each linear's weight says: its op, and for an affine one its block size,
    scale shape and integer range."""
    found = []
    for node in converted.graph.nodes:
        if node.target is not torch.ops.aten.linear.default:
            continue
        weight = node.args[1]
        if "affine" in str(weight.target):
            _, block, scale, _, _, low, high = weight.args[:7]
            scale_shape = tuple(getattr(converted, scale.target).shape)
            found.append({"op": "affine", "block": tuple(block), "scale": scale_shape, "range": (low, high)})
        else:
            found.append({"op": str(weight.target), "range": tuple(weight.args[3:5])})
    return found


@pytest.mark.qnn
def test_the_block_dtype_quantizes_linear_weights_to_4_bits_with_a_scale_per_block(toolchain):
    """Upstream's LPBQ: symmetric 4-bit weights (-7..7 in int8), one scale per output channel and block of
    16 input channels, so the weight's scale is [out, in / 16]; 16a4w's weights have no blocks. Activations
    and the buffer are quantized as in 16a4w (16-bit), so the annotation facts the checks judge are the same."""
    quantized = {
        dtype: stages.quantize(PROJECTED, ProjectedState(), dtype, PROJECTED.steps(3))
        for dtype in ("16a4w", BLOCK_DTYPE)
    }
    expected = {
        "op": "affine",
        "block": (1, stages.WEIGHT_BLOCK),
        "scale": (OUT_FEATURES, IN_FEATURES // stages.WEIGHT_BLOCK),
        "range": (-7, 7),
    }
    assert _weight_dequantizations(quantized[BLOCK_DTYPE][0]["forward"]) == [expected]
    plain = _weight_dequantizations(quantized["16a4w"][0]["forward"])
    assert plain == [{"op": "quantized_decomposed.dequantize_per_tensor.default", "range": (-7, 7)}], plain
    assert quantized[BLOCK_DTYPE][1] == quantized["16a4w"][1]


def test_a_card_that_declares_the_block_dtype_without_a_linear_is_told_in_one_line():
    graph_module = torch.export.export(NoLinear(), NO_LINEAR.steps(1)[0]).module()
    with pytest.raises(ValueError) as raised:
        stages.block_size_map(NO_LINEAR, graph_module)
    message = str(raised.value)
    assert "\n" not in message and "lpbq_no_linear" in message and f"drop {BLOCK_DTYPE}" in message
    blocks = stages.block_size_map(PROJECTED, torch.export.export(ProjectedState(), PROJECTED.steps(1)[0]).module())
    assert set(blocks.values()) == {(1, stages.WEIGHT_BLOCK)} and len(blocks) == 2  # the linear and its weight


@pytest.mark.parametrize(
    ("soc", "reason"),
    [
        ("SM8350", f"{BLOCK_DTYPE} needs HTP V69 or newer: SM8350 is HTP V68"),
        ("SM8450", ""),  # V69: the first that has LPBQ
        ("SM8650", ""),
        ("SM8750", ""),
    ],
)
def test_the_block_dtype_is_unsupported_before_htp_v69_and_names_the_arch(soc, reason):
    assert MIN_HTP_ARCH[BLOCK_DTYPE] == 69
    assert cases.unsupported(BLOCK_DTYPE, soc) == reason
    assert cases.unsupported("16a4w", soc) == "" and cases.unsupported(FLOAT_DTYPE, soc) == ""


def test_the_matrix_lists_a_pre_v69_socs_block_cases_skipped_and_never_lowers_them():
    card = ModelCard("lpbq_matrix", ProjectedState, PROJECTED.steps, ("state",), dtypes=("16a4w", BLOCK_DTYPE))
    matrix = cases.matrix([card], DTYPES, ["SM8350", "SM8650"])
    skipped = {case.id: case.skip_reason for case in matrix if case.skip_reason}
    assert skipped == {
        f"lpbq_matrix-{BLOCK_DTYPE}-{mode.value}-SM8350": f"{BLOCK_DTYPE} needs HTP V69 or newer: SM8350 is HTP V68"
        for mode in (Mode.DELEGATE, Mode.SKIP)
    }
    assert len(matrix) == 8  # listed, so the run shows them skipped with the reason
    runnable = {case.id for case in cases.runnable(matrix)}
    assert runnable == {case.id for case in matrix} - set(skipped)
    nodeids = [f"suites/test_state.py::test_state[{case.id}]" for case in matrix]
    assert {case.id for case in cases.collected(nodeids, matrix)} == runnable  # what the lowering server lowers


def test_every_dtype_has_a_tolerance_and_every_quantized_one_a_quantizer_config():
    from executorch.backends.qualcomm.quantizer.quantizer import QuantDtype

    assert set(TOLERANCES) == set(DTYPES)
    assert set(QUANT_DTYPES) == set(DTYPES) - {FLOAT_DTYPE}
    assert all(hasattr(QuantDtype, name) for name in QUANT_DTYPES.values())
    assert QUANT_DTYPES[BLOCK_DTYPE] == "use_16a4w_block"


def test_only_cards_that_opt_in_have_the_block_dtype():
    import fixtures.families  # noqa: F401  (registers the cards)
    import fixtures.llama  # noqa: F401
    import fixtures.multi_method  # noqa: F401
    import fixtures.zoo  # noqa: F401

    assert BLOCK_DTYPE not in CARD_DTYPES and BLOCK_DTYPE in DTYPES
    assert {card.name for card in cards.cards() if BLOCK_DTYPE in card.dtypes} == {"llama_attention"}


@pytest.mark.parametrize(
    "name, measured, neighbour",
    [
        (  # the state failure measured on SM8650 (F8's PTQ error), and a buffer defect the entry must not excuse
            "test_state[llama_attention-16a4w_block-skip_mutbuf-SM8650]",
            CheckFailure(
                "state differs from eager: 55 element(s) out of tolerance in 7/8 step(s); first at step 1, "
                "max abs error 0.1062, SQNR 11.7 dB",
                signature="state_mismatch",
            ),
            CheckFailure("state matches the heap pattern", signature="uninitialised_delegated_buffer"),
        ),
    ],
)
def test_the_block_dtypes_entry_expects_its_failure_exactly(name, measured, neighbour):
    expected = matching(name)
    assert [entry.reference.split(";")[0] for entry in expected] == ["docs/FINDINGS.md#F8"]
    assert decide(measured, expected, name)[0] is Verdict.XFAILED
    assert decide(neighbour, expected, name)[0] is Verdict.FAILED


@pytest.mark.parametrize(
    "name",
    [
        "test_state[llama_decoder_layer-16a4w_block-skip_mutbuf-SM8650]",  # another card
        "test_annotation[llama_attention-16a4w_block-delegate_mutbuf-SM8650]",  # another check
        "test_state[llama_attention-16a4w-skip_mutbuf-SM8650]",  # 16a4w has its own entry, not this one
    ],
)
def test_the_block_dtypes_entry_names_no_other_test(name):
    assert not [entry for entry in matching(name) if "16a4w_block" in entry.pattern]


def test_report_json_accepts_every_dtype_the_suite_runs():
    """report.schema.json spells the dtypes for intake (baseline, merge, diff): a run's own report must pass it."""
    import json

    from harness.report import intake

    schema = json.loads(intake.SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$defs"]["case"]["properties"]["dtype"]["enum"] == list(DTYPES)
