"""Check: initial state (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_initial_state


def test_initial_state(case, run_check):
    run_check(check_initial_state, case)
