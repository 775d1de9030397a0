"""`--shard INDEX/COUNT`: which cases this run (one CI job, one host) takes of the whole selection.

A case (card x dtype x mode x SoC) is never split: all of its checks share one lowering and one device
run, and its xdist_group already names it, so cases are what is dealt out. The split is deterministic
(every xdist worker and every shard computes the same one, from the same selection) and, given a previous
report (`--shard-timings`), balanced by time: greedy longest-first, each case to the shard with the least
time so far, ties to the lower case id and the lower shard. Cases the previous report lacks count as its
median case (a fresh card is about as slow as the others); without timings every case counts the same,
which deals them out round-robin in id order.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.report.gate import BaselineError, read_documents

UNTIMED_CASE_S = 1.0  # any positive constant: with no timings at all only the count of cases matters
_SPELLING = re.compile(r"(\d+)/(\d+)")


class ShardError(ValueError):
    """A bad --shard or --shard-timings value; the message names it and the fix."""


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as CI matrices and Tradefed count
    count: int
    durations_s: dict[str, float] = field(default_factory=dict)  # case id -> seconds in the previous report

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse(spelling: str, timings: Path | None = None) -> Shard:
    """`2/4` (and the previous report's case durations, when given) as a Shard."""
    match = _SPELLING.fullmatch(spelling.strip())
    if not match:
        raise ShardError(f"--shard {spelling!r}: write it as INDEX/COUNT, e.g. --shard 1/4")
    index, count = int(match[1]), int(match[2])
    if not 1 <= index <= count:
        raise ShardError(
            f"--shard {spelling}: INDEX must be between 1 and COUNT ({count}), e.g. --shard 1/{max(count, 1)}"
        )
    return Shard(index, count, case_durations(timings) if timings is not None else {})


def case_durations(path: Path) -> dict[str, float]:
    """Seconds per case id (the sum of its checks' duration_s) in a report.json or a run folder of them."""
    try:
        documents = read_documents(path)
    except BaselineError as error:
        raise ShardError(f"--shard-timings: {error}") from error
    durations: dict[str, float] = {}
    for _, document in documents:
        for case in document["cases"]:
            seconds = [check.get("duration_s") for check in case["checks"].values()]
            durations[case["case_id"]] = sum(s for s in seconds if isinstance(s, (int, float)) and s > 0)
    return durations


def assign(cases: list[str], count: int, durations_s: dict[str, float]) -> dict[str, int]:
    """Shard index (1-based) of every case id; the same input always gives the same answer."""
    known = [durations_s[case] for case in cases if durations_s.get(case, 0) > 0]
    default = statistics.median(known) if known else UNTIMED_CASE_S
    cost = {case: durations_s[case] if durations_s.get(case, 0) > 0 else default for case in set(cases)}
    loads = [0.0] * count
    shard_of = {}
    for case in sorted(cost, key=lambda c: (-cost[c], c)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shard_of[case] = lightest + 1
        loads[lightest] += cost[case]
    return shard_of


def case_of(item: pytest.Item) -> str:
    """The case an item belongs to: its xdist_group (the case id); an item outside the matrix is its own."""
    group = item.get_closest_marker("xdist_group")
    return str(group.args[0]) if group is not None and group.args else item.nodeid


def partition(items: list[pytest.Item], shard: Shard) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """(this shard's items, the others'), each in collection order."""
    cases = [case_of(item) for item in items]
    shard_of = assign(cases, shard.count, shard.durations_s)
    kept = [item for item, case in zip(items, cases) if shard_of[case] == shard.index]
    return kept, [item for item, case in zip(items, cases) if shard_of[case] != shard.index]
