"""Check: the suite's compiled runner and the reference runner give bit-equal outputs (harness/checks/runner_parity.py)."""

from harness.check_registry import suite_test

test_runner_parity = suite_test("runner_parity")
