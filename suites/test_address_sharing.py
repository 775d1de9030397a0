"""Check: each delegated buffer's input and output share one address (harness/checks/device_state.py)."""

from harness.check_registry import suite_test

test_address_sharing = suite_test("address_sharing")
