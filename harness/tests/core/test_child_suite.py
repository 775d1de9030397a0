"""The one helper that starts the suite in a child process (harness/tests/child_suite.py) keeps the
child_suite marker honest: the fast tier can leave out every child suite, a run or a collection, only if a
test that starts one and is not marked fails."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT
from harness.tests import child_suite


@pytest.fixture
def started(monkeypatch) -> list[dict]:
    """What run_suite would have started (nothing is started)."""
    calls: list[dict] = []

    def run(argv, **options):
        calls.append({"argv": argv, **options})
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(child_suite.subprocess, "run", run)
    return calls


def test_an_unmarked_test_cannot_start_a_suite_run(started):
    assert child_suite.running_test_is_marked is False, "conftest told the helper this test is not marked"
    with pytest.raises(AssertionError, match=r"mark it @pytest.mark.child_suite"):
        child_suite.run_suite("--emulate", "SM8650")
    with pytest.raises(AssertionError, match=r"mark it @pytest.mark.child_suite"):
        child_suite.start_suite("--emulate", "SM8650")
    assert started == [], "refused before anything started"


def test_a_collection_is_a_child_suite_too(started, monkeypatch):
    """A collection imports torch, executorch and every card (seconds under load): the fast tier leaves it out."""
    with pytest.raises(AssertionError, match=r"mark it @pytest.mark.child_suite"):
        child_suite.run_suite("--collect-only", "--emulate", "SM8650", timeout=5)
    with pytest.raises(AssertionError, match=r"mark it @pytest.mark.child_suite"):
        child_suite.suite_command("--collect-only")  # the argv alone, as a test wrapping it in unshare uses it
    monkeypatch.setattr(child_suite, "running_test_is_marked", True)  # as conftest sets it for a marked test
    child_suite.run_suite("--collect-only", "--emulate", "SM8650", timeout=5)
    (call,) = started
    assert call["argv"] == [sys.executable, "-m", "pytest", "suites", "-p", "no:cacheprovider", "-q"] + [
        "--collect-only",
        "--emulate",
        "SM8650",
    ]
    assert (call["cwd"], call["timeout"], call["capture_output"], call["text"]) == (REPO_ROOT, 5, True, True)


def test_a_marked_test_may_start_one_on_the_files_it_names(started, monkeypatch):
    monkeypatch.setattr(child_suite, "running_test_is_marked", True)  # as conftest sets it for a marked test
    child_suite.run_suite("-k", "counter_add", targets=("suites/test_state.py",))
    (call,) = started
    assert call["argv"][3:5] == ["suites/test_state.py", "-p"] and call["argv"][-2:] == ["-k", "counter_add"]
