"""The manifest states each finding once (fixtures/known_failures.toml: a [findings.F<n>] table with where
upstream its cause lies and, once filed, its issue); an entry names its finding and its reference is made of
both, exactly as reports have always shown it. A manifest that names no finding, or a wrong one, is one line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the checks whose signatures the manifests name)
from harness import known_failures

ENTRY = '[[known_failure]]\npattern = "test_state[{card}]"\nsignature = "state_mismatch"\nreason = "r"\n'
ISSUE = "https://github.com/pytorch/executorch/issues/1"


def _load(tmp_path: Path, text: str) -> tuple[known_failures.KnownFailure, ...]:
    path = tmp_path / "known_failures.toml"
    path.write_text(text)
    return known_failures.load(path)


def test_an_entry_carries_its_findings_source_and_issue_unless_it_states_its_own(tmp_path):
    text = (
        f'[findings.F7]\nsource = "executorch a.py"\nupstream = "{ISSUE}"\n\n'
        + ENTRY.format(card="a")
        + 'finding = "F7"\n\n'
        + ENTRY.format(card="b")
        + 'finding = "F7"\nsource = "executorch b.py"\n'
    )
    first, second = _load(tmp_path, text)
    assert (first.reference, first.upstream) == ("docs/FINDINGS.md#F7; executorch a.py", ISSUE)
    assert second.reference == "docs/FINDINGS.md#F7; executorch b.py" and second.upstream == ISSUE
    assert (
        first.describe()
        == f"known failure [state_mismatch]: r (docs/FINDINGS.md#F7; executorch a.py) [upstream: {ISSUE}]"
    )


def test_a_manifest_without_findings_gives_its_references_itself(tmp_path):
    (entry,) = _load(tmp_path, ENTRY.format(card="a") + 'reference = "my notes"\n')
    assert entry.reference == "my notes"


@pytest.mark.parametrize(
    "text, said",
    [
        (ENTRY.format(card="a") + 'finding = "F9"\n', "names finding 'F9', which has no [findings.F9] table"),
        (
            '[findings.F9]\nsource = "x"\n\n' + ENTRY.format(card="a") + 'finding = "F9"\nreference = "y"\n',
            "has both finding and reference",
        ),
        ('[findings.notes]\nsource = "x"\n', "[findings.notes] must be a finding of docs/FINDINGS.md"),
        ('[findings.F9]\nsource = "x"\nowner = "me"\n', "[findings.F9] must be a finding of docs/FINDINGS.md"),
        (
            '[findings.F9]\nupstream = "https://example.org/1"\n\n' + ENTRY.format(card="a") + 'finding = "F9"\n',
            "not an upstream issue",
        ),
    ],
)
def test_a_wrong_finding_is_one_line_naming_it(tmp_path, text: str, said: str):
    with pytest.raises(ValueError, match="known_failures.toml") as raised:
        _load(tmp_path, text)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_the_suites_manifest_states_each_reference_once():
    """Every entry of fixtures/known_failures.toml names its finding; none repeats a reference, and every
    finding table is used by an entry or a signature hint."""
    manifest = tomllib.loads(known_failures.MANIFEST.read_text(encoding="utf-8"))
    entries = manifest["known_failure"]
    assert all("finding" in entry and "reference" not in entry for entry in entries)
    hinted = {hint["finding"] for hint in manifest.get("signature_hint", [])}  # F18: a hint, no entry
    assert set(manifest["findings"]) == {entry["finding"] for entry in entries} | hinted
    assert all(entry.get("source") != manifest["findings"][entry["finding"]]["source"] for entry in entries)
