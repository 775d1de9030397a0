"""Check: the device starts from each buffer's registered value (harness/checks/device_state.py)."""

from harness.check_registry import suite_test

test_initial_state = suite_test("initial_state")
