"""The ModelCard contract and the registry that suites are parametrized from.

A card says how to build a stateful module, which inputs to feed it step by step, which buffers it
mutates and what a correct lowering looks like. Users add models by writing cards in their own module
and passing `--models MODULE`; nothing in the suite changes.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Callable

import torch

DTYPES = ("fp16", "16a8w", "8a8w", "16a4w")
# A card name becomes a test id, a folder on the device and a report cell: plain characters only.
CARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ModelCard:
    name: str
    build: Callable[[], torch.nn.Module]
    steps: Callable[[int], list[tuple[torch.Tensor, ...]]]  # deterministic inputs for n steps
    mutated_buffers: tuple[str, ...]
    expected_partitions: int = 1
    tags: frozenset[str] = field(default_factory=frozenset)
    module: str = ""  # where the card is registered, so a child process can find it again
    dtypes: tuple[str, ...] = DTYPES  # where the card is meaningful (the matrix skips the others)

    @property
    def reference(self) -> str:
        return f"{self.module}:{self.name}"


_REGISTRY: dict[str, ModelCard] = {}


def register(card: ModelCard) -> ModelCard:
    """Add a card; ValueError (one line naming it) for a bad name or a name taken by another module."""
    if not CARD_NAME.fullmatch(card.name) or card.name.strip(".") == "":
        raise ValueError(f"model card {card.name!r} from {card.module or 'an unnamed module'}: a card name may hold "
                         f"only letters, digits and _ . - (it names folders on the device): rename the card")
    if card.name in _REGISTRY and _REGISTRY[card.name].module != card.module:
        raise ValueError(f"two model cards are named {card.name!r} ({_REGISTRY[card.name].module} and {card.module})")
    _REGISTRY[card.name] = card
    return card


def cards() -> list[ModelCard]:
    return list(_REGISTRY.values())


def load_module(module: str) -> None:
    """Import a module of cards (it registers them on import)."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ValueError(f"cannot import model cards from {module!r} ({error}): pass an importable module name") from error


def find(reference: str) -> ModelCard:
    module, _, name = reference.partition(":")
    if name not in _REGISTRY:
        load_module(module)
    return _REGISTRY[name]
