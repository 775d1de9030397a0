"""Harness tests only: tells harness/tests/child_suite.py whether the running test is marked child_suite,
before any of its fixtures starts (a module's fixture may start the suite run its tests share)."""

from __future__ import annotations

import pytest

from harness.tests import child_suite


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    child_suite.running_test_is_marked = item.get_closest_marker(child_suite.MARKER) is not None
