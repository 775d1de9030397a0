"""Where the suite keeps what it builds: one place, so every module agrees and tests can redirect it."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_dir() -> Path:
    """Git-ignored home of the laid-out QNN tree, the interposer builds and probe results.

    QNNSUITE_HOME moves it (tests use this to start from nothing).
    """
    return Path(os.environ.get("QNNSUITE_HOME", REPO_ROOT / ".qnn")).resolve()
