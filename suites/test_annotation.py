"""Check: annotation (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_annotation


def test_annotation(case, run_check):
    run_check(check_annotation, case)
