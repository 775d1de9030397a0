"""The one way a harness test starts the suite in a child process (`python -m pytest suites ...` from the
repository root), so the argv that every such test shares is written once.

A test that starts the suite in a child process, a run or only a collection (a collection imports torch,
executorch and every card: seconds under load), is marked `child_suite`: the fast tier leaves it out
(docs/ARCHITECTURE.md, "The fast inner loop"). The marker is kept honest here: suite_command, and so run_suite
and start_suite, refuse a test that is not marked (harness/tests/conftest.py tells this module which test is
running).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from harness.paths import REPO_ROOT

MARKER = "child_suite"
SUITES = ("suites",)
# Set by harness/tests/conftest.py before each test's fixtures: whether the running test is marked; None
# outside a harness test session (nothing to enforce).
running_test_is_marked: bool | None = None


def suite_command(*args: str, targets: Sequence[str] = SUITES) -> list[str]:
    """The argv of a child suite run: pytest on `targets` (the suite, or some of its files), quiet, with no
    cache folder of pytest's own, then `args`."""
    _require_marker()
    return [sys.executable, "-m", "pytest", *targets, "-p", "no:cacheprovider", "-q", *args]


def _require_marker() -> None:
    if running_test_is_marked is False:
        raise AssertionError(
            f"this test starts a child suite run: mark it @pytest.mark.{MARKER} (the fast tier leaves it out)"
        )


def run_suite(
    *args: str,
    targets: Sequence[str] = SUITES,
    timeout: float = 900,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the suite in a child process from the repository root and wait for it (bounded by `timeout`);
    its stdout and stderr are captured as text."""
    return subprocess.run(
        suite_command(*args, targets=targets),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_suite(*args: str, targets: Sequence[str] = SUITES, **popen: object) -> subprocess.Popen:
    """Start the suite in a child process from the repository root, for a test that acts on it while it
    runs (a signal, a lost device); `popen` as subprocess.Popen takes it (stdout, env, ...)."""
    return subprocess.Popen(suite_command(*args, targets=targets), cwd=REPO_ROOT, **popen)
