"""Check: on the long driver the error per step does not drift (harness/checks/driving.py)."""

from harness.check_registry import suite_test

test_horizon = suite_test("horizon")
