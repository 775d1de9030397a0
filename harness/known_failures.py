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
import re._constants as sre  # the parsed form of a pattern: what backtracking can blow up is read from it
import re._parser
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
UPSTREAM_ISSUE = re.compile(r"https://github\.com/pytorch/(?:executorch|ao|pytorch)/(?:issues|pull)/[0-9]{1,9}")
FINDINGS = REPO_ROOT / "docs" / "FINDINGS.md"  # where each entry's `reference` (docs/FINDINGS.md#F<n>) points
# A manifest's message pattern meets every failure of its signature, and Python's re backtracks: `(a+)+$`
# takes hours on 30 characters, `.*a.*a.*b` two minutes on 1000. So patterns with a quantifier inside a
# quantified group (or an alternation under one) are refused at load, at most MAX_OPEN_REPEATS quantifiers
# may repeat without bound, and a message is matched on its first MATCHED_MESSAGE_CHARS characters (a
# check's message is one line, measured at 223 characters at most: the bound cuts no real one).
MATCHED_MESSAGE_CHARS = 2000
MAX_OPEN_REPEATS = 2
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)


@cache
def finding_titles() -> dict[str, str]:
    """docs/FINDINGS.md anchors (F1, ...) -> their section titles (what a bundle's and a finding's issue is called)."""
    if not FINDINGS.is_file():
        return {}
    text = FINDINGS.read_text(encoding="utf-8")
    return {anchor: title.strip() for anchor, title in re.findall(r'<a id="(F\d+)"></a>\s*\n## F\d+\.\s*(.+)', text)}


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
    upstream: str = (
        ""  # the upstream issue filed for it (docs/FILING.md), e.g. https://github.com/pytorch/executorch/issues/1
    )

    def in_scope(self, versions: VersionsUnderTest) -> bool:
        """Whether this entry applies to these versions; a scope only asks for the version it names."""
        return (
            not self.executorch or SpecifierSet(self.executorch).contains(versions.executorch(), prereleases=True)
        ) and (not self.qnn or SpecifierSet(self.qnn).contains(versions.qnn(), prereleases=True))

    def explains(self, failure: BaseException) -> bool:
        """The failure is the one this entry expects: its signature, and its message (the first
        MATCHED_MESSAGE_CHARS characters, so no message makes a pattern's match run long) matches."""
        return (
            isinstance(failure, CheckFailure)
            and failure.signature == self.signature
            and re.search(self.message, str(failure)[:MATCHED_MESSAGE_CHARS]) is not None
        )

    def describe(self) -> str:
        return (
            f"known failure [{self.signature}]: {self.reason}"
            + (f" ({self.reference})" if self.reference else "")
            + (f" [upstream: {self.upstream}]" if self.upstream else "")
        )


def backtracking_risk(pattern: str) -> str:
    """Why matching pattern could take exponential (or high polynomial) time, or "" if it cannot."""
    open_repeats = 0

    def walk(parsed: re._parser.SubPattern | list, repeated: bool) -> str:
        nonlocal open_repeats
        for op, value in parsed:
            if op in _REPEATS:
                low, high, body = value
                if high > 1 and repeated:
                    return "a quantifier inside a quantified group, as in (a+)+"
                open_repeats += high == sre.MAXREPEAT
                if problem := walk(body, repeated or high > 1):
                    return problem
            elif op is sre.BRANCH:
                if repeated:
                    return "an alternation inside a quantified group, as in (ab|ab)*"
                for alternative in value[1]:
                    if problem := walk(alternative, repeated):
                        return problem
            elif op is sre.SUBPATTERN and (problem := walk(value[3], repeated)):
                return problem
            elif op in (sre.ASSERT, sre.ASSERT_NOT) and (problem := walk(value[1], repeated)):
                return problem
            elif op is sre.ATOMIC_GROUP and (problem := walk(value, repeated)):
                return problem
            elif op is sre.GROUPREF_EXISTS:
                for branch in value[1:]:
                    if branch is not None and (problem := walk(branch, repeated)):
                        return problem
        return ""

    problem = walk(re._parser.parse(pattern), False)
    if not problem and open_repeats > MAX_OPEN_REPEATS:
        problem = f"{open_repeats} unbounded quantifiers (at most {MAX_OPEN_REPEATS})"
    return problem


def _checked_message(path: Path, entry: KnownFailure) -> None:
    """The entry's message pattern compiles and cannot make a match run long; else one ValueError line."""
    if not isinstance(entry.message, str):
        raise ValueError(f"{path}: entry {entry.pattern!r} has message = {entry.message!r}: write a string")
    try:
        re.compile(entry.message)
    except re.error as error:
        raise ValueError(
            f"{path}: entry {entry.pattern!r} has message {entry.message!r}, not a regular "
            f"expression ({error}): fix or escape it"
        ) from None
    if problem := backtracking_risk(entry.message):
        raise ValueError(
            f"{path}: entry {entry.pattern!r} has message {entry.message!r} with {problem}: a "
            f"failure's message could make matching it run for hours; match a plainer part of the "
            f"message (e.g. a literal phrase)"
        )


def _manifest(path: Path) -> dict:
    """The manifest's TOML document; a file that is not a readable TOML manifest is one ValueError naming it."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"{path} is not a readable TOML manifest ({error})") from None


def _tables(path: Path, manifest: dict, kind: str) -> list[dict]:
    """The manifest's [[kind]] tables; a `kind` that is not a list of tables is one ValueError naming the file."""
    raws = manifest.get(kind, [])
    if not isinstance(raws, list) or not all(isinstance(raw, dict) for raw in raws):
        raise ValueError(f"{path}: {kind} must be a list of tables ([[{kind}]] entries)")
    return raws


FINDING_NAME = re.compile(r"F[0-9]{1,4}")  # a docs/FINDINGS.md anchor: the reports make a link of it


FINDING_FIELDS = ("source", "upstream")  # what a finding states once for all its entries


def _findings(path: Path, manifest: dict) -> dict[str, dict[str, str]]:
    """The manifest's [findings.F<n>] tables: each finding's `source` (where upstream its cause lies) and
    `upstream` (the issue filed for it), stated once for its entries."""
    tables = manifest.get("findings", {})
    if not isinstance(tables, dict):
        raise ValueError(f'{path}: findings must be tables ([findings.F1] with source = "...")')
    for name, table in tables.items():
        if not FINDING_NAME.fullmatch(name) or not isinstance(table, dict) or set(table) - set(FINDING_FIELDS):
            raise ValueError(
                f"{path}: [findings.{name}] must be a finding of docs/FINDINGS.md (F<n>) with only "
                'source = "<where upstream its cause lies>" and upstream = "<its issue>"'
            )
    return {name: {field: str(value) for field, value in table.items()} for name, table in tables.items()}


def _with_reference(path: Path, raw: dict, findings: dict[str, dict[str, str]]) -> dict:
    """An entry's fields with what its finding states (an entry's own source or upstream wins, where its case
    meets the finding elsewhere) and its reference made of both: "docs/FINDINGS.md#F<n>; <source>". An entry
    of a manifest without findings gives its reference itself."""
    if "finding" not in raw:
        return raw
    fields = dict(raw)
    name = fields.pop("finding")
    if "reference" in fields:
        raise ValueError(f"{path}: entry {raw.get('pattern')!r} has both finding and reference: keep the finding")
    if name not in findings:
        raise ValueError(
            f"{path}: entry {raw.get('pattern')!r} names finding {name!r}, which has no [findings.{name}] table"
        )
    stated = {**findings[name], **{field: fields.pop(field) for field in FINDING_FIELDS if field in fields}}
    source = str(stated.pop("source", ""))
    return {**stated, **fields, "reference": f"docs/FINDINGS.md#{name}" + (f"; {source}" if source else "")}


@cache
def load(path: Path = MANIFEST, registered: bool = True) -> tuple[KnownFailure, ...]:
    """The manifest's entries; every signature must be one a registered check declares (load the checks first;
    registered=False: a reader that imports no check, and trusts the run that checked the manifest). A manifest
    that cannot be used is one ValueError naming the file (and the entry)."""
    signatures = check_registry.signatures()
    manifest = _manifest(path)
    findings = _findings(path, manifest)
    entries = []
    for raw in _tables(path, manifest, "known_failure"):
        try:
            entry = KnownFailure(**_with_reference(path, raw, findings))
        except TypeError as error:
            raise ValueError(f"{path}: entry {raw.get('pattern')!r}: {error}") from None
        if registered and entry.signature not in signatures:
            raise ValueError(f"{path}: signature {entry.signature!r} is not one of {', '.join(signatures)}")
        _checked_message(path, entry)
        if entry.upstream and not UPSTREAM_ISSUE.fullmatch(entry.upstream):
            raise ValueError(
                f"{path}: entry {entry.pattern!r} has upstream = {entry.upstream!r}, not an upstream issue: write "
                'e.g. "https://github.com/pytorch/executorch/issues/12345" (docs/FILING.md)'
            )
        for field, scope in (("executorch", entry.executorch), ("qnn", entry.qnn)):
            try:
                SpecifierSet(scope)
            except InvalidSpecifier:
                raise ValueError(
                    f"{path}: entry {entry.pattern!r} has {field} = {scope!r}, not a version "
                    f'specifier: write e.g. ">=1.4" or ">=2.47,<2.51"'
                ) from None
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

    @cache  # noqa: B019 - one instance per run: the memo is meant to live as long as it
    def executorch(self) -> Version:
        raw = self._executorch
        if raw is None:
            try:
                raw = metadata.version("executorch")
            except metadata.PackageNotFoundError:
                raise ValueError(
                    "an entry is scoped to executorch versions but executorch is not installed: "
                    "run the README's set-up command"
                ) from None
        try:
            return Version(raw)
        except InvalidVersion:
            raise ValueError(
                f"executorch version {raw!r} is not a PEP 440 version, so executorch scopes "
                f"cannot be evaluated: install a released or dev build"
            ) from None

    @cache  # noqa: B019 - as executorch() above
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


@dataclass(frozen=True)
class SignatureHint:
    """A known finding's signature as a rule any card can meet (the manifest's [[signature_hint]] tables): a
    failure of `check` whose signature, or one of the explanations it names (its evidence's "explanations"),
    is `signature`, in `mode` where one is given, on a case the manifest expects nothing of that way. Such a
    failure stays failed (nothing here says it is that finding) and its message says it matches."""

    finding: str  # F<n>, an anchor of docs/FINDINGS.md
    check: str
    signature: str
    mode: str = ""  # the buffer mode the finding needs (a Mode's value; empty: any)
    rule: str = ""  # the finding's rule in words (why this signature in this mode is that finding)

    def matches(self, check: str, mode: str, failure: BaseException) -> bool:
        if not isinstance(failure, CheckFailure) or check != self.check or (self.mode and mode != self.mode):
            return False
        named = failure.evidence.get("explanations") if isinstance(failure.evidence, dict) else None
        return failure.signature == self.signature or (isinstance(named, list) and self.signature in named)


@cache
def hints(path: Path = MANIFEST) -> tuple[SignatureHint, ...]:
    """The manifest's signature hints; one ValueError naming the file and the table for one that cannot be
    used (an unknown field, a signature no check declares, a finding docs/FINDINGS.md does not have)."""
    signatures = check_registry.signatures()
    found = []
    for raw in _tables(path, _manifest(path), "signature_hint"):
        try:
            hint = SignatureHint(**raw)
        except TypeError as error:
            raise ValueError(f"{path}: signature_hint {raw.get('finding')!r}: {error}") from None
        if hint.signature not in signatures:
            raise ValueError(f"{path}: signature_hint {hint.finding}: signature {hint.signature!r} is no check's")
        if finding_titles() and hint.finding not in finding_titles():
            raise ValueError(f"{path}: signature_hint {hint.finding}: docs/FINDINGS.md has no finding {hint.finding}")
        found.append(hint)
    return tuple(found)


def hint_for(check: str, mode: str, failure: BaseException, path: Path = MANIFEST) -> str:
    """The words a failure that no entry expects carries when it matches known findings' signatures and rules,
    e.g. "matches F15's signature (state_per_method, docs/FINDINGS.md#F15)"; "" when none matches."""
    matched = [hint for hint in hints(path) if hint.matches(check, mode, failure)]
    if not matched:
        return ""
    named = " and ".join(f"{hint.finding}'s" for hint in matched)
    where = ", ".join(f"docs/FINDINGS.md#{hint.finding}" for hint in matched)
    return f"matches {named} signature{'s' if len(matched) > 1 else ''} ({failure.signature}, {where})"


def matching(test_name: str, versions: VersionsUnderTest | None = None, path: Path = MANIFEST) -> list[KnownFailure]:
    named = [entry for entry in load(path) if fnmatch.fnmatchcase(test_name, _literal_brackets(entry.pattern))]
    return [entry for entry in named if entry.in_scope(versions or versions_under_test())]
