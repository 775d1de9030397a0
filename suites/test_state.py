"""Check: state (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_state


def test_state(case, run_check):
    run_check(check_state, case)
