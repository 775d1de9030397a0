"""The known-failures manifest (fixtures/known_failures.toml): executorch defects this suite has found.

An entry names tests (a pattern on the test name), the signature of the failure it expects and,
optionally, a regular expression its message must match. A matching test that fails that way is an
expected failure (xfailed, with the reason in the report); one that fails any other way is a failure;
one that passes fails as XPASS(strict), so the manifest is kept honest (unless the entry is marked
flaky, for defects measured to show only on some runs).
"""
from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harness import check_registry
from harness.check_registry import CheckFailure
from harness.paths import REPO_ROOT

MANIFEST = REPO_ROOT / "fixtures" / "known_failures.toml"


@dataclass(frozen=True)
class KnownFailure:
    pattern: str
    signature: str
    reason: str
    reference: str = ""
    message: str = ""  # regular expression the failure's message must match (empty: any)
    # The defect shows only sometimes (e.g. an uninitialised buffer that happens to hold the right
    # bytes): a pass is then not reported as XPASS. Use only with the evidence that it varies.
    flaky: bool = False

    def explains(self, failure: BaseException) -> bool:
        return (isinstance(failure, CheckFailure) and failure.signature == self.signature
                and re.search(self.message, str(failure)) is not None)

    def describe(self) -> str:
        return f"known failure [{self.signature}]: {self.reason}" + (f" ({self.reference})" if self.reference else "")


@cache
def load(path: Path = MANIFEST) -> tuple[KnownFailure, ...]:
    """The manifest's entries; every signature must be one a registered check declares (load the checks first)."""
    signatures = check_registry.signatures()
    entries = []
    for raw in tomllib.loads(path.read_text()).get("known_failure", []):
        entry = KnownFailure(**raw)
        if entry.signature not in signatures:
            raise ValueError(f"{path}: signature {entry.signature!r} is not one of {', '.join(signatures)}")
        re.compile(entry.message)
        entries.append(entry)
    return tuple(entries)


def _literal_brackets(pattern: str) -> str:
    """Test names carry their parameters in [ ]; in a manifest pattern they are literal characters."""
    return "".join({"[": "[[]", "]": "[]]"}.get(c, c) for c in pattern)


def matching(test_name: str, path: Path = MANIFEST) -> list[KnownFailure]:
    return [entry for entry in load(path) if fnmatch.fnmatchcase(test_name, _literal_brackets(entry.pattern))]
