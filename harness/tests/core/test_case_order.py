"""The order xdist hands cases out in: every case once, neighbours on different SoCs (two workers, two
devices) and in different dtypes (two quantized programs)."""

from __future__ import annotations

from collections import Counter

from fixtures import families, llama, multi_method, zoo  # noqa: F401  (registers the default cards)
from harness.pipeline import card as cards, cases

DTYPES = ("fp16", "16a8w", "8a8w", "16a4w")
SOCS = ["SM8650", "SM8750"]


def test_every_case_once_with_neighbours_on_other_socs_and_dtypes():
    matrix = cases.with_meta_llama(cards.cards(), DTYPES, SOCS)
    ids = [case.id for case in matrix]
    assert len(ids) == len(set(ids))
    expected = {
        (card.name, dtype, soc)
        for card in cards.cards()
        if not card.tags & {cases.HEALTH_CHECK_TAG, cases.DRIVEN_TAG}  # driven cards: the driver matrix
        for dtype in DTYPES
        if dtype in card.dtypes
        for soc in SOCS
    }
    assert {(case.card.name, case.dtype, case.soc) for case in matrix} == expected
    neighbours = [(a, b) for a, b in zip(matrix, matrix[1:]) if a.card is b.card and a.mode is b.mode]
    multi_dtype = [(a, b) for a, b in neighbours if len([d for d in DTYPES if d in a.card.dtypes]) > 1]
    assert multi_dtype and all(a.soc != b.soc for a, b in neighbours), "one device per SoC: neighbours share none"
    # A card of two dtypes on two SoCs has four cases, which cannot alternate both: one pair of neighbours shares a
    # dtype there (and waits on one quantized program), never more; with three or more dtypes none does.
    same_dtype = Counter((a.card.name, a.mode, a.share_mutable_buffers) for a, b in multi_dtype if a.dtype == b.dtype)
    allowed = {
        (a.card.name, a.mode, a.share_mutable_buffers): int(len(set(a.card.dtypes) & set(DTYPES)) == 2)
        for a, _ in multi_dtype
    }
    assert all(count <= allowed[key] for key, count in same_dtype.items()), f"neighbours share a dtype: {same_dtype}"


def test_a_card_and_dtype_is_never_its_own_neighbour():
    card = cards.find("fixtures.zoo:counter_add")
    for socs in (SOCS, ["SM8450", "SM8550", "SM8650"]):
        order = cases.matrix([card], DTYPES, socs)
        assert len(order) == 2 * len(socs) * len([dtype for dtype in DTYPES if dtype in card.dtypes])
        assert all(a.dtype != b.dtype for a, b in zip(order, order[1:]) if a.mode is b.mode)


def test_one_soc_and_one_dtype_still_give_every_case():
    card = cards.find("fixtures.zoo:counter_add")
    assert [case.soc for case in cases.matrix([card], ("fp16",), ["SM8650"])] == ["SM8650", "SM8650"]
