"""The pinned pytest/pytest-xdist pair must keep an xdist_group on one worker under --dist loadgroup.

Measured (pytest-dev/pytest-xdist#1386): pytest 9.2.0 with xdist 3.8.0 ignores the groups; the suite relies on grouping to keep a
device's cases together, so this is checked, not assumed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest

MARKED_TESTS = """
import json, os, pytest
@pytest.mark.xdist_group("a")
@pytest.mark.parametrize("index", range(6))
def test_a(index):
    with open(os.environ["GROUP_LOG"], "a") as log:
        log.write(json.dumps(["a", os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
@pytest.mark.xdist_group("b")
@pytest.mark.parametrize("index", range(6))
def test_b(index):
    with open(os.environ["GROUP_LOG"], "a") as log:
        log.write(json.dumps(["b", os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
"""


@pytest.mark.child_python
def test_loadgroup_keeps_each_group_on_one_worker(tmp_path):
    (tmp_path / "test_groups.py").write_text(MARKED_TESTS)
    log = tmp_path / "groups.jsonl"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-q",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_groups.py"),
        ],
        cwd=tmp_path,
        env={**__import__("os").environ, "GROUP_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout[-2000:]
    workers = defaultdict(set)
    for line in log.read_text().splitlines():
        group, worker = json.loads(line)
        workers[group].add(worker)
    assert set(workers) == {"a", "b"}
    assert all(len(used) == 1 for used in workers.values()), dict(workers)
