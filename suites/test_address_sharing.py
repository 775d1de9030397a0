"""Check: address sharing (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_address_sharing


def test_address_sharing(case, run_check):
    run_check(check_address_sharing, case)
