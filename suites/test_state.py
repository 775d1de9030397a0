"""Check: state persists step by step as in eager (harness/checks/device_state.py)."""

from harness.check_registry import suite_test

test_state = suite_test("state")
