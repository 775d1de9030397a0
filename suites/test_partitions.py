"""Check: partitions (see harness/checks.py and DESIGN.md)."""
from harness.checks import check_partitions


def test_partitions(case, run_check):
    run_check(check_partitions, case)
