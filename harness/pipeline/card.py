"""The registry of model cards that suites are parametrized from (the ModelCard contract itself is in
harness/vocabulary.py, with the other nouns of the matrix, and is re-exported here for card modules).

A card says how to build a stateful module, which inputs to feed it step by step, which buffers it
mutates and what a correct lowering looks like. Users add models by writing cards in their own module
and passing `--models MODULE`; nothing in the suite changes.
"""
from __future__ import annotations

import importlib
import re

from harness.vocabulary import ModelCard

# A card name becomes a test id, a folder on the device and a report cell: plain characters only.
CARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")

__all__ = ["ModelCard", "cards", "find", "load_module", "register"]

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
