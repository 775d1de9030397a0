"""The case matrices a check runs over: card x dtype x mode x SoC."""

from __future__ import annotations

import re
from dataclasses import replace

from harness.pipeline.card import ModelCard
from harness.qnn import soc as soc_table
from harness.vocabulary import MATRIX_MODES, MIN_HTP_ARCH, Case, Mode

META_LLAMA_TAG = "meta_llama"  # cards built by executorch's Meta llama flow (harness/pipeline/meta_llama.py)
HEALTH_CHECK_TAG = "health_check"  # the devices' health check program (harness/pipeline/health_card.py), never a case
DRIVEN_TAG = "driven"  # cards run only in the driver matrix (fixtures/drivers.py)
# A check test's case in its node id: test_x[CASE], and under --dist loadgroup test_x[CASE]@GROUP
CASE_PARAMETER = re.compile(r"\[([^\[\]]+)\](?:@[^\[\]]*)?$")
# The long driver's cases: by default a small subset (the driven cards that ask for it, in their long_dtypes);
# a run given --horizon N widens it to every driven card in every dtype its drive runs in (widen_long_driver).
_LONG_WIDENED = False


def widen_long_driver(widened: bool) -> None:
    """Whether the run's long driver covers every driven card and dtype (--horizon N given) or its default
    subset: set once per process (the controller and each worker) from the run's options, before collection."""
    global _LONG_WIDENED
    _LONG_WIDENED = widened


def matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Every card in every dtype it supports, in both buffer modes (Meta llama flow and health check cards aside)."""
    return [
        case
        for mode in MATRIX_MODES
        for share in (False, True)
        for card in cards
        if not card.tags & {META_LLAMA_TAG, HEALTH_CHECK_TAG, DRIVEN_TAG} and share in _share_variants(card)
        for case in _card_cases(card, mode, dtypes, socs, share)
    ]


def _share_variants(card: ModelCard) -> tuple[bool, ...]:
    """A multi-method card is lowered without and with share_mutable_buffers (what upstream's multi-method
    LLM export offers, #17496); a single-method program has nothing to share across methods. The variants
    are an outer loop of the matrix, as the modes are, so a card's neighbours keep differing in SoC and dtype."""
    return (False, True) if card.multi_method else (False,)


def multi_method_matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """The standard matrix's multi-method cases (what cross_method_state judges)."""
    return [case for case in matrix(cards, dtypes, socs) if case.card.multi_method]


def driver_matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Every driven card under each driver it allows (harness/pipeline/drivers.py), in both buffer modes (with
    the buffers delegated, each method holds its own copy: docs/FINDINGS.md#F15; kept outside, the driving
    itself is judged) and each of its dtypes, the long driver in its declared subset of them (every driven card in
    every dtype under --horizon N: widen_long_driver). A driver changes the run only, so a card/dtype/SoC's
    drivers share one lowering (Case.lowering)."""
    from harness.pipeline import drivers  # torch: only where a driver matrix is made

    driven = [card for card in map(drivers.driven, cards) if card is not None and HEALTH_CHECK_TAG not in card.tags]
    return [
        replace(case, driver=driver)
        for card in driven
        if card.drive is not None
        for mode in MATRIX_MODES
        for driver in _with_long(drivers.available(card.drive))
        for case in _card_cases(card, mode, card.drive.dtypes or dtypes, socs)
        if case.dtype in dtypes and (driver != "long" or _LONG_WIDENED or case.dtype in card.drive.long_dtypes)
    ]


def _with_long(available: tuple[str, ...]) -> tuple[str, ...]:
    """A driven card's drivers, with the long one when the run widens it (it needs only the width-1 method every
    driven card has)."""
    return available + ("long",) if _LONG_WIDENED and "long" not in available else available


def meta_llama_matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Cards of executorch's Meta llama flow, lowered by it in every dtype (its buffers are kept outside)."""
    return [
        case
        for card in cards
        if META_LLAMA_TAG in card.tags
        for case in _card_cases(card, Mode.META_LLAMA, dtypes, socs)
    ]


def _card_cases(
    card: ModelCard, mode: Mode, dtypes: tuple[str, ...], socs: list[str], share: bool = False
) -> list[Case]:
    """A card's cases in one mode, in the order xdist hands them out: each the first one left that differs
    from the one before in SoC and dtype (else in SoC, else any), from its dtypes in turn on rotating SoCs.

    Neighbours differ in SoC, so two workers hold two devices at once (a warm run is device runs, one device
    per SoC) rather than queueing on one; and in dtype, so they do not wait on one quantized program's lock
    (harness/pipeline/prepared.py; measured with the mode varying fastest: the second worker waited out the
    first's export and quantization)."""
    supported = [dtype for dtype in dtypes if dtype in card.dtypes]
    left = [
        (dtype, socs[(index + turn) % len(socs)]) for turn in range(len(socs)) for index, dtype in enumerate(supported)
    ]
    order: list[tuple[str, str]] = []
    while left:
        before = order[-1] if order else None
        chosen = (
            next((pair for pair in left if before is None or (pair[0] != before[0] and pair[1] != before[1])), None)
            or next((pair for pair in left if pair[1] != before[1]), None)
            or left[0]
        )
        left.remove(chosen)
        order.append(chosen)
    return [Case(card, dtype, mode, soc, share, unsupported(dtype, soc)) for dtype, soc in order]


def unsupported(dtype: str, soc: str) -> str:
    """Why dtype cannot run on soc (its cases are listed and skipped with this reason, never lowered or run), or
    "" when it can: 16a4w_block (LPBQ) needs HTP V69 or newer, as executorch's quantizer validates
    (htp_rules.validate_lpbq_support) and QNN's HTP ops support; the suite's default SoCs (V75, V79) have it."""
    need = MIN_HTP_ARCH.get(dtype)
    if need is None:
        return ""
    arch = soc_table.lookup(soc).htp_arch
    if arch >= need:
        return ""
    return f"{dtype} needs HTP V{need} or newer: {soc} is HTP V{arch}"


def runnable(candidates: list[Case]) -> list[Case]:
    """The cases that are run (lowered and run on a device): the ones the matrix does not skip."""
    return [case for case in candidates if not case.skip_reason]


def with_meta_llama(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """The standard matrix plus the Meta llama flow's cases: device checks compare both with eager."""
    return matrix(cards, dtypes, socs) + meta_llama_matrix(cards, dtypes, socs)


def case_ids(nodeids: list[str]) -> set[str]:
    """The case ids of collected check tests (what the controller sees of a collection under xdist)."""
    return {found.group(1) for found in map(CASE_PARAMETER.search, nodeids) if found}


def collected(nodeids: list[str], candidates: list[Case]) -> list[Case]:
    """The candidate cases that collected check tests name and that run, in id order (what is lowered ahead)."""
    known, ids = {case.id: case for case in runnable(candidates)}, case_ids(nodeids)
    return [known[case_id] for case_id in sorted(ids) if case_id in known]


def in_run_order(items: list) -> list[Case]:
    """The cases of collected pytest items (a check's test takes its case as the parameter `case`), in the
    items' order, which is the order a run without xdist workers asks for them (skipped cases are never asked)."""
    return runnable(
        [
            item.callspec.params["case"]
            for item in items
            if "case" in getattr(getattr(item, "callspec", None), "params", {})
        ]
    )
