"""`python -m harness repro` reads a run folder's report.json as data from elsewhere (harness/report/intake.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT

CASE = "kv_arange_init-fp16-delegate_mutbuf-SM8650"


@pytest.mark.child_python
def test_a_fifo_planted_as_report_json_does_not_hang_repro(tmp_path):
    """The attack: report.json read with read_text() waited forever on a FIFO nobody writes; through intake it
    is refused (not a regular file) in one line, exit 4 (a malformed report file, as for diff and merge)."""
    for where in (tmp_path / "top", tmp_path / "soc" / "SM8650"):
        where.mkdir(parents=True)
        os.mkfifo(where / "report.json")
        run = tmp_path / where.relative_to(tmp_path).parts[0]
        completed = subprocess.run(
            [sys.executable, "-m", "harness", "repro", CASE, "--run", str(run)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode == 4, completed.stdout + completed.stderr
        (line,) = completed.stderr.strip().splitlines()
        assert "is not a regular file" in line and line.startswith("repro: ")


def test_an_oversized_or_malformed_report_is_one_line(tmp_path):
    from harness.report.intake import read_report
    from harness.repro.rerun import RerunError, find_case

    (tmp_path / "report.json").write_text("[" * 100000)
    with pytest.raises(RerunError, match="report.json nests deeper|report.json is not") as raised:
        find_case(tmp_path, CASE, read_report)
    assert "\n" not in str(raised.value)
