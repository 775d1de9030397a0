"""The case matrices a check runs over: card x dtype x mode x SoC."""
from __future__ import annotations

from harness.pipeline.card import ModelCard
from harness.vocabulary import FLOAT_DTYPE, MATRIX_MODES, Case, Mode


def matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Every card in every dtype it supports, in both buffer modes."""
    return [Case(card, dtype, mode, soc) for soc in socs for card in cards
            for dtype in dtypes if dtype in card.dtypes for mode in MATRIX_MODES]


def meta_llama_matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Llama cards lowered the way executorch's Meta llama export does (fp16; buffers kept outside)."""
    if FLOAT_DTYPE not in dtypes:
        return []
    return [Case(card, FLOAT_DTYPE, Mode.META_LLAMA, soc) for soc in socs for card in cards if "llama" in card.tags]
