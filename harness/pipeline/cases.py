"""The case matrix: card x dtype x skip_mutable_buffer x SoC, and how a suite narrows it."""
from __future__ import annotations

from typing import Callable

from harness.pipeline.card import ModelCard
from harness.pipeline.lower import Case

MODES = (False, True)  # skip_mutable_buffer: buffers delegated, then kept outside the delegate


def matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    return [Case(card, dtype, skip, soc) for soc in socs for card in cards
            for dtype in dtypes if dtype in card.dtypes for skip in MODES]


def wanted_by(test: Callable, case: Case) -> bool:
    """A suite may declare `test.case_filter = lambda case: ...` (e.g. only llama cards)."""
    predicate = getattr(test, "case_filter", None)
    return predicate(case) if predicate else True


def meta_llama_matrix(cards: list[ModelCard], socs: list[str]) -> list[Case]:
    """Llama cards lowered the way executorch's Meta llama export does (fp16; buffers kept outside)."""
    return [Case(card, "fp16", True, soc, lowering="meta_llama") for soc in socs for card in cards if "llama" in card.tags]
