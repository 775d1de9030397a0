"""Check: what one method writes, the next method reads, as eager running the plan on one module (harness/checks/cross_method.py)."""

from harness.check_registry import suite_test

test_cross_method_state = suite_test("cross_method_state")
