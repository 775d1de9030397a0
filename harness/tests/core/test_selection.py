"""An empty selection names the filter that emptied it (pytest alone says "no tests ran", exit 5)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.pipeline import card as card_registry
from harness.selection import empty_selection_line


@pytest.fixture(scope="module", autouse=True)
def zoo_cards():
    card_registry.load_module("fixtures.zoo")


def test_a_soc_no_device_has_is_named():
    line = empty_selection_line(["SM8650", "SM8750"], ["SM8450"], ("fp16",), "", None)
    assert line == (
        "no check selected: --soc SM8450 matches none of this run's devices (SM8650, SM8750): pass one of their "
        "SoCs, or a device of that SoC"
    )


def test_a_keyword_that_matches_nothing_is_named_with_what_names_look_like():
    line = empty_selection_line(["SM8650"], [], ("fp16",), "countr_add", None)
    assert line.startswith("no check selected: -k 'countr_add' matches none of the ") and "loosen -k" in line
    assert "test_" in line and "-fp16-" in line and "SM8650]" in line


def test_a_selection_with_checks_is_not_called_empty():
    """The twins: a -k that matches (by part of a name, any case, through and/or/not), and no filter at all."""
    for keyword in ("counter_add", "COUNTER_ADD and fp16", "not nothing_is_named_so", ""):
        assert empty_selection_line(["SM8650"], [], ("fp16",), keyword, None) is None, keyword


def test_a_shard_that_got_nothing_is_named():
    line = empty_selection_line(["SM8650"], [], ("fp16",), "counter_add", "7/9")
    assert line == "no check selected: --shard 7/9 got none of the selection's checks: use fewer shards"


def test_a_dtype_no_card_is_made_in_is_named(monkeypatch):
    (counter,) = [card for card in card_registry.cards() if card.name == "counter_add"]
    monkeypatch.setattr(card_registry, "cards", lambda: [dataclasses.replace(counter, dtypes=("fp16",))])
    assert empty_selection_line(["SM8650"], [], ("fp16",), "", None) is None  # the twin: a dtype it is made in
    line = empty_selection_line(["SM8650"], [], ("8a8w",), "", None)
    assert line is not None and line.startswith("no check selected: no card is made in --dtype 8a8w on SM8650")
