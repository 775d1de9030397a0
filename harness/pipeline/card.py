"""The registry of model cards that suites are parametrized from (the ModelCard contract itself is in
harness/vocabulary.py, with the other nouns of the matrix, and is re-exported here for card modules).

A card says how to build a stateful module, which inputs to feed it step by step, which buffers it
mutates and what a correct lowering looks like. Users add models by writing cards in their own module
and passing `--models MODULE`; nothing in the suite changes.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from typing import Any

from harness.vocabulary import ModelCard

# A card name becomes a test id, a folder on the device and a report cell: plain characters only.
CARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")

__all__ = ["ModelCard", "cards", "find", "load_module", "register", "variant"]

_REGISTRY: dict[str, ModelCard] = {}


def register(card: ModelCard) -> ModelCard:
    """Add a card; ValueError (one line naming it) for a bad name or a name taken by another module."""
    if not CARD_NAME.fullmatch(card.name) or card.name.strip(".") == "":
        raise ValueError(
            f"model card {card.name!r} from {card.module or 'an unnamed module'}: a card name may hold "
            f"only letters, digits and _ . - (it names folders on the device): rename the card"
        )
    if card.name in _REGISTRY and _REGISTRY[card.name].module != card.module:
        raise ValueError(f"two model cards are named {card.name!r} ({_REGISTRY[card.name].module} and {card.module})")
    _REGISTRY[card.name] = card
    return card


def variant(card: ModelCard, name: str, module: str, tags: frozenset[str] = frozenset(), **changes: Any) -> ModelCard:
    """The card lowered or judged another way (e.g. online_prepare=True, fewer dtypes) under a name of its own
    from `module` (where a child process finds it), with `tags` added: the same model and steps, not a copy of
    them, so a difference between the two cards' results is the change's alone. Register it like any card."""
    return dataclasses.replace(card, name=name, module=module, tags=card.tags | tags, **changes)


def cards() -> list[ModelCard]:
    return list(_REGISTRY.values())


def load_module(module: str) -> None:
    """Import a module of cards (it registers them on import). Whatever the import raises, a SyntaxError or
    a `sys.exit` included, is one ValueError naming the module's file and the error (the options turn it
    into a usage line, not an INTERNALERROR); only KeyboardInterrupt goes through, as the user meant it."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and (module == error.name or module.startswith(error.name + ".")):
            raise ValueError(
                f"cannot import model cards from {module!r} ({error}): pass an importable module name"
            ) from None
        raise ValueError(f"model cards {module!r} ({_file_of(module)}) failed to import: {_one_line(error)}") from None
    except KeyboardInterrupt:
        raise
    except SyntaxError as error:
        raise ValueError(
            f"model cards {module!r} ({error.filename}, line {error.lineno}) are not valid Python: {error.msg}"
        ) from None
    except BaseException as error:  # noqa: BLE001  (a card module is the user's code: any failure is one line)
        raise ValueError(f"model cards {module!r} ({_file_of(module)}) failed to import: {_one_line(error)}") from None


def _file_of(module: str) -> str:
    """The file a module is imported from, for the user to open; its name if it cannot be found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    return spec.origin if spec is not None and spec.origin else module


def _one_line(error: BaseException) -> str:
    """The error as its type and first line: a card module's failure, said in a usage line."""
    if isinstance(error, SystemExit):
        return f"it called sys.exit({error.code!r}): a card module must only register cards"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def find(reference: str) -> ModelCard:
    module, _, name = reference.partition(":")
    if name not in _REGISTRY:
        load_module(module)
    return _REGISTRY[name]
