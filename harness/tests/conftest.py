"""Harness tests only: marks each test by what it starts (harness/tests/tiers.py) before pytest's -m selection,
and tells harness/tests/child_suite.py and tiers.py the running test's markers before any of its fixtures
starts (a module's fixture may start the suite run or the devices its tests share)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.emulator.launcher import EmulatorFleet
from harness.tests import child_suite, tiers


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection reads the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tiers.mark_by_fixtures(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    tiers.running_markers = frozenset(mark.name for mark in item.iter_markers())
    child_suite.running_test_is_marked = child_suite.MARKER in tiers.running_markers


@pytest.fixture(scope="session", autouse=True)
def _devices_only_for_marked_tests() -> Iterator[None]:
    """EmulatorFleet.start refuses a test that is not marked `device` (tiers.require_device_marker)."""
    start = EmulatorFleet.start

    def checked_start(fleet: EmulatorFleet) -> EmulatorFleet:
        tiers.require_device_marker()
        return start(fleet)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EmulatorFleet, "start", checked_start)
        yield
