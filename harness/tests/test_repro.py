"""Reproduction bundles end to end: a real suite run writes them, and each bundle's repro.py, copied alone
into an empty folder and run with this environment's Python where the harness is not importable,
reproduces what the report says (and says so by its exit status).

One suite run (kv_arange_init fp16 in both modes, and ring_buffer fp16 skip mode, whose lowering fails:
docs/FINDINGS.md#F5) and one `python -m harness repro` of the passing case share the module's cache dir.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import adbutils
import jsonschema
import pytest

from harness.device.payload import EMULATED_RUNNER
from harness.emulator.launcher import EmulatorFleet
from harness.paths import REPO_ROOT
from harness.qnn.toolchain import prepare
from harness.record import CheckRecord
from harness.repro import issue, layout
from harness.repro.bundle import BundleWriter
from harness.repro.rerun import RerunError, find_case

pytestmark = pytest.mark.qnn

FAILING = "kv_arange_init-fp16-delegate_mutbuf-SM8650"  # F1: the delegated buffer starts uninitialised
PASSING = "kv_arange_init-fp16-skip_mutbuf-SM8650"
LOWERING = "ring_buffer-fp16-skip_mutbuf-SM8650"  # F5: lowering fails
SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", f"kv_arange_init or {LOWERING}"]
QUIET = ["-p", "no:cacheprovider", "-q", "-W", "ignore"]
BUNDLE_LIMIT_BYTES = 512 * 1024


@dataclass(frozen=True)
class Runs:
    soc_folder: Path  # the suite run's SM8650 report folder
    rerun_folder: Path  # the SM8650 report folder of `python -m harness repro PASSING`
    rerun_output: str


def _report(soc_folder: Path) -> dict[str, dict]:
    return {case["case_id"]: case for case in json.loads((soc_folder / "report.json").read_text())["cases"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("repro")
    cache = ["--cache-dir", str(root / "cache")]
    suite = subprocess.run([sys.executable, "-m", "pytest", "suites", *QUIET, *SELECTION, *cache,
                            "--report-dir", str(root / "reports")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    run = (root / "reports" / "latest").resolve()
    rerun = subprocess.run([sys.executable, "-m", "harness", "repro", PASSING, "--run", str(run), "--", *QUIET, *cache,
                            "--report-dir", str(root / "again")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    return Runs(run / "SM8650", (root / "again" / "latest").resolve() / "SM8650", rerun.stdout)


def _standalone_env() -> dict[str, str]:
    """The host QNN libraries the suite uses (its overlay, with the device-config bridge), and nothing of the
    harness: no PYTHONPATH, so only what the bundle carries can be imported."""
    env = prepare().child_env()
    env.pop("PYTHONPATH", None)
    return env


def _run_alone(bundle: Path, into: Path, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Copy the bundle into an empty folder and run its repro.py there, the harness not importable."""
    shutil.copytree(bundle, into)
    env = {**_standalone_env(), **(extra_env or {})}
    probe = subprocess.run([sys.executable, "-c", "import harness"], cwd=into, env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "the harness is importable from the bundle's folder: the test would prove nothing"
    return subprocess.run([sys.executable, "repro.py", *args], cwd=into, env=env, capture_output=True, text=True, timeout=600)


def test_failing_cases_get_bundles_and_passing_ones_do_not(runs):
    folder = runs.soc_folder / layout.REPRO_DIR
    assert (folder / FAILING / layout.CASE_FILE).is_file() and (folder / LOWERING / layout.CASE_FILE).is_file()
    assert not (folder / PASSING).exists(), "a passing case got a bundle without --repro-all"
    report = _report(runs.soc_folder)
    for name, check in report[FAILING]["checks"].items():
        assert check.get("repro", "") == (f"repro/{FAILING}" if check["verdict"] in ("failed", "xfailed", "xpassed") else ""), name
    schema = json.loads((REPO_ROOT / "harness" / "report" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((runs.soc_folder / "report.json").read_text()))
    case = json.loads((folder / FAILING / layout.CASE_FILE).read_text())
    assert sorted(case["checks"]) == ["initial_state", "state"]  # its xfailed checks, sharing one bundle
    assert case["checks"]["state"]["signature"] == "uninitialised_delegated_buffer"
    assert case["numbers"] == report[FAILING]["checks"]["state"]["evidence"]["steps"]


def test_page_and_summary_link_the_bundles(runs):
    page = (runs.soc_folder / "report.html").read_text()
    for case_id in (FAILING, LOWERING):
        assert f'href="repro/{case_id}/issue.md"' in page and f'href="repro/{case_id}.tar.gz"' in page
    assert f"repro/{PASSING}" not in page
    summary = (runs.soc_folder / "summary.md").read_text()
    assert "## Reproduction bundles (2)" in summary and f"`repro/{FAILING}/`" in summary
    assert "Bundle size: 2 bundle(s)," in summary


def test_bundles_are_small_and_carry_no_libraries(runs):
    for size in layout.sizes(runs.soc_folder):
        bundle = runs.soc_folder / layout.REPRO_DIR / size.folder
        assert size.bytes < BUNDLE_LIMIT_BYTES, (size.folder, size.bytes)
        assert not [p for p in bundle.rglob("*") if p.suffix == ".so" or ".so." in p.name]
        with tarfile.open(runs.soc_folder / layout.REPRO_DIR / (size.folder + layout.ARCHIVE_SUFFIX)) as archive:
            names = set(archive.getnames())
        assert {f"{size.folder}/repro.py", f"{size.folder}/case.json", f"{size.folder}/issue.md"} <= names


def test_failing_bundle_reproduces_alone(runs, tmp_path):
    completed = _run_alone(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "empty")
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    checks = _report(runs.soc_folder)[FAILING]["checks"]
    result = json.loads((tmp_path / "empty" / "repro-out" / "result.json").read_text())
    reported = checks["state"]["evidence"]["steps"]
    # The emulated device's heap holds a fixed pattern and repro.py starts its simulator run the same way
    # (case.json's heap_pattern), so the uninitialised buffer reads the same bytes and the numbers are the
    # report's: the same verdict, signature, first line up to its explanation, and per-step numbers. (The
    # suite also shows that the output equals eager started from the pattern; repro.py, which carries no
    # checks module, gives the loose reason for the same signature.)
    state, _, _ = checks["state"]["message"].partition(";")
    assert f"state: FAILED [uninitialised_delegated_buffer] {state};" in completed.stdout, completed.stdout
    initial_state, _, _ = checks["initial_state"]["message"].partition(";")
    assert f"initial_state: FAILED [uninitialised_delegated_buffer] {initial_state};" in completed.stdout
    assert [(s["mismatches"], f"{s['max_abs_error']:.6g}") for s in result["steps"]] == [
        (s["mismatches"], f"{s['max_abs_error']:.6g}") for s in reported]
    assert f"max abs error {result['steps'][0]['max_abs_error']!r}" in completed.stdout
    assert "verdict: REPRODUCED" in completed.stdout


def test_failing_bundle_reproduces_on_a_device_through_adb(runs, tmp_path):
    """--serial: the program and inputs go over a real adb server to a device whose runner is in --device-dir
    (an emulated device here, its runner put there as a maintainer would put theirs)."""
    toolchain = prepare()
    with EmulatorFleet(["SM8650"], tmp_path / "fleet", device_env={**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}) as fleet:
        serial, adb = fleet.devices[0].serial, adbutils.adb_path()
        adb_env = {**os.environ, **fleet.server.environment}
        for command in (["shell", "mkdir -p /data/local/tmp/qnn"],
                        ["push", str(EMULATED_RUNNER), "/data/local/tmp/qnn/qnn_executor_runner"],
                        ["shell", "chmod 755 /data/local/tmp/qnn/qnn_executor_runner"]):
            assert subprocess.run([adb, "-s", serial, *command], env=adb_env, capture_output=True, timeout=60).returncode == 0
        completed = _run_alone(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "empty", "--serial", serial,
                               "--adb", adb, extra_env=fleet.server.environment)
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"on phone {serial}" in completed.stdout and "state: FAILED [uninitialised_delegated_buffer]" in completed.stdout


def test_passing_bundle_from_a_rerun_does_not_reproduce(runs, tmp_path):
    assert "--repro-all" in runs.rerun_output and f"-k {PASSING}" in runs.rerun_output
    bundle = runs.rerun_folder / layout.REPRO_DIR / PASSING
    case = json.loads((bundle / layout.CASE_FILE).read_text())
    assert {check["verdict"] for check in case["checks"].values()} <= {"passed", "skipped"}
    completed = _run_alone(bundle, tmp_path / "empty")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "verdict: NOT REPRODUCED (every check passes)" in completed.stdout


def test_lowering_failure_bundle_reproduces_its_first_line(runs, tmp_path):
    message = _report(runs.soc_folder)[LOWERING]["checks"]["partitions"]["message"]
    assert message.startswith("lowering failed: RuntimeError: ")
    completed = _run_alone(runs.soc_folder / layout.REPRO_DIR / LOWERING, tmp_path / "empty")
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"lowering: {message}" in completed.stdout.splitlines()
    issue_text = (runs.soc_folder / layout.REPRO_DIR / LOWERING / "issue.md").read_text()
    assert "docs/FINDINGS.md#F5" in issue_text and "decompose_remainder.py" in issue_text


def test_repro_without_qnn_libraries_says_how_in_one_line(runs, tmp_path):
    shutil.copytree(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "bundle")
    env = {key: value for key, value in os.environ.items() if key not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "PYTHONPATH")}
    completed = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "bundle", env=env, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [completed.stderr.strip()]
    assert "--qnn-sdk DIR" in completed.stderr and "Traceback" not in completed.stderr
    bad = subprocess.run([sys.executable, "repro.py", "--qnn-sdk", str(tmp_path)], cwd=tmp_path / "bundle", env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no lib/x86_64-linux-clang/libQnnHtp.so there" in bad.stderr


# --- without a suite run ------------------------------------------------------------------------------
@pytest.mark.parametrize("case_id", ["../../etc", "a/b", "x" * 300, "", "café-fp16"])
def test_hostile_case_ids_get_a_folder_inside_repro(case_id):
    name = layout.folder_name(case_id)
    assert layout.PLAIN_NAME.match(name) and "/" not in name and ".." not in name
    assert layout.LINK.match(layout.link(case_id))


def test_plain_case_ids_keep_their_name():
    assert layout.folder_name(FAILING) == FAILING


@pytest.mark.parametrize("link", ["javascript:alert(1)", "repro/../../x", "http://x/y", "repro/a b"])
def test_the_page_links_only_bundle_paths(link):
    assert not layout.LINK.match(link)


def test_issue_code_spans_and_fences_hold_backticks():
    hostile = "```\n# injected heading\n``"
    span = issue.code(hostile)
    assert "\n" not in span and span.startswith("````") and span.endswith("````")
    fence = issue.fenced(hostile)
    assert fence.startswith("````\n") and fence.rstrip().endswith("\n````")


def test_rerun_names_what_is_wrong(tmp_path):
    with pytest.raises(RerunError, match="not a case id"):
        find_case(tmp_path, "a;rm -rf /")
    with pytest.raises(RerunError, match="no report.json"):
        find_case(tmp_path, FAILING)


def _record(verdict: str) -> CheckRecord:
    return CheckRecord(nodeid="suites/test_state.py::test_state[x]", check="state", case_id=FAILING, card="kv_arange_init",
                       tags=(), dtype="fp16", mode="delegate_mutbuf", soc="SM8650", verdict=verdict)


def test_a_bundle_that_cannot_be_written_costs_one_line_not_the_run(tmp_path, capsys):
    (tmp_path / "SM8650").write_text("a file where the SoC's report folder should be")
    writer = BundleWriter(tmp_path, toolchain=None, write_passes=False)
    record = _record("failed")
    assert writer.add(record, outcome=None, signature="state_mismatch", known=None) == record  # no repro link
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"qnnsuite: no reproduction bundle for {FAILING} (")


def test_a_case_is_archived_once_after_its_checks_not_once_per_check(tmp_path, monkeypatch):
    from dataclasses import replace

    from harness.repro import bundle

    archived = []
    monkeypatch.setattr(bundle, "_archive", lambda folder: archived.append(folder.name))
    monkeypatch.setattr(issue, "render", lambda case: "")
    other = FAILING.replace("SM8650", "SM8650x")
    for case_id in (FAILING, other):  # bundles whose case files are written already
        folder = tmp_path / "SM8650" / layout.link(case_id)
        folder.mkdir(parents=True)
        (folder / layout.CASE_FILE).write_text(json.dumps({"checks": {}}))
    writer = BundleWriter(tmp_path, toolchain=None, write_passes=False)
    for record in (_record("xfailed"), replace(_record("xfailed"), check="initial_state")):
        assert writer.add(record, None, "uninitialised_delegated_buffer", None).repro
    assert archived == [], "archived before its case's checks were all added"
    writer.add(replace(_record("failed"), case_id=other), None, "state_mismatch", None)
    assert archived == [layout.folder_name(FAILING)]
    writer.archive()  # the session's end
    assert archived == [layout.folder_name(FAILING), layout.folder_name(other)]
    writer.archive()
    assert len(archived) == 2, "archived twice"


def test_passes_are_not_bundled_without_repro_all(tmp_path, capsys):
    record = _record("passed")
    assert BundleWriter(tmp_path, toolchain=None, write_passes=False).add(record, None, "", None) is record
    assert not list(tmp_path.iterdir()) and not capsys.readouterr().err


def test_the_bundled_suite_modules_import_only_each_other():
    """A bundle carries copies of SUITE_MODULES; one that imports another harness module breaks every repro.py."""
    import ast

    from harness.paths import REPO_ROOT
    from harness.repro import standalone

    carried = {*standalone.SUITE_MODULES, standalone.SHIM}
    for index, name in enumerate(standalone.SUITE_MODULES):
        tree = ast.parse((REPO_ROOT / (name.replace(".", "/") + ".py")).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        for node in ast.walk(tree):  # `from harness.pipeline import eager` imports the module harness.pipeline.eager
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in carried else node.module
                             for alias in node.names}
        needed = {module for module in imported if module.startswith("harness.") or module == "harness"}
        assert needed <= carried, f"{name} imports {sorted(needed - carried)}, which a bundle does not carry"
        later = needed & set(standalone.SUITE_MODULES[index + 1:])
        assert not later, f"{name} imports {sorted(later)}, loaded after it"
