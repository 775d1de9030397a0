"""Lowering ahead in a run without xdist workers: the next case is lowered while this one runs, one lowering at a
time, in the run's order; a lowering that raises fails its own case only, and nothing starts after the run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.case_store import CaseStore
from harness.pipeline import card as cards
from harness.vocabulary import Case, Mode

CARD = cards.find("fixtures.zoo:counter_add")
ORDER = [Case(CARD, "fp16", mode, soc) for soc in ("SM8650", "SM8750") for mode in (Mode.DELEGATE, Mode.SKIP)]


class Lowerings:
    """Stands in for CaseStore._lower_once: records order and overlap; slow enough for overlap to show."""

    def __init__(self, failing: str = "") -> None:
        self.order: list[str] = []
        self.running = self.most_at_once = 0
        self.threads: set[str] = set()
        self.failing = failing
        self.lock = threading.Lock()

    def __call__(self, case: Case, steps: int) -> SimpleNamespace:
        with self.lock:
            self.order.append(case.id)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.threads.add(threading.current_thread().name)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        if case.id == self.failing:
            raise OSError(28, "No space left on device")
        return SimpleNamespace(case=case, cached=False, facts=SimpleNamespace(timings_s={}))


@pytest.fixture
def store(tmp_path: Path, monkeypatch) -> CaseStore:
    results = SimpleNamespace(reference=[[]], dependence=None)
    monkeypatch.setattr("harness.case_store.references.eager_results", lambda case, steps, cache_dir: results)
    return CaseStore(None, None, tmp_path / "work", "main", lambda tags: 2, 60.0, None, None)


def test_cases_are_lowered_ahead_in_order_one_at_a_time(store: CaseStore):
    lowerings = store._lower_once = Lowerings()
    store.lower_ahead(ORDER + ORDER[:1])  # a case asked for again is lowered once
    for case in ORDER:
        assert store.lowered(case).artifact.case is case
    assert lowerings.order == [case.id for case in ORDER]
    assert lowerings.most_at_once == 1 and lowerings.threads == {"qnnsuite-lower-ahead"}


def test_a_lowering_that_raises_fails_its_own_case_only(store: CaseStore):
    store._lower_once = Lowerings(failing=ORDER[1].id)
    store.lower_ahead(ORDER)
    assert store.lowered(ORDER[0]).artifact.case is ORDER[0]
    with pytest.raises(OSError, match="No space left"):
        store.lowered(ORDER[1])
    assert store.lowered(ORDER[2]).artifact.case is ORDER[2]


def test_nothing_is_lowered_ahead_once_the_run_is_closed(store: CaseStore):
    lowerings = store._lower_once = Lowerings()
    store.close()
    store.lower_ahead(ORDER)
    assert store.lowered(ORDER[0]).artifact.case is ORDER[0]  # asked for: lowered by the asker itself
    assert lowerings.order == [ORDER[0].id] and lowerings.threads == {threading.current_thread().name}
