"""The known-failures manifest (fixtures/known_failures.toml): executorch defects this suite has found.

An entry names tests (a pattern on the test name), the signature of the failure it expects and,
optionally, a regular expression its message must match. A matching test that fails that way is an
expected failure (xfailed, with the reason in the report); one that fails any other way is a failure;
one that passes fails as XPASS(strict), so the manifest is kept honest (unless the entry is marked
flaky, for defects measured to show only on some runs).

An entry may be scoped to versions: `executorch = ">=1.4"` (PEP 440 specifiers on the executorch
under test) and `qnn = "<2.51"` (on the QAIRT release of the QNN libraries, read from libQnnHtp.so).
Outside its scope an entry does not exist, so one manifest stays strict across a version matrix.
"""
from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

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
    executorch: str = ""  # version scope on the executorch under test, e.g. ">=1.4" (empty: every version)
    qnn: str = ""  # version scope on the QAIRT release of the QNN libraries, e.g. "<2.51" (empty: every one)

    def in_scope(self, versions: "VersionsUnderTest") -> bool:
        """Whether this entry applies to these versions; a scope only asks for the version it names."""
        return ((not self.executorch or SpecifierSet(self.executorch).contains(versions.executorch(), prereleases=True))
                and (not self.qnn or SpecifierSet(self.qnn).contains(versions.qnn(), prereleases=True)))

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
        for field, scope in (("executorch", entry.executorch), ("qnn", entry.qnn)):
            try:
                SpecifierSet(scope)
            except InvalidSpecifier:
                raise ValueError(f"{path}: entry {entry.pattern!r} has {field} = {scope!r}, not a version "
                                 f"specifier: write e.g. \">=1.4\" or \">=2.47,<2.51\"") from None
        entries.append(entry)
    return tuple(entries)


@cache
def _literal_brackets(pattern: str) -> str:
    """Test names carry their parameters in [ ]; in a manifest pattern they are literal characters."""
    return "".join({"[": "[[]", "]": "[]]"}.get(c, c) for c in pattern)


class VersionsUnderTest:
    """The executorch and QAIRT versions a run tests, each measured only when a scope asks for it
    (reading the QAIRT build id scans libQnnHtp.so; unscoped manifests never pay for it)."""

    def __init__(self, executorch: str | None = None, qnn: str | None = None) -> None:
        self._executorch, self._qnn = executorch, qnn

    @cache
    def executorch(self) -> Version:
        raw = self._executorch
        if raw is None:
            try:
                raw = metadata.version("executorch")
            except metadata.PackageNotFoundError:
                raise ValueError("an entry is scoped to executorch versions but executorch is not installed: "
                                 "run the README's set-up command") from None
        try:
            return Version(raw)
        except InvalidVersion:
            raise ValueError(f"executorch version {raw!r} is not a PEP 440 version, so executorch scopes "
                             f"cannot be evaluated: install a released or dev build") from None

    @cache
    def qnn(self) -> Version:
        from harness.qnn import qairt, sdk

        try:
            return qairt.release_of(self._qnn or qairt.build_id_of(sdk.resolve().htp_library))
        except (qairt.QairtVersionError, sdk.SdkError) as error:
            raise ValueError(f"an entry is scoped to QNN versions but the QAIRT release is unknown: {error}") from None


@cache
def versions_under_test() -> VersionsUnderTest:
    """This process's versions: the installed executorch, and the QNN libraries of QNN_SDK_ROOT (the
    overlay's source when it is one) or else the tree laid out from the onnxruntime-qnn wheel."""
    return VersionsUnderTest()


def matching(test_name: str, versions: VersionsUnderTest | None = None, path: Path = MANIFEST) -> list[KnownFailure]:
    named = [entry for entry in load(path) if fnmatch.fnmatchcase(test_name, _literal_brackets(entry.pattern))]
    return [entry for entry in named if entry.in_scope(versions or versions_under_test())]
