"""A card's eager results come from the artifact cache only when they are what computing them gives: equal
to a fresh computation, made again (with one line) when damaged, and keyed by what shapes them."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.pipeline import cache, card as cards, eager, references
from harness.vocabulary import Case, Mode

CASE = Case(cards.find("fixtures.zoo:counter_add"), "fp16", Mode.DELEGATE, "SM8650")
STEPS = CASE.card.steps(4)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test starts as a new worker would: nothing memoised."""
    monkeypatch.setattr(references, "_MEMO", {})
    monkeypatch.setattr(eager, "_OUTPUTS", {})


def _entry(cache_dir):
    return cache_dir / "eager" / f"{cache.eager_key(CASE, len(STEPS))}.npz"


def _assert_equal(got: references.EagerResults) -> None:
    reference = eager.run_steps(CASE.card, STEPS)
    dependence = eager.initial_value_dependence(CASE.card, STEPS, reference)
    for got_rows, want_rows in ((got.reference, reference), (got.dependence, dependence)):
        assert len(got_rows) == len(want_rows) == len(STEPS)
        for got_row, want_row in zip(got_rows, want_rows):
            assert len(got_row) == len(want_row)
            for a, b in zip(got_row, want_row):
                assert a.dtype == b.dtype and np.array_equal(a, b)
    assert any(mask.any() for row in got.dependence for mask in row), (
        "counter_add's outputs depend on its initial value"
    )


def test_cached_results_equal_fresh_ones_and_are_read_only(tmp_path, monkeypatch):
    first = references.eager_results(CASE, STEPS, tmp_path)
    assert _entry(tmp_path).is_file()
    monkeypatch.setattr(references, "_MEMO", {})
    monkeypatch.setattr(eager, "build_model", lambda card: pytest.fail("a cached entry builds no model"))
    again = references.eager_results(CASE, STEPS, tmp_path)
    monkeypatch.undo()
    _assert_equal(again)
    _assert_equal(first)
    with pytest.raises(ValueError, match="read-only"):
        again.reference[0][0][...] = 0


@pytest.mark.parametrize("damage", ["truncated", "not an archive", "other steps"])
def test_a_damaged_entry_is_computed_again(tmp_path, monkeypatch, capfd, damage):
    references.eager_results(CASE, STEPS, tmp_path)
    entry = _entry(tmp_path)
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:200])
    elif damage == "not an archive":
        entry.write_bytes(b"not an npz file")
    else:  # a well-formed entry with one step fewer, where the key's step count was lost
        entry.write_bytes(references._encode(references.eager_results(CASE, STEPS[:3], tmp_path / "other")))
    monkeypatch.setattr(references, "_MEMO", {})
    _assert_equal(references.eager_results(CASE, STEPS, tmp_path))
    assert f"cached eager results {entry.name} are damaged" in capfd.readouterr().err
    monkeypatch.setattr(references, "_MEMO", {})
    references.eager_results(CASE, STEPS, tmp_path)
    assert "damaged" not in capfd.readouterr().err, "the entry was written again, whole"


def test_the_key_covers_the_dependence_code_and_the_steps(tmp_path, monkeypatch):
    key = cache.eager_key(CASE, 4)
    assert cache.eager_key(CASE, 5) != key
    assert cache.eager_key(Case(CASE.card, "8a8w", Mode.SKIP, "SM8750"), 4) == key, "one entry per card"
    changed = tmp_path / "numerics.py"
    changed.write_text(cache.NUMERICS_SOURCE.read_text() + "\n# changed\n")
    monkeypatch.setattr(cache, "NUMERICS_SOURCE", changed)
    assert cache.eager_key(CASE, 4) != key


def test_a_dependence_that_cannot_be_computed_is_left_to_its_check(tmp_path, monkeypatch, capfd):
    """A card that declares a buffer its model lacks: its reference is kept, its dependence is not, and the
    check that reads it raises the card's error (as it did before the cache), not every check of the case."""
    from harness.tests import broken_cards

    case = Case(broken_cards.MISDECLARED, "fp16", Mode.DELEGATE, "SM8650")
    steps = case.card.steps(3)
    first = references.eager_results(case, steps, tmp_path)
    assert first.dependence is None and len(first.reference) == 3
    monkeypatch.setattr(references, "_MEMO", {})
    again = references.eager_results(case, steps, tmp_path)
    assert "damaged" not in capfd.readouterr().err, "an entry without a dependence is whole"
    assert again.dependence is None and all(
        np.array_equal(a, b) for a, b in zip(again.reference[2], first.reference[2])
    )
    with pytest.raises(KeyError, match="declared"):
        eager.initial_value_dependence(case.card, steps, again.reference)
