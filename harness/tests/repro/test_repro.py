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

from harness import check_registry
from harness.device.payload import EMULATED_RUNNER
from harness.emulator.launcher import EmulatorFleet
from harness.paths import REPO_ROOT
from harness.qnn.toolchain import prepare
from harness.record import CheckRecord
from harness.report.intake import read_report
from harness.repro import issue, layout
from harness.repro.bundle import BundleWriter
from harness.repro.rerun import RerunError, find_case
from harness.tests.child_suite import run_suite

pytestmark = pytest.mark.qnn

FAILING = "kv_arange_init-fp16-delegate_mutbuf-SM8650"  # F1: the delegated buffer starts uninitialised
PASSING = "kv_arange_init-fp16-skip_mutbuf-SM8650"
LOWERING = "ring_buffer-fp16-skip_mutbuf-SM8650"  # F5: lowering fails
SELECTION = ["--emulate", "SM8650", "--dtype", "fp16", "-k", f"kv_arange_init or {LOWERING}"]
QUIET = ["-W", "ignore"]
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
    suite = run_suite(*QUIET, *SELECTION, *cache, "--report-dir", str(root / "reports"))
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    run = (root / "reports" / "latest").resolve()
    rerun = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "repro",
            PASSING,
            "--run",
            str(run),
            "--",
            *("-p", "no:cacheprovider", "-q", *QUIET),
            *cache,
            "--report-dir",
            str(root / "again"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    return Runs(run / "SM8650", (root / "again" / "latest").resolve() / "SM8650", rerun.stdout)


def _standalone_env() -> dict[str, str]:
    """The host QNN libraries the suite uses (its overlay, with the device-config bridge), and nothing of the
    harness: no PYTHONPATH, so only what the bundle carries can be imported."""
    env = prepare().child_env()
    env.pop("PYTHONPATH", None)
    return env


def _run_alone(
    bundle: Path, into: Path, *args: str, extra_env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """Copy the bundle into an empty folder and run its repro.py there, the harness not importable."""
    shutil.copytree(bundle, into)
    env = {name: value for name, value in {**_standalone_env(), **(extra_env or {})}.items() if name not in drop}
    probe = subprocess.run([sys.executable, "-c", "import harness"], cwd=into, env=env, capture_output=True, text=True)
    assert probe.returncode != 0, "the harness is importable from the bundle's folder: the test would prove nothing"
    return subprocess.run(
        [sys.executable, "repro.py", *args], cwd=into, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.child_suite
def test_failing_cases_get_bundles_and_passing_ones_do_not(runs):
    folder = runs.soc_folder / layout.REPRO_DIR
    assert (folder / FAILING / layout.CASE_FILE).is_file() and (folder / LOWERING / layout.CASE_FILE).is_file()
    assert not (folder / PASSING).exists(), "a passing case got a bundle without --repro-all"
    report = _report(runs.soc_folder)
    for name, check in report[FAILING]["checks"].items():
        assert check.get("repro", "") == (
            f"repro/{FAILING}" if check["verdict"] in ("failed", "xfailed", "xpassed") else ""
        ), name
    schema = json.loads((REPO_ROOT / "harness" / "report" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads((runs.soc_folder / "report.json").read_text()))
    case = json.loads((folder / FAILING / layout.CASE_FILE).read_text())
    bundled = sorted(
        name for name, check in case["checks"].items() if check["verdict"] in ("failed", "xfailed", "xpassed")
    )
    assert bundled == ["initial_state", "state"]  # its xfailed checks, sharing one bundle
    # every check the run judged is recorded (repro.py judges them all), the others without evidence
    assert {name: check["verdict"] for name, check in case["checks"].items()} == {
        name: check["verdict"] for name, check in report[FAILING]["checks"].items()
    }
    assert all(not check["evidence"] for name, check in case["checks"].items() if name not in bundled)
    assert case["checks"]["state"]["signature"] == "uninitialised_delegated_buffer"
    assert case["numbers"] == report[FAILING]["checks"]["state"]["evidence"]["steps"]


@pytest.mark.child_suite
def test_page_and_summary_link_the_bundles(runs):
    page = (runs.soc_folder / "report.html").read_text()
    for case_id in (FAILING, LOWERING):
        assert f'href="repro/{case_id}/issue.md"' in page and f'href="repro/{case_id}.tar.gz"' in page
    assert f"repro/{PASSING}" not in page
    summary = (runs.soc_folder / "summary.md").read_text()
    assert "## Reproduction bundles (2)" in summary and "In [repro/](repro/)" in summary  # a count and a link
    assert "Bundle size: 2 bundle(s)," in summary


@pytest.mark.child_suite
def test_bundles_are_small_and_carry_no_libraries(runs):
    for size in layout.sizes(runs.soc_folder):
        bundle = runs.soc_folder / layout.REPRO_DIR / size.folder
        assert size.bytes < BUNDLE_LIMIT_BYTES, (size.folder, size.bytes)
        assert not [p for p in bundle.rglob("*") if p.suffix == ".so" or ".so." in p.name]
        with tarfile.open(runs.soc_folder / layout.REPRO_DIR / (size.folder + layout.ARCHIVE_SUFFIX)) as archive:
            names = set(archive.getnames())
        assert {f"{size.folder}/repro.py", f"{size.folder}/case.json", f"{size.folder}/issue.md"} <= names


@pytest.mark.child_suite
def test_failing_bundle_reproduces_alone(runs, tmp_path):
    completed = _run_alone(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "empty")
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    checks = _report(runs.soc_folder)[FAILING]["checks"]
    result = json.loads((tmp_path / "empty" / "repro-out" / "result.json").read_text())
    reported = checks["state"]["evidence"]["steps"]
    # The emulated device's heap holds a fixed pattern and repro.py starts its simulator run the same way
    # (case.json's heap_pattern), so the uninitialised buffer reads the same bytes; repro.py judges with the
    # suite's own checks (suite/harness.checks.*.py), so the verdict, signature, whole line (the exact one: the
    # device equals eager started from the pattern) and per-step numbers are the report's.
    for name in ("state", "initial_state"):
        assert (
            f"{name}: FAILED [uninitialised_delegated_buffer] {checks[name]['message']}  (as recorded)"
            in completed.stdout
        )
    for name in ("export", "partitions", "address_sharing"):
        assert f"{name}: PASSED  (as recorded)" in completed.stdout
    assert [(s["mismatches"], f"{s['max_abs_error']:.6g}") for s in result["steps"]] == [
        (s["mismatches"], f"{s['max_abs_error']:.6g}") for s in reported
    ]
    assert f"max abs error {result['steps'][0]['max_abs_error']!r}" in completed.stdout
    assert "verdict: REPRODUCED (initial_state, state fail as recorded)" in completed.stdout.splitlines()
    assert result["verdict"] == "REPRODUCED"
    # The run's runner ran it: the suite's compiled runner, built from the bundle's source into the bundle's own
    # folder (no harness importable here), its per-step lines in the runner's log.
    assert json.loads((runs.soc_folder / layout.REPRO_DIR / FAILING / "case.json").read_text())["runner"]["name"] == (
        "suite_runner"
    )
    assert list((tmp_path / "empty" / ".qnn" / "runner").glob("*/suite_runner")), "built in the bundle's folder"
    assert "step 0 method forward execute_us " in (tmp_path / "empty" / "repro-out" / "runner.log").read_text()
    assert "pybindings" not in completed.stderr


@pytest.mark.child_suite
def test_without_a_compiler_the_bundle_runs_the_pybindings_runner_and_says_so(runs, tmp_path):
    completed = _run_alone(
        runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "empty", extra_env={"CXX": str(tmp_path / "no-g++")}
    )
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    said = [line for line in completed.stderr.splitlines() if "pybindings" in line]
    assert said == [
        f"repro.py: the steps run with the pybindings runner: the suite's runner cannot be built: cannot run the "
        f"C++ compiler {tmp_path / 'no-g++'} ([Errno 2] No such file or directory: '{tmp_path / 'no-g++'}'): check that it is "
        f"an executable C++ compiler, or install g++ (`apt-get install g++`)"
    ], completed.stderr[-2000:]
    assert "verdict: REPRODUCED (initial_state, state fail as recorded)" in completed.stdout.splitlines()
    assert "execute_us" not in (tmp_path / "empty" / "repro-out" / "runner.log").read_text()


@pytest.mark.child_suite
def test_failing_bundle_without_the_bridge_is_a_different_failure(runs, tmp_path):
    """The bridge variable unset: executorch 1.5.1 and this QNN fail to lower (unknown custom config). That
    is not the recorded failure: exit 3 and a DIFFERENT FAILURE line naming both, never REPRODUCED."""
    assert _standalone_env().get("QNNSUITE_BRIDGE_DEVICE_CONFIG") == "1", (
        "this toolchain needs no bridge: nothing to show"
    )
    completed = _run_alone(
        runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "empty", drop=("QNNSUITE_BRIDGE_DEVICE_CONFIG",)
    )
    assert completed.returncode == 3, completed.stdout[-3000:] + completed.stderr[-3000:]
    verdict = completed.stdout.strip().splitlines()[-1]
    recorded = _report(runs.soc_folder)[FAILING]["checks"]["initial_state"]["message"]
    assert verdict.startswith("verdict: DIFFERENT FAILURE: initial_state lowering_failed: lowering failed: ")
    assert verdict.endswith(f"; recorded uninitialised_delegated_buffer: {recorded}")
    assert "unknown custom config" in (tmp_path / "empty" / "repro-out" / "lowering" / "lower.log").read_text()
    assert "REPRODUCED" not in verdict.replace("NOT REPRODUCED", "")


def _python_without_torch() -> list[str]:
    """The system Python in isolated mode (`python3 -I`), else this one without its site-packages."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    for candidate in (shutil.which("python3", path=path), sys.executable):
        command = [candidate, "-I"] if candidate != sys.executable else [candidate, "-I", "-S"]
        if candidate and subprocess.run([*command, "-c", "import torch"], capture_output=True).returncode != 0:
            return command
    pytest.skip("no Python without torch here")


@pytest.mark.child_suite
def test_repro_with_a_python_lacking_torch_is_one_line_and_exit_2(runs, tmp_path):
    shutil.copytree(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "bundle")
    completed = subprocess.run(
        [*_python_without_torch(), "repro.py"],
        cwd=tmp_path / "bundle",
        env=_standalone_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert completed.stderr.strip().splitlines() == [completed.stderr.strip()] and "Traceback" not in completed.stderr
    assert "has no module 'torch'" in completed.stderr and not completed.stdout


@pytest.mark.device
@pytest.mark.child_suite
def test_failing_bundle_reproduces_on_a_device_through_adb(runs, tmp_path):
    """--serial: the program and inputs go over a real adb server to a device whose runner is in --device-dir
    (an emulated device here, its runner put there as a maintainer would put theirs)."""
    toolchain = prepare()
    with EmulatorFleet(
        ["SM8650"], tmp_path / "fleet", device_env={**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}
    ) as fleet:
        serial, adb = fleet.devices[0].serial, adbutils.adb_path()
        adb_env = {**os.environ, **fleet.server.environment}
        for command in (
            ["shell", "mkdir -p /data/local/tmp/qnn"],
            ["push", str(EMULATED_RUNNER), "/data/local/tmp/qnn/qnn_executor_runner"],
            ["shell", "chmod 755 /data/local/tmp/qnn/qnn_executor_runner"],
        ):
            assert (
                subprocess.run([adb, "-s", serial, *command], env=adb_env, capture_output=True, timeout=60).returncode
                == 0
            )
        completed = _run_alone(
            runs.soc_folder / layout.REPRO_DIR / FAILING,
            tmp_path / "empty",
            "--serial",
            serial,
            "--adb",
            adb,
            extra_env=fleet.server.environment,
        )
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert (
        f"on phone {serial}" in completed.stdout
        and "state: FAILED [uninitialised_delegated_buffer]" in completed.stdout
    )


@pytest.mark.child_suite
def test_passing_bundle_from_a_rerun_does_not_reproduce(runs, tmp_path):
    assert "--repro-all" in runs.rerun_output and f"-k {PASSING}" in runs.rerun_output
    bundle = runs.rerun_folder / layout.REPRO_DIR / PASSING
    case = json.loads((bundle / layout.CASE_FILE).read_text())
    assert {check["verdict"] for check in case["checks"].values()} <= {"passed", "skipped"}
    completed = _run_alone(bundle, tmp_path / "empty")
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "verdict: NOT REPRODUCED (every check passes)" in completed.stdout


@pytest.mark.child_suite
def test_lowering_failure_bundle_reproduces_its_first_line(runs, tmp_path):
    message = _report(runs.soc_folder)[LOWERING]["checks"]["partitions"]["message"]
    assert message.startswith("lowering failed: RuntimeError: ")
    completed = _run_alone(runs.soc_folder / layout.REPRO_DIR / LOWERING, tmp_path / "empty")
    assert completed.returncode == 1, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert f"lowering: {message}" in completed.stdout.splitlines()
    issue_text = (runs.soc_folder / layout.REPRO_DIR / LOWERING / "issue.md").read_text()
    assert "docs/FINDINGS.md#F5" in issue_text and "decompose_remainder.py" in issue_text


@pytest.mark.child_suite
def test_repro_without_qnn_libraries_says_how_in_one_line(runs, tmp_path):
    shutil.copytree(runs.soc_folder / layout.REPRO_DIR / FAILING, tmp_path / "bundle")
    env = {
        key: value for key, value in os.environ.items() if key not in ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "PYTHONPATH")
    }
    completed = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path / "bundle", env=env, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [completed.stderr.strip()]
    assert "--qnn-sdk DIR" in completed.stderr and "Traceback" not in completed.stderr
    bad = subprocess.run(
        [sys.executable, "repro.py", "--qnn-sdk", str(tmp_path)],
        cwd=tmp_path / "bundle",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
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


def test_issue_escapes_markdown_from_a_failure_message():
    """A failure message is run output: in the title and the wording it is text, not HTML, links or mentions;
    plain words and snake_case stay as they read. (Broken input caught here; a plain one left alone.)"""
    hostile = "<img src=x onerror=alert(1)> [click](http://evil.example) @team `tick` *em* # heading"
    escaped = issue.markdown_text(hostile)
    for raw in ("[click](", "@team", "http://", "*em*", "`tick`"):
        assert raw not in escaped, raw
    assert escaped.count("<img") == escaped.count("\\<img") == 1  # a backslash-escaped < renders as itself
    assert "\\<img" in escaped and "\\[click\\]" in escaped
    assert issue.markdown_text("kv_arange_init state differs") == "kv_arange_init state differs"
    assert issue.markdown_text("# heading").startswith("\\#")
    case = {
        "case_id": FAILING,
        "dtype": "fp16",
        "mode": "delegate_mutbuf",
        "soc": "SM8650",
        "steps": 4,
        "skip_mutable_buffer": False,
        "numbers": [],
        "pte": {"file": "", "note": ""},
        "card": {
            "name": "kv_arange_init",
            "file": "card/zoo.py",
            "mutated_buffers": ["cache"],
            "build_source": "",
            "steps_source": "",
        },
        "environment": {
            "executorch": "1.5.1",
            "torch": "2",
            "torchao": "0",
            "python": "3.11",
            "qnn_build_id": "v2",
            "qnn_sdk": "wheel",
            "device_config_bridge": True,
            "device_serial": "",
            "device_kind": "emulated",
            "exports": ["export QNN_SDK_ROOT=/x"],
        },
        "lowering": {"error": "", "traceback": ""},
        "checks": {
            "state": {
                "verdict": "failed",
                "signature": "state_mismatch",
                "message": hostile,
                "known_failure": "",
                "finding": "",
                "upstream": "",
            }
        },
    }
    text = issue.render(case)
    title = text.splitlines()[0]
    assert title.startswith("# [QNN] \\<img") and "[click](" not in title and "@team" not in title
    assert f"Actual: {issue.code(hostile)}" in text  # the wording itself, whole, in a code span
    assert "export QNN_SDK_ROOT=/x" in text


def test_rerun_names_what_is_wrong(tmp_path):
    with pytest.raises(RerunError, match="not a case id"):
        find_case(tmp_path, "a;rm -rf /", read_report)
    with pytest.raises(RerunError, match="no report.json"):
        find_case(tmp_path, FAILING, read_report)


def _record(verdict: str) -> CheckRecord:
    return CheckRecord(
        nodeid="suites/test_state.py::test_state[x]",
        check="state",
        case_id=FAILING,
        card="kv_arange_init",
        tags=(),
        dtype="fp16",
        mode="delegate_mutbuf",
        soc="SM8650",
        verdict=verdict,
    )


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
    """A bundle carries copies of SUITE_MODULES (repro.py imports them by name from suite/); one that imports
    another harness module, at its top or inside a function, breaks every repro.py. The checks among them are
    the suite's own, so they must not reach for the device or lowering layers."""
    import ast

    from harness.paths import REPO_ROOT
    from harness.repro import standalone

    carried = {*standalone.SUITE_MODULES, standalone.SHIM}
    for name in standalone.SUITE_MODULES:
        tree = ast.parse((REPO_ROOT / (name.replace(".", "/") + ".py")).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        for node in ast.walk(tree):  # `from harness.pipeline import eager` imports the module harness.pipeline.eager
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in carried else node.module
                    for alias in node.names
                }
        needed = {module for module in imported if module.startswith("harness.") or module == "harness"}
        assert needed <= carried, f"{name} imports {sorted(needed - carried)}, which a bundle does not carry"
    import harness.checks  # noqa: F401  (registers the built-in checks)

    for spec in check_registry.specs():
        if spec.function.__module__.startswith("harness."):
            assert spec.function.__module__ in carried, (
                f"built-in check {spec.name} is declared outside the carried modules"
            )


# --- a check added with @check is judged in the bundle too ------------------------------------------------
MADE_UP_SUITE = '''
from harness.check_registry import CheckFailure, check, suite_test


@check("made_up_state", short="mus", needs_device=True, signatures=("made_up_mismatch",))
def check_made_up_state(outcome):
    """Made up by the repro test: the device's outputs equal eager's (F1 breaks it when the buffer is delegated)."""
    if outcome.run is None:
        raise CheckFailure(outcome.run_error or "not run", {}, "not_run")
    if outcome.comparison.mismatched:
        raise CheckFailure(f"made-up check: {outcome.case.id} differs from eager", {}, "made_up_mismatch")
    return {}


test_made_up_state = suite_test("made_up_state")
'''
# What repro.py needs beside it: its case, the card's source and the suite's modules (suite/, with the manifest).
REPRO_NEEDS = ("repro.py", layout.CASE_FILE, "card", "suite")


@pytest.mark.child_suite
def test_a_new_check_is_judged_by_the_bundle_alone(tmp_path):
    """One decorated function and one suite line: the run fails the new check, its bundle carries the module
    that declared it, and repro.py (with only case.json, card/ and suite/ beside it) judges it by that code
    and reproduces its failure."""
    suite = tmp_path / "suite" / "test_made_up.py"
    suite.parent.mkdir()
    suite.write_text(MADE_UP_SUITE)
    completed = run_suite(
        *("-c", str(REPO_ROOT / "pytest.ini"), "--rootdir", str(REPO_ROOT), "-p", "harness.plugin", *QUIET),
        *("--emulate", "SM8650", "--dtype", "fp16", "-k", FAILING),
        *("--report-dir", str(tmp_path / "reports"), "--cache-dir", str(tmp_path / "cache")),
        targets=[str(suite)],
    )
    assert completed.returncode == 1 and "1 failed" in completed.stdout, (
        completed.stdout[-3000:] + completed.stderr[-2000:]
    )
    bundle = (tmp_path / "reports" / "latest").resolve() / "SM8650" / layout.REPRO_DIR / FAILING
    case = json.loads((bundle / layout.CASE_FILE).read_text())
    assert {name: check["signature"] for name, check in case["checks"].items()} == {"made_up_state": "made_up_mismatch"}
    manifest = json.loads((bundle / "suite" / "manifest.json").read_text())
    assert manifest["checks"]["made_up_state"] == "test_made_up"
    assert (bundle / manifest["modules"]["test_made_up"]["file"]).read_text() == MADE_UP_SUITE
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in REPRO_NEEDS:
        (shutil.copytree if (bundle / name).is_dir() else shutil.copyfile)(bundle / name, alone / name)
    repro = subprocess.run(
        [sys.executable, "repro.py"], cwd=alone, env=_standalone_env(), capture_output=True, text=True, timeout=600
    )
    assert repro.returncode == 1, repro.stdout[-3000:] + repro.stderr[-3000:]
    assert (
        f"made_up_state: FAILED [made_up_mismatch] made-up check: {FAILING} differs from eager  (as recorded)"
        in repro.stdout.splitlines()
    )
    assert repro.stdout.strip().splitlines()[-1] == "verdict: REPRODUCED (made_up_state fail as recorded)"


def test_repro_verdicts_follow_the_contract():
    """verdict_of alone: every recorded failure with its signature and nothing else is REPRODUCED; no failure is
    NOT REPRODUCED; another signature, a new failure or a recorded failure that passes now is DIFFERENT."""
    from harness.repro.standalone import EXIT, Judgement, verdict_of

    recorded = {
        "state": {"verdict": "xfailed", "signature": "uninitialised_delegated_buffer", "message": "state differs"},
        "export": {"verdict": "passed", "signature": "", "message": ""},
        "initial_state": {"verdict": "failed", "signature": "initial_value_ignored", "message": "init differs"},
    }
    same = {
        "state": Judgement("failed", "uninitialised_delegated_buffer", "x"),
        "export": Judgement("passed"),
        "initial_state": Judgement("failed", "initial_value_ignored", "y"),
    }
    assert verdict_of(recorded, same)[0] == "REPRODUCED" and EXIT["REPRODUCED"] == 1
    assert verdict_of(recorded, {name: Judgement("passed") for name in same})[0] == "NOT REPRODUCED"
    other = {**same, "state": Judgement("failed", "lowering_failed", "lowering failed: RuntimeError: 14001")}
    assert verdict_of(recorded, other) == (
        "DIFFERENT FAILURE",
        "state lowering_failed: lowering failed: RuntimeError: "
        "14001; recorded uninitialised_delegated_buffer: state differs",
    )
    new = {**same, "export": Judgement("failed", "buffers_to_mutate_mismatch", "z")}
    assert verdict_of(recorded, new)[1].startswith("export buffers_to_mutate_mismatch: z; recorded passed")
    partial = {**same, "initial_state": Judgement("passed")}
    assert verdict_of(recorded, partial) == (
        "DIFFERENT FAILURE",
        "initial_state passed now; recorded initial_value_ignored: init differs",
    )
    crash = {**same, "state": Judgement("error", "ValueError", "ValueError: step 0 output 0: device wrote 4 bytes")}
    assert verdict_of(recorded, crash)[0] == "DIFFERENT FAILURE" and EXIT["DIFFERENT FAILURE"] == 3
    # A check this run could not feed (runner_parity without a second runner) is "not measured", never "pass now"
    parity = {"runner_parity": {"verdict": "failed", "signature": "runner_outputs_differ", "message": "m"}}
    unfed = {"runner_parity": Judgement("not_measured", "", "no qnn_executor_runner run of this case")}
    assert verdict_of(parity, unfed) == ("NOT REPRODUCED", "(runner_parity not measured)")
    assert verdict_of(parity, {"runner_parity": Judgement("passed")}) == ("NOT REPRODUCED", "(runner_parity pass now)")
    assert verdict_of({"runner_parity": {"verdict": "passed"}}, unfed) == (
        "NOT REPRODUCED",
        "(runner_parity not measured)",
    )
    assert verdict_of({**recorded, **parity}, {**same, **unfed})[1].startswith("runner_parity not measured; recorded")


def test_repro_reads_a_checks_ending_as_the_suite_decides_it():
    """One mapping of a check's exception to a verdict (check_registry.raised_verdict): repro.py's judge and
    the suite's decide (no manifest entry) agree on every ending; a check that breaks (no assertion) is the
    suite's failed, which repro.py tells apart as `error`."""
    from harness.check_registry import CheckFailure, CheckSpec, InfrastructureError, NotApplicable, NotMeasured
    from harness.repro.standalone import judge
    from harness.verdicts import decide

    endings = [
        None,
        NotApplicable("n/a"),
        NotMeasured("no trace"),
        InfrastructureError("device lost"),
        CheckFailure("differs", {}, "state_mismatch"),
        AssertionError("plain"),
        ValueError("broke"),
    ]
    seen = []
    for ending in endings:

        def function(outcome, ending=ending):
            if ending is not None:
                raise ending
            return {}

        judged = judge(CheckSpec("made_up", function, "mu", False, ()), None)
        suite = decide(ending, [], "node")[0].value
        assert (judged.verdict if judged.verdict != "error" else "failed") == suite, (ending, judged, suite)
        seen.append(judged.verdict)
    assert seen == ["passed", "skipped", "not_measured", "infra_error", "failed", "failed", "error"]


# --- `repro --run` takes nothing from the run folder into argv or imports ----------------------------------
def _crafted_run(tmp_path: Path, **case: str) -> Path:
    fields = {"card": "kv_arange_init", "dtype": "fp16", "mode": "delegate_mutbuf", "soc": "SM8650", **case}
    fields["case_id"] = case.get("case_id") or "-".join(fields[name] for name in ("card", "dtype", "mode", "soc"))
    soc = tmp_path / "run" / "SM8650"
    soc.mkdir(parents=True)
    entry = {**fields, "tags": [], "device_serial": None, "delegates": None, "timings_s": {}, "checks": {}}
    summary = dict.fromkeys(("passed", "failed", "xpassed", "xfailed", "skipped", "total"), 0)
    document = {"schema_version": 1, "run_id": "r", "soc": "SM8650", "environment": {}, "summary": summary}
    (soc / "report.json").write_text(json.dumps({**document, "cases": [entry]}))
    return tmp_path / "run"


def _rerun(run: Path, case_id: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "repro", case_id, "--run", str(run), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_rerun_refuses_a_crafted_soc_in_one_line(tmp_path):
    """report.json's soc `-pX` would have reached pytest's argv (`--soc -pX`... `--emulate -pX`) and loaded X."""
    for soc, dtype in (("-pX", "fp16"), ("SM8650", "-pX"), ("SM9999", "fp16")):
        run = _crafted_run(tmp_path / f"{soc}{dtype}", soc=soc, dtype=dtype)
        case_id = f"kv_arange_init-{dtype}-delegate_mutbuf-{soc}"
        completed = _rerun(run, case_id)
        assert completed.returncode == (4 if dtype == "-pX" else 2), completed.stdout + completed.stderr
        assert (
            completed.stderr.strip().splitlines() == [completed.stderr.strip()] and "Traceback" not in completed.stderr
        )
        refused = "crafted report" in completed.stderr or "is not a valid report.json" in completed.stderr
        assert refused and "repro: " not in completed.stdout  # no pytest command was run
    mismatched = _crafted_run(tmp_path / "mismatch", case_id="kv_arange_init-fp16-delegate_mutbuf-SM8750")
    completed = _rerun(mismatched, "kv_arange_init-fp16-delegate_mutbuf-SM8750")
    assert completed.returncode == 2 and "is not its card, dtype, mode and SoC joined" in completed.stderr


def test_rerun_never_imports_a_card_module_the_run_folder_names(tmp_path):
    """A bundle's case.json naming a module under reports/ (importable from the repository root) ran it; now
    card modules come from --models or the defaults, and an unknown card is one line naming --models."""
    run = _crafted_run(tmp_path, card="evil_card")
    case_id = "evil_card-fp16-delegate_mutbuf-SM8650"
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "evil_cards.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    bundle = run / "SM8650" / layout.link(case_id)
    bundle.mkdir(parents=True)
    (bundle / layout.CASE_FILE).write_text(json.dumps({"card": {"module": "evil_cards"}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(planted), str(REPO_ROOT)])}
    completed = _rerun(run, case_id, env=env)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "pass its module with --models MODULE" in completed.stderr and not marker.exists()
    bad = _rerun(run, case_id, "--models=-pX", env=env)
    assert bad.returncode == 2 and "is not a module name" in bad.stderr and not marker.exists()


# --- doctor: the overlay and the lines a bundle's repro.py needs ---------------------------------------------
def test_doctor_names_the_current_overlay_and_the_export_lines(tmp_path, capsys):
    """The lines are the toolchain's own child environment (one body, also in issue.md): with them a copied
    bundle reproduces (test_failing_bundle_reproduces_alone runs with that environment), without the bridge
    variable it is a different failure (test above). Overlay folders of another SDK are named as not current."""
    import dataclasses
    import shlex

    from harness.__main__ import _overlays
    from harness.qnn.sdk import OVERLAY_MARKER
    from harness.repro import exports

    toolchain = prepare()
    current, stale = tmp_path / "overlay" / "0123456789abcdef", tmp_path / "overlay" / "fedcba9876543210"
    for folder, sdk in ((current, toolchain.sdk.root), (stale, "/old/sdk")):
        (folder / "lib" / "x86_64-linux-clang").mkdir(parents=True)
        (folder / OVERLAY_MARKER).write_text(str(sdk))
    _overlays(dataclasses.replace(toolchain, overlay_root=current))
    printed = capsys.readouterr().out
    assert f"overlay     {current} (current: SDK {toolchain.sdk.root}" in printed
    assert (
        "fedcba9876543210: not current (overlay of '/old/sdk')" in printed
        and "0123456789abcdef: not current" not in printed
    )
    env = toolchain.child_env(base={})
    lines = exports.lines(toolchain)
    assert (
        lines[0]
        == f"export QNN_SDK_ROOT={shlex.quote(str(toolchain.overlay_root))}"
        == f"export QNN_SDK_ROOT={env['QNN_SDK_ROOT']}"
    )
    assert lines[2] == f"export QNNSUITE_BRIDGE_DEVICE_CONFIG={env['QNNSUITE_BRIDGE_DEVICE_CONFIG']}"
    shell = subprocess.run(
        ["sh", "-c", "; ".join([*lines, 'printf "%s\\n" "$QNN_SDK_ROOT" "$LD_LIBRARY_PATH"'])],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": "/before"},
        capture_output=True,
        text=True,
    )
    assert shell.stdout.splitlines() == [str(toolchain.overlay_root), f"{toolchain.overlay_lib_dir}:/before"]
