"""The case matrices a check runs over: card x dtype x mode x SoC."""
from __future__ import annotations

import re

from harness.pipeline.card import ModelCard
from harness.vocabulary import MATRIX_MODES, Case, Mode

META_LLAMA_TAG = "meta_llama"  # cards built by executorch's Meta llama flow (harness/pipeline/meta_llama.py)
HEALTH_CHECK_TAG = "health_check"  # the devices' health check program (harness/pipeline/health_card.py), never a case
# A check test's case in its node id: test_x[CASE], and under --dist loadgroup test_x[CASE]@GROUP
CASE_PARAMETER = re.compile(r"\[([^\[\]]+)\](?:@[^\[\]]*)?$")


def matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Every card in every dtype it supports, in both buffer modes (Meta llama flow and health check cards aside).

    Mode and SoC vary slowest: the cases that share a card and dtype's prepared program (harness/pipeline/
    prepared.py) are far apart in the order xdist hands them out, so while the first of them prepares it the
    other worker lowers another card or dtype instead of waiting on its lock (measured with the mode varying
    fastest: the second worker waited out the first's export and quantization, and -n 2 gained nothing)."""
    return [Case(card, dtype, mode, soc) for mode in MATRIX_MODES for soc in socs for card in cards
            if not card.tags & {META_LLAMA_TAG, HEALTH_CHECK_TAG} for dtype in dtypes if dtype in card.dtypes]


def meta_llama_matrix(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """Cards of executorch's Meta llama flow, lowered by it in every dtype (its buffers are kept outside)."""
    return [Case(card, dtype, Mode.META_LLAMA, soc) for soc in socs for card in cards if META_LLAMA_TAG in card.tags
            for dtype in dtypes if dtype in card.dtypes]


def with_meta_llama(cards: list[ModelCard], dtypes: tuple[str, ...], socs: list[str]) -> list[Case]:
    """The standard matrix plus the Meta llama flow's cases: device checks compare both with eager."""
    return matrix(cards, dtypes, socs) + meta_llama_matrix(cards, dtypes, socs)


def case_ids(nodeids: list[str]) -> set[str]:
    """The case ids of collected check tests (what the controller sees of a collection under xdist)."""
    return {found.group(1) for found in map(CASE_PARAMETER.search, nodeids) if found}


def collected(nodeids: list[str], candidates: list[Case]) -> list[Case]:
    """The candidate cases that collected check tests name, in id order."""
    known, ids = {case.id: case for case in candidates}, case_ids(nodeids)
    return [known[case_id] for case_id in sorted(ids) if case_id in known]
