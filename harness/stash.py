"""The keys under which the run's options and context sit in pytest's config stash (shared by the
plugin, which sets them, and the fixtures, which read them)."""

from __future__ import annotations

import pytest

from harness.context import RunContext
from harness.options import RunOptions
from harness.vocabulary import Case

OPTIONS = pytest.StashKey[RunOptions]()
CONTEXT = pytest.StashKey[RunContext]()
CASE_ORDER = pytest.StashKey[list[Case]]()  # the cases in the order a run without xdist workers runs them
