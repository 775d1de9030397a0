"""Check: the exported program mutates exactly the card's buffers (harness/checks/lowering.py)."""

from harness.check_registry import suite_test

test_export = suite_test("export")
