"""Thin on purpose: the suite's pytest wiring lives in harness/plugin.py.

Before loading it, one check: pytest run outside the suite's venv (a system python3 that has pytest but not
torch) would otherwise fail with a long traceback ending in `No module named 'torch'`, or with
`unrecognized arguments: --dist` from pytest.ini. It says so in one line and exits 4 (a usage error) instead.
The check runs while pytest loads this initial conftest, before it parses the command line; an exception
raised here would be wrapped and printed as a traceback, so it exits with SystemExit, which pytest lets pass.
"""

from __future__ import annotations

import importlib.util
import sys

# What harness.plugin (and pytest.ini's --dist) cannot do without, by import name (pytest-xdist is "xdist").
REQUIRED_MODULES = ("torch", "executorch", "adbutils", "xdist")


def missing_modules(names: tuple[str, ...] = REQUIRED_MODULES) -> list[str]:
    """The names that this interpreter cannot import (found without importing them: torch takes seconds)."""
    return [name for name in names if importlib.util.find_spec(name) is None]


def outside_the_venv_line(missing: list[str], executable: str) -> str:
    """The one line that names what is missing, from which Python, and the command that sets it up."""
    verb = "is" if len(missing) == 1 else "are"
    return (
        f"qnnsuite: {', '.join(missing)} {verb} not importable from {executable}: "
        f"run harness/run.sh suite (it sets up .venv) or activate .venv"
    )


_missing = missing_modules()
if _missing:
    sys.stderr.write(outside_the_venv_line(_missing, sys.executable) + "\n")
    raise SystemExit(4)  # pytest.ExitCode.USAGE_ERROR; pytest may not even be the version the venv pins

pytest_plugins = ["harness.plugin"]
