"""The documents say what the code does: the README stays a front door, every link in it and in docs/
resolves, reports/README.md names what report.schema.json allows, the README's option table lists every
option, and pytest run outside the venv gets one line from the root conftest instead of a traceback.

Each check is tried on a broken input it must catch and a sound one it must pass, so none can pass vacuously.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
REPORTS_README = REPO_ROOT / "reports" / "README.md"
SCHEMA = REPO_ROOT / "harness" / "report" / "report.schema.json"
OPTIONS = REPO_ROOT / "harness" / "options.py"
README_MAX_LINES = 150

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXPLICIT_ANCHOR = re.compile(r"<a id=\"([^\"]+)\"")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def documents() -> list[Path]:
    """The README and every Markdown file under docs/: the documents a reader follows links through."""
    return [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in HEADING.findall(text)} | set(EXPLICIT_ANCHOR.findall(text))


def broken_links(document: Path, text: str) -> list[str]:
    """Relative links of a Markdown text that name no existing file, or no anchor of the Markdown file they name."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of this repository
            continue
        path_part, _, anchor = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        if not path.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            broken.append(f"{target}: no anchor #{anchor} in {path.name}")
    return broken


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(document: Path):
    assert not broken_links(document, document.read_text())


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor_and_passes_good_links():
    doc = REPO_ROOT / "docs" / "ARCHITECTURE.md"
    assert broken_links(doc, "[x](NO-SUCH-FILE.md) and [y](FINDINGS.md#no-such-anchor)") == [
        f"NO-SUCH-FILE.md: no file {REPO_ROOT / 'docs' / 'NO-SUCH-FILE.md'}",
        "FINDINGS.md#no-such-anchor: no anchor #no-such-anchor in FINDINGS.md",
    ]
    good = "[a](FINDINGS.md#F1) [b](../reports/README.md) [c](#where-to-add) [d](https://example.org/x)"
    assert broken_links(doc, good) == []


def _schema_names() -> tuple[list[str], list[str]]:
    schema = json.loads(SCHEMA.read_text())
    return schema["$defs"]["verdict"]["enum"], list(schema["properties"])


def unnamed(text: str, names: list[str]) -> list[str]:
    """The names that do not appear in text as a whole word (so `failed` is not found inside `xfailed`)."""
    return [name for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]


def test_reports_readme_names_every_verdict_and_top_level_key_of_the_schema():
    verdicts, keys = _schema_names()
    assert {"not_measured", "infra_error"} <= set(verdicts)  # the two the README once lacked
    text = REPORTS_README.read_text()
    assert unnamed(text, verdicts) == [], "reports/README.md lacks verdicts of report.schema.json"
    assert unnamed(text, keys) == [], "reports/README.md lacks top-level keys of report.schema.json"


def test_the_schema_check_catches_a_missing_verdict_and_not_a_substring():
    assert unnamed("passed | xfailed | skipped", ["passed", "failed", "skipped"]) == ["failed"]
    assert unnamed("`not_measured` and infra_error", ["not_measured", "infra_error"]) == []


def declared_options(source: str) -> list[str]:
    """Every long option harness/options.py declares, read from its source (no import: it needs pytest's parser)."""
    return re.findall(r"addoption\(\s*\"(--[a-z0-9-]+)\"", source)


def test_readme_option_table_lists_every_option():
    options = declared_options(OPTIONS.read_text())
    assert "--report-dir" in options and len(options) >= 20
    table = "\n".join(line for line in README.read_text().splitlines() if line.startswith("| `--"))
    assert unnamed(table, options) == [], "README.md's option table lacks options of harness/options.py"
    assert unnamed("| `--soc SOC` | x |", ["--soc", "--so"]) == ["--so"]


# --- the root conftest outside the venv -------------------------------------------------------------------


def _root_conftest():
    spec = importlib.util.spec_from_file_location("qnnsuite_root_conftest", REPO_ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # in the venv nothing is missing, so this defines the helpers and returns
    return module


def test_conftest_names_only_what_is_missing():
    conftest = _root_conftest()
    assert conftest.missing_modules() == []  # the venv has everything: the check must not fire here
    assert conftest.missing_modules(("json", "qnnsuite_no_such_module")) == ["qnnsuite_no_such_module"]
    assert conftest.outside_the_venv_line(["torch"], "/usr/bin/python3") == (
        "qnnsuite: torch is not importable from /usr/bin/python3: run harness/run.sh suite (it sets up .venv) "
        "or activate .venv"
    )


def _python_without_torch() -> str | None:
    """An interpreter on this machine that has pytest but not torch: what a user outside the venv runs."""
    candidates = [
        getattr(sys, "_base_executable", None),
        shutil.which("python3"),
        "/usr/bin/python3",
        shutil.which("python3.11"),
    ]
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('pytest') and not u.find_spec('torch') else 1)"
    for candidate in dict.fromkeys(c for c in candidates if c):
        try:
            if subprocess.run([candidate, "-c", probe], capture_output=True, timeout=60).returncode == 0:
                return candidate
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


@pytest.mark.parametrize(
    "args", [[], [str(Path(__file__).resolve().relative_to(REPO_ROOT)), "-q"]], ids=["suite", "harness-tests"]
)
def test_pytest_outside_the_venv_is_one_line_and_a_usage_error(args, tmp_path):
    python = _python_without_torch()
    if python is None:
        pytest.skip("no Python with pytest and without torch on this machine (system python3 lacks pytest)")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    result = subprocess.run(
        [python, "-m", "pytest", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 4, result.stdout + result.stderr
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].startswith("qnnsuite: torch") and "run harness/run.sh suite" in lines[0]
    assert "not importable from " in lines[0]


def test_the_findings_table_counts_the_manifests_entries_of_each_finding():
    """FINDINGS.md's table says how many manifest entries each finding has: the manifest's own count (a finding
    without entries says why in words, e.g. "none (bridged)")."""
    import harness.checks  # noqa: F401  (registers the checks whose signatures the manifest names)
    from harness import known_failures
    from harness.record import finding_in

    text = (REPO_ROOT / "docs" / "FINDINGS.md").read_text(encoding="utf-8")
    stated = dict(re.findall(r"^\| \[(F[0-9]+)\]\(#F[0-9]+\)[^|]*\|[^|]*\| ([^|]+?) \|", text, re.M))
    counted = Counter(finding_in(entry.reference) for entry in known_failures.load())
    assert stated and {name: int(value) for name, value in stated.items() if value.isdigit()} == dict(counted)
