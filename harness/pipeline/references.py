"""A card's eager results, kept in the artifact cache by content key like its lowerings: the outputs step by
step, and which of their elements depend on the buffers' registered initial values.

They are the same for every dtype, mode and SoC of a card, and without the cache a warm run built every
card's model again in each worker (the Meta llama flow's imports alone take 5 s), a tenth of its work.
An entry that does not parse or does not fit the steps is made again, with one line saying so.
"""

from __future__ import annotations

import io
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.files import write_bytes_atomically
from harness.pipeline import cache, eager
from harness.user_state import claim_entry
from harness.vocabulary import Case, ModelCard

Outputs = eager.Outputs


@dataclass(frozen=True)
class EagerResults:
    reference: Outputs  # eager outputs [step][index], read-only
    # True where an output element depends on the buffers' initial values; None when it cannot be computed
    # (e.g. a card declares a buffer its model lacks): the check that reads it computes it and says why not.
    dependence: Outputs | None


# By card and step count, like the cache key (a card's steps are its steps function's, for a count), so a
# card's later cases in this process neither compute the key nor read the entry.
_MEMO: dict[tuple[ModelCard, int], EagerResults] = {}


def eager_results(case: Case, steps: list[tuple], cache_dir: Path | None) -> EagerResults:
    """The case's card's eager results: this process's, else the cache's, else computed (and kept)."""
    memo_key = (case.card, len(steps))
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    key = cache.eager_key(case, len(steps))
    path = cache_dir / "eager" / f"{key}.npz" if cache_dir is not None else None
    if path is not None:
        claim_entry(path, "eager results")  # another account's is never read; this user's own is written
    results = _read(path, len(steps)) if path is not None and path.is_file() else None
    if results is None:
        reference = eager.run_steps(case.card, steps)
        try:
            dependence = eager.read_only(eager.initial_value_dependence(case.card, steps, reference))
        except Exception:  # the card's fault, reported by the check that needs it, not by every check of the case
            dependence = None
        results = EagerResults(reference, dependence)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomically(path, _encode(results))
    _MEMO[memo_key] = results
    return results


def _encode(results: EagerResults) -> bytes:
    arrays = {
        f"{kind}_{step}_{index}": array
        for kind, outputs in (("reference", results.reference), ("dependence", results.dependence or []))
        for step, row in enumerate(outputs)
        for index, array in enumerate(row)
    }
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _read(path: Path, steps: int) -> EagerResults | None:
    """The entry, or None (with a line) when it is damaged or was made for other steps."""
    try:
        with np.load(path, allow_pickle=False) as entry:
            arrays = {name: entry[name] for name in entry.files}
        kinds = ("reference", "dependence") if "dependence_0_0" in arrays else ("reference",)
        outputs = {
            kind: [
                [arrays[f"{kind}_{step}_{index}"] for index in range(_row_length(arrays, kind, step))]
                for step in range(steps)
            ]
            for kind in kinds
        }
        if len(arrays) != sum(len(row) for rows in outputs.values() for row in rows) or not all(outputs["reference"]):
            raise ValueError("its arrays do not fit the steps")
        for reference_row, dependence_row in zip(outputs["reference"], outputs.get("dependence", [])):
            if len(reference_row) != len(dependence_row) or any(
                got.dtype != np.bool_ or got.shape != want.shape for got, want in zip(dependence_row, reference_row)
            ):
                raise ValueError("its dependence masks do not fit its outputs")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        print(
            f"qnnsuite: cached eager results {path.name} are damaged ({error}); computing them again", file=sys.stderr
        )
        return None
    dependence = outputs.get("dependence")
    return EagerResults(
        eager.read_only(outputs["reference"]), eager.read_only(dependence) if dependence is not None else None
    )


def _row_length(arrays: dict[str, np.ndarray], kind: str, step: int) -> int:
    length = 0
    while f"{kind}_{step}_{length}" in arrays:
        length += 1
    return length
