"""A check is declared once: one decorated function and one suite line make a new check appear in the
run's tests, its report columns and known-failure matching, with no other edit."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the built-in checks)
from harness import check_registry, known_failures
from harness.paths import REPO_ROOT
from harness.tests.child_suite import run_suite

NEW_SUITE = '''
from harness.check_registry import CheckFailure, check, suite_test


@check("delegate_named", short="dlg", signatures=("delegate_unnamed",))
def check_delegate_named(outcome):
    """Made up by the registry test: fails in skip mode, so the manifest's entry for it is exercised."""
    names = [d.name for d in outcome.artifact.facts.partitions.delegates]
    if outcome.case.skip_mutable_buffer:
        raise CheckFailure(f"made-up failure of {outcome.case.id}", {"names": names}, "delegate_unnamed")
    return {"names": names}


test_delegate_named = suite_test("delegate_named")
'''
NEW_MANIFEST = """
[[known_failure]]
pattern = "test_delegate_named[*-skip_mutbuf-*]"
signature = "delegate_unnamed"
reason = "made up by the registry test"
"""


UNVERIFIED_SUITE = '''
from harness.check_registry import InfrastructureError, NotMeasured, check, suite_test


@check("made_up_unverified", short="unv")
def check_made_up_unverified(outcome):
    """Made up by the registry test: not measured when delegated, an infrastructure error otherwise."""
    if outcome.case.skip_mutable_buffer:
        raise InfrastructureError("made-up device trouble on " + outcome.case.id)
    raise NotMeasured("made-up missing measurement on " + outcome.case.id)


test_made_up_unverified = suite_test("made_up_unverified")
'''

FAILING_SUITE = '''
from harness.check_registry import CheckFailure, check, suite_test


@check("made_up_failing", short="fai", signatures=("made_up",))
def check_made_up_failing(outcome):
    """Made up by the registry test: a verdict when delegated, a bug of the harness otherwise."""
    if outcome.case.skip_mutable_buffer:
        raise KeyError("made-up harness bug")
    raise CheckFailure("made-up failure of " + outcome.case.id, {}, "made_up")


test_made_up_failing = suite_test("made_up_failing")
'''
# What pytest formatted for each failure: pytest_exception_interact gets the failed call after its report.
FORMATTED_CONFTEST = """
def pytest_exception_interact(node, call, report):
    with open(__file__.replace("conftest.py", "formatted.txt"), "a") as formatted:
        formatted.write(f"== {node.name}\\n{node.repr_failure(call.excinfo)}\\n")
"""


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One lowering cache for this module's compile-only runs (same card, same dtype)."""
    return tmp_path_factory.mktemp("registry-cache")


def _compile_only(tmp_path: Path, cache: Path, suite_text: str, manifest_text: str = "") -> subprocess.CompletedProcess:
    suite = tmp_path / "suite" / "test_made_up.py"
    suite.parent.mkdir(exist_ok=True)
    suite.write_text(suite_text)
    manifest = tmp_path / "known_failures.toml"
    manifest.write_text(manifest_text)
    return run_suite(
        *("-c", str(REPO_ROOT / "pytest.ini"), "--rootdir", str(REPO_ROOT), "-p", "harness.plugin", "-rs"),
        *("--emulate", "SM8650", "--dtype", "fp16", "-k", "kv_index_copy_dim1", "--known-failures", str(manifest)),
        *("--compile-only", "--report-dir", str(tmp_path / "reports"), "--cache-dir", str(cache)),
        targets=(str(suite),),
        env={**os.environ, "COLUMNS": "300"},
    )


@pytest.mark.child_suite
@pytest.mark.qnn
def test_a_new_check_needs_one_decorated_function_and_one_suite_line(tmp_path: Path, shared_cache: Path):
    completed = _compile_only(tmp_path, shared_cache, NEW_SUITE, NEW_MANIFEST)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert "1 passed" in completed.stdout and "1 xfailed" in completed.stdout, completed.stdout[-2000:]
    folder = tmp_path / "reports" / "latest" / "SM8650"
    document = json.loads((folder / "report.json").read_text())
    assert document["checks"] == [{"name": "delegate_named", "short": "dlg"}]
    verdicts = {case["mode"]: case["checks"]["delegate_named"] for case in document["cases"]}
    assert verdicts["delegate_mutbuf"]["verdict"] == "passed"
    assert verdicts["skip_mutbuf"]["verdict"] == "xfailed"
    assert "made up by the registry test" in verdicts["skip_mutbuf"]["known_failure"]
    html = (folder / "report.html").read_text()
    assert 'title="delegate_named">dlg</th>' in html


@pytest.mark.child_suite
@pytest.mark.qnn
def test_not_measured_and_infrastructure_errors_are_verdicts_of_their_own(tmp_path: Path, shared_cache: Path):
    """NotMeasured is counted apart (pytest shows it with the skips, never as a pass); InfrastructureError
    fails the run, and no known-failure entry can turn it into an expected failure."""
    manifest = """
[[known_failure]]
pattern = "test_made_up_unverified[*]"
signature = "not_run"
reason = "must not explain an infrastructure error"
"""
    completed = _compile_only(tmp_path, shared_cache, UNVERIFIED_SUITE, manifest)
    assert completed.returncode == pytest.ExitCode.TESTS_FAILED, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert "not measured: made-up missing measurement" in completed.stdout, completed.stdout[-3000:]
    assert "infrastructure error: made-up device trouble" in completed.stdout, completed.stdout[-3000:]
    document = json.loads((tmp_path / "reports" / "latest" / "SM8650" / "report.json").read_text())
    verdicts = {case["mode"]: case["checks"]["made_up_unverified"] for case in document["cases"]}
    assert verdicts["delegate_mutbuf"]["verdict"] == "not_measured"
    assert verdicts["delegate_mutbuf"]["message"].startswith("not measured: made-up missing measurement")
    assert verdicts["skip_mutbuf"]["verdict"] == "infra_error" and not verdicts["skip_mutbuf"]["known_failure"]
    assert document["summary"]["not_measured"] == 1 and document["summary"]["infra_error"] == 1
    assert "SM8650: 0 passed, 0 failed, 1 not measured, 1 infrastructure errors" in completed.stdout


@pytest.mark.child_suite
@pytest.mark.qnn
def test_pytest_formats_no_traceback_for_a_verdict_the_suite_words_itself(tmp_path: Path, shared_cache: Path):
    """A CheckFailure reaches pytest without the check's frames, and the frames between are hidden for it:
    formatting them (pytest parses each entry's source file) was thrown away by the report hook. A harness
    bug in a check keeps its whole traceback."""
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "conftest.py").write_text(FORMATTED_CONFTEST)
    completed = _compile_only(tmp_path, shared_cache, FAILING_SUITE)
    assert completed.returncode == pytest.ExitCode.TESTS_FAILED, completed.stdout[-3000:] + completed.stderr[-2000:]
    assert "made-up failure of" in completed.stdout and "[signature: made_up]" in completed.stdout
    formatted = (tmp_path / "suite" / "formatted.txt").read_text().split("== ")
    verdict = next(text for text in formatted if "delegate_mutbuf" in text)
    bug = next(text for text in formatted if "skip_mutbuf" in text)
    assert "All traceback entries are hidden" in verdict and "raise CheckFailure" not in verdict, verdict
    assert 'raise KeyError("made-up harness bug")' in bug and "run_check(spec, case)" in bug, bug
    # The record words a harness bug as pytest's report does: the last line pytest formatted.
    document = json.loads(next((tmp_path / "reports").glob("*/SM8650/report.json")).read_text())
    messages = {case["mode"]: case["checks"]["made_up_failing"]["message"] for case in document["cases"]}
    assert messages["skip_mutbuf"] == bug.strip().splitlines()[-1] and "KeyError" in messages["skip_mutbuf"], messages


def test_two_checks_of_one_name_are_refused():
    def check_export(outcome):  # same name as the built-in, another function
        return {}

    with pytest.raises(ValueError, match="two checks are named 'export'"):
        check_registry.check("export", short="x")(check_export)
    assert check_registry.get("export").function is harness.checks.lowering.check_export


def test_an_unknown_check_name_says_what_is_registered():
    with pytest.raises(ValueError, match=r"no check named 'nope': registered are export, annotation, partitions"):
        check_registry.get("nope")


def test_the_manifest_accepts_only_declared_signatures(tmp_path: Path):
    manifest = tmp_path / "known_failures.toml"
    manifest.write_text(
        textwrap.dedent("""
        [[known_failure]]
        pattern = "test_state[*]"
        signature = "made_up_signature"
        reason = "no check declares it"
        """)
    )
    with pytest.raises(ValueError, match="signature 'made_up_signature' is not one of lowering_failed, not_run, "):
        known_failures.load(manifest)
    assert {"state_mismatch", "uninitialised_delegated_buffer", "split_address"} <= set(check_registry.signatures())


def test_every_builtin_check_has_a_suite_test():
    suites = {path.stem for path in (REPO_ROOT / "suites").glob("test_*.py")}
    declared = {f"test_{spec.name}" for spec in check_registry.specs()}
    found = set()
    for path in (REPO_ROOT / "suites").glob("test_*.py"):
        found |= {name for name in declared if f'suite_test("{name.removeprefix("test_")}")' in path.read_text()}
    assert found == declared, f"checks without a suite line: {sorted(declared - found)} (suites: {sorted(suites)})"
