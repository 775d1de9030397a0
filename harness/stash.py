"""The keys under which the run's options and context sit in pytest's config stash (shared by the
plugin, which sets them, and the fixtures, which read them)."""
from __future__ import annotations

import pytest

from harness.context import RunContext
from harness.options import RunOptions

OPTIONS = pytest.StashKey[RunOptions]()
CONTEXT = pytest.StashKey[RunContext]()
