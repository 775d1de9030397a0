"""Check: export (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_export


def test_export(case, run_check):
    run_check(check_export, case)
