"""Check: a card driven as users drive it equals eager driven alike (harness/checks/driving.py)."""

from harness.check_registry import suite_test

test_driver_invariance = suite_test("driver_invariance")
