"""Fixtures for the harness's own tests."""
from __future__ import annotations

import pytest

from harness.qnn.toolchain import Toolchain, ToolchainError, prepare


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    try:
        return prepare()
    except ToolchainError as error:
        pytest.fail(str(error), pytrace=False)
