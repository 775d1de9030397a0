"""Check: the quantizer leaves mutated buffers unannotated (harness/checks/lowering.py)."""

from harness.check_registry import suite_test

test_annotation = suite_test("annotation")
