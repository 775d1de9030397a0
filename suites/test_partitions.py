"""Check: one QNN delegate, buffers inside or outside as the mode says (harness/checks/lowering.py)."""

from harness.check_registry import suite_test

test_partitions = suite_test("partitions")
