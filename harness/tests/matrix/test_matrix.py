"""The version matrix at unit level: no executorch release is installed here.

The side-by-side builder must put the rows that change first and word the change by the version that
caused it (and must not call anything a change that is only a column that did not run); the renderers
must keep hostile report strings inert; the runner must go on past a combination that cannot run, with
one line saying why; the environments must keep torch pinned exactly and reuse what they made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.matrix import cli, environments, render, runner, side_by_side
from harness.matrix.environments import MatrixSetupError, PythonEnv, QnnTree
from harness.matrix.layout import COMBINATION_FILE, Combination
from harness.matrix.side_by_side import Column
from harness.paths import REPO_ROOT
from harness.report.intake import ReportDataError
from harness.tests.matrix import reports
from harness.vocabulary import Verdict

BUILD = {"2.47": "v2.47.0.260601114230", "2.51": "v2.51.0.260929181845"}


def _column(executorch: str, qairt: str, verdicts: dict, status: str = "ran", reason: str = "") -> Column:
    documents = (reports.document(verdicts, BUILD[qairt]),) if status == "ran" else ()
    wheel = {"2.47": "2.3.0", "2.51": "2.7.0"}[qairt]
    return Column(Combination(executorch, wheel), BUILD[qairt], status, reason, "on", documents)


STATE = ("kv_arange_init-fp16-delegate_mutbuf-SM8650", "state")
EXPORT = ("kv_arange_init-fp16-delegate_mutbuf-SM8650", "export")
PARTS = ("two_buffer_accumulate-16a8w-skip_mutbuf-SM8650", "partitions")
PASS, FAIL = ("passed", ""), ("failed", "max abs error 131008.0 at step 0")


def _rows(document: dict) -> dict[tuple[str, str], dict]:
    return {(row["case_id"], row["check"]): row for row in document["rows"]}


def test_a_check_that_breaks_in_one_executorch_release_is_first_and_labelled():
    columns = [
        _column(e, q, {STATE: FAIL if e >= "1.5.0" else PASS, EXPORT: PASS})
        for e in ("1.5.1", "1.4.1", "1.5.0")
        for q in ("2.51", "2.47")
    ]
    document = side_by_side.build(columns, "m", "cmd")
    assert [c["executorch"] for c in document["columns"]] == ["1.4.1", "1.4.1", "1.5.0", "1.5.0", "1.5.1", "1.5.1"]
    assert [c["qairt"] for c in document["columns"][:2]] == ["2.47", "2.51"]
    first = document["rows"][0]
    assert (first["case_id"], first["check"]) == STATE and first["changed"]
    assert first["label"] == "fails from executorch 1.5.0 on"
    assert [cell["verdict"] for cell in first["cells"]] == ["passed"] * 2 + ["failed"] * 4
    assert not _rows(document)[EXPORT]["changed"] and _rows(document)[EXPORT]["label"] == ""
    assert document["changed_rows"] == 1 and document["total_rows"] == 2


def test_a_fix_that_comes_with_the_qnn_libraries_is_labelled_by_qairt():
    columns = [
        _column(e, q, {PARTS: ("xfailed", "partition_count") if q == "2.47" else PASS})
        for e in ("1.4.1", "1.5.1")
        for q in ("2.47", "2.51")
    ]
    assert side_by_side.build(columns, "m", "cmd")["rows"][0]["label"] == "fixed in QAIRT 2.51"


def test_a_change_with_both_axes_and_a_verdict_only_change_are_worded_too():
    mixed = [
        _column("1.4.1", "2.47", {STATE: PASS}),
        _column("1.4.1", "2.51", {STATE: FAIL}),
        _column("1.5.1", "2.47", {STATE: FAIL}),
        _column("1.5.1", "2.51", {STATE: FAIL}),
    ]
    assert side_by_side.build(mixed, "m", "c")["rows"][0]["label"].startswith("varies with executorch and QAIRT")
    # failed vs xfailed is the same outcome (it fails) but a different verdict: named by verdict
    scoped = [_column("1.4.1", "2.51", {STATE: FAIL}), _column("1.5.1", "2.51", {STATE: ("xfailed", "state_mismatch")})]
    assert side_by_side.build(scoped, "m", "c")["rows"][0]["label"] == "xfailed from executorch 1.5.1 on (was failed)"


def test_a_column_that_did_not_run_makes_no_row_change_and_keeps_its_reason():
    columns = [
        _column("1.4.1", "2.51", {STATE: PASS}),
        _column("1.5.1", "2.51", {STATE: PASS}),
        _column("1.5.0", "2.51", {}, status="cannot run", reason="pip cannot install executorch==1.5.0: x"),
    ]
    document = side_by_side.build(columns, "m", "c")
    row = document["rows"][0]
    assert not row["changed"] and row["cells"][1] is None
    assert document["columns"][1]["status"] == "cannot run" and "pip cannot install" in document["columns"][1]["reason"]
    assert "cannot run: pip cannot install executorch==1.5.0: x" in render.render_markdown(document)
    columns[0] = _column("1.4.1", "2.51", {STATE: FAIL})
    assert side_by_side.build(columns, "m", "c")["findings"][0]["counts"] == [1, None, 0]  # not run: not "none found"


def test_a_check_missing_in_one_column_that_ran_is_a_change():
    columns = [_column("1.4.1", "2.51", {STATE: PASS, EXPORT: PASS}), _column("1.5.1", "2.51", {EXPORT: PASS})]
    row = _rows(side_by_side.build(columns, "m", "c"))[STATE]
    assert row["changed"] and row["cells"][1] == {"verdict": "absent", "message": "", "known_failure": ""}


def test_findings_are_counted_per_column_by_signature():
    columns = [
        _column(
            "1.4.1",
            "2.51",
            {
                STATE: ("xfailed", "uninitialised_delegated_buffer"),
                EXPORT: PASS,
                PARTS: ("failed", "2 delegates, expected 1 [signature: partition_count]"),
            },
        ),
        _column("1.5.1", "2.51", {STATE: ("xfailed", "uninitialised_delegated_buffer"), EXPORT: FAIL, PARTS: PASS}),
    ]
    findings = {f["signature"]: f["counts"] for f in side_by_side.build(columns, "m", "c")["findings"]}
    assert findings["uninitialised_delegated_buffer"] == [1, 1]
    assert findings["partition_count"] == [1, 0]
    assert findings["unclassified: max abs error # at step #"] == [0, 1]


def test_hostile_report_strings_stay_inert_in_both_renderers():
    hostile = "kv<script>alert(1)</script>|x-fp16-delegate_mutbuf-SM8650"
    columns = [
        _column("1.4.1", "2.51", {(hostile, "state"): ("failed", "bad | `cell`\nsecond line <b>")}),
        _column("1.5.1", "2.51", {(hostile, "state"): PASS}),
    ]
    document = side_by_side.build(columns, "m", "python -m harness matrix -k '<x>'")
    page = render.render_html(document)
    assert "<script>alert" not in page and "&lt;script&gt;" in page
    markdown = render.render_markdown(document)
    row = next(line for line in markdown.splitlines() if "alert" in line and "fixed in" in line)
    assert row.count("|") - row.count("\\|") == 4 + 2 + 1, row  # SoC, case, check, label, 2 columns: 7 bars
    assert "<script>" not in markdown


def test_markdown_tables_have_one_line_per_row_and_a_header_per_table():
    columns = [_column(e, "2.51", {STATE: FAIL if e == "1.5.1" else PASS, EXPORT: PASS}) for e in ("1.4.1", "1.5.1")]
    markdown = render.render_markdown(side_by_side.build(columns, "m", "cmd"))
    lines = markdown.splitlines()
    header = lines.index("| SoC | case | check | what changed | 1 | 2 |")
    assert lines[header + 1] == "| --- | --- | --- | --- | --- | --- |"
    assert lines[header + 2].startswith("| SM8650 | kv_arange_init") and lines[header + 2].endswith("| pass | FAIL |")
    assert "| SoC | case | check | 1 | 2 |" in lines


def _fake_report(folder: Path, verdicts: dict, build_id: str) -> None:
    run = len(list(folder.glob("2026*")))  # a fresh run id per run, as a real suite run makes
    path = folder / f"20261201-00000{run}-1" / "SM8650" / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(reports.document(verdicts, build_id)))


class FakeSteps:
    """Steps that fail where told to, and write a report where they run."""

    def __init__(self, fail_venv: set[str] = frozenset(), fail_setup: set[str] = frozenset(), no_report: bool = False):
        self.fail_venv, self.fail_setup, self.no_report, self.calls = fail_venv, fail_setup, no_report, []

    def python_env(self, executorch: str) -> PythonEnv:
        self.calls.append(("venv", executorch))
        if executorch in self.fail_venv:
            raise MatrixSetupError(
                f"pip cannot install executorch=={executorch} beside torch==2.13.0: no matching\ndistribution"
            )
        return PythonEnv(executorch, Path("/nonexistent"), reused=True)

    def qnn_tree(self, wheel: str) -> QnnTree:
        return QnnTree(wheel, Path("/nonexistent"), BUILD["2.51" if wheel == "2.7.0" else "2.47"])

    def setup(self, env: PythonEnv, tree: QnnTree) -> str:
        if env.executorch in self.fail_setup:
            raise MatrixSetupError("bridge probe failed: QNN backend does not start")
        return "on"

    def suite(self, env: PythonEnv, tree: QnnTree, combination: Combination, folder: Path) -> int:
        if self.no_report:
            (folder / "pytest.log").write_text("collecting\nERROR: usage: --emulate SM9999 unknown SoC\n")
            return 4
        _fake_report(folder, {STATE: PASS if env.executorch == "1.4.1" else FAIL}, tree.build_id)
        return 1


def test_the_matrix_goes_on_past_combinations_that_cannot_run(tmp_path):
    steps = FakeSteps(fail_venv={"1.5.0"}, fail_setup={"1.3.1"})
    lines: list[str] = []
    combos = [Combination(e, "2.7.0") for e in ("1.3.1", "1.4.1", "1.5.0", "1.5.1")]
    runs = runner.run_matrix(combos, steps, tmp_path, progress=lines.append)
    assert [run.status for run in runs] == ["cannot run", "ran", "cannot run", "ran"]
    assert runs[2].reason == "pip cannot install executorch==1.5.0 beside torch==2.13.0: no matching distribution"
    assert runs[0].reason == "bridge probe failed: QNN backend does not start"
    assert len(lines) == 8 and all("\n" not in line for line in lines)
    assert lines[5].endswith(
        "cannot run: pip cannot install executorch==1.5.0 beside torch==2.13.0: no matching distribution"
    )
    assert "1 failed" in lines[7] and "QAIRT v2.51.0.260929181845, bridge on" in lines[7]
    document = side_by_side.build(side_by_side.load_columns(tmp_path), "m", "c")
    assert [c["status"] for c in document["columns"]] == ["cannot run", "ran", "cannot run", "ran"]
    assert document["rows"][0]["label"] == "fails from executorch 1.5.1 on"


def test_a_suite_run_without_a_report_says_why_in_one_line(tmp_path):
    run = runner.run_combination(Combination("1.5.1", "2.7.0"), FakeSteps(no_report=True), tmp_path / "c")
    assert run.status == "cannot run" and run.suite_exit_code == 4
    assert run.reason.startswith("suite exited 4 without a report: ERROR: usage: --emulate SM9999 unknown SoC")
    assert json.loads((tmp_path / "c" / COMBINATION_FILE).read_text())["reason"] == run.reason


def test_default_workers_are_two_unless_the_selection_says():
    assert runner.with_default_workers(["-k", "x"]) == ["-n", "2", "-k", "x"]
    assert runner.with_default_workers(["-n", "1"]) == ["-n", "1"]
    assert runner.with_default_workers(["-p", "no:xdist"]) == ["-p", "no:xdist"]
    assert runner.with_default_workers(["--no-cache"]) == ["-n", "2", "--no-cache"]


def test_venv_requirements_pin_torch_exactly_and_swap_executorch(tmp_path):
    wanted = environments.requirements_for("1.4.1")
    assert "torch==2.13.0" in wanted and "executorch==1.4.1" in wanted
    assert not any(line.startswith(("onnxruntime-qnn", "executorch==1.5")) for line in wanted)
    broken = tmp_path / "requirements.txt"
    broken.write_text("torch==2.13.0\nthis is not ( a requirement\n")
    with pytest.raises(MatrixSetupError) as error:
        environments.requirements_for("1.4.1", broken)
    assert "\n" not in str(error.value) and "not a requirement" in str(error.value)


@pytest.mark.parametrize("bad", ["1.5; rm -rf /", "../../etc", "latest", ""])
def test_versions_that_are_not_versions_are_one_line(bad):
    with pytest.raises(MatrixSetupError) as error:
        cli.combinations(cli.parse(["--executorch", f"1.5.1,{bad}" if bad else ","])[0])
    assert "\n" not in str(error.value)


def test_cli_splits_pytest_arguments_and_builds_the_product():
    args, pytest_args = cli.parse(
        ["--executorch", "1.4.1,1.5.1", "--qnn-wheel", "2.5.0,2.7.0", "--", "-k", "a or b", "--"]
    )
    assert pytest_args == ["-k", "a or b", "--"]
    assert [c.id for c in cli.combinations(args)] == [
        "executorch-1.4.1_onnxruntime-qnn-2.5.0",
        "executorch-1.4.1_onnxruntime-qnn-2.7.0",
        "executorch-1.5.1_onnxruntime-qnn-2.5.0",
        "executorch-1.5.1_onnxruntime-qnn-2.7.0",
    ]
    args, _ = cli.parse(["--executorch", "1.5.1"])
    assert [c.qnn_wheel for c in cli.combinations(args)] == [cli.pinned_qnn_wheel()]


@pytest.mark.child_python
def test_cli_bad_arguments_are_one_line_and_exit_2():
    for argv in (["matrix"], ["matrix", "--executorch", "1.5.1", "--id", "../x"], ["matrix", "--executorch", "one"]):
        completed = subprocess.run(
            [sys.executable, "-m", "harness", *argv], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert completed.returncode == 2, completed.stderr
        assert len(completed.stderr.strip().splitlines()[-1]) > 10 and "Traceback" not in completed.stderr


def test_rebuild_renders_an_existing_matrix_folder(tmp_path):
    runner.run_matrix(
        [Combination("1.4.1", "2.7.0"), Combination("1.5.1", "2.7.0")],
        FakeSteps(),
        tmp_path / "matrix-x",
        progress=lambda line: None,
    )
    (tmp_path / "matrix-x" / "command.txt").write_text("python -m harness matrix --executorch 1.4.1,1.5.1\n")
    assert cli.main(["--rebuild", str(tmp_path / "matrix-x")]) == 0
    document = json.loads((tmp_path / "matrix-x" / "matrix.json").read_text())
    assert document["matrix_id"] == "x" and document["changed_rows"] == 1
    assert document["command"] == "python -m harness matrix --executorch 1.4.1,1.5.1"
    assert (tmp_path / "matrix-x" / "matrix.html").read_text().startswith("<!DOCTYPE html>")


def test_a_report_the_schema_refuses_is_one_line_naming_the_file_and_no_page(tmp_path, capsys):
    """The matrix reads report.json through the one report reader (harness/report/intake.py): a case without
    its tags (as an older or hand-edited report may be) is refused before any code looks at a key."""
    folder = tmp_path / "matrix-x"
    runner.run_matrix([Combination("1.5.1", "2.7.0")], FakeSteps(), folder, progress=lambda line: None)
    (report,) = folder.glob("*/*/*/report.json")
    side_by_side.load_columns(folder)  # the suite's shape of report is read
    document = json.loads(report.read_text())
    del document["cases"][0]["tags"]
    report.write_text(json.dumps(document))
    with pytest.raises(ReportDataError, match="'tags' is a required property"):
        side_by_side.load_columns(folder)
    assert cli.main(["--rebuild", str(folder)]) == cli.MALFORMED_REPORT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(report) in error and "'tags' is a required property" in error
    assert "Traceback" not in error and not (folder / "matrix.json").exists()


def test_qnn_tree_without_host_libraries_cannot_run_and_says_which(tmp_path, monkeypatch):
    package = tmp_path / "home" / "qnn" / "onnxruntime-qnn-2.9.0" / "site" / "onnxruntime_qnn"
    package.mkdir(parents=True)
    (package / "libQnnHtp.so").write_bytes(b"\0v2.53.0.261201000000\0")
    with pytest.raises(MatrixSetupError) as error:
        environments.ensure_qnn_tree("2.9.0", tmp_path / "home")
    assert str(error.value) == (
        "onnxruntime-qnn 2.9.0 carries no x86_64 libQnnSystem.so, libHtpPrepare.so: "
        "pick a release that ships the host libraries"
    )
    for name in ("libQnnSystem.so", "libHtpPrepare.so"):
        (package / name).write_bytes(b"")
    (package.parent / "onnxruntime_qnn.libs").mkdir()
    tree = environments.ensure_qnn_tree("2.9.0", tmp_path / "home")
    assert tree.build_id == "v2.53.0.261201000000"
    assert (tree.root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so").resolve() == (package / "libQnnHtp.so").resolve()


def test_a_venv_with_a_current_stamp_is_reused_without_pip(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        environments.subprocess, "run", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError)
    )
    root = tmp_path / "venvs" / "executorch-1.5.1"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("")
    import hashlib

    stamp = hashlib.sha256("\n".join(environments.requirements_for("1.5.1")).encode()).hexdigest()[:32]
    (root / environments.STAMP).write_text(stamp + "\n")
    assert environments.ensure_venv("1.5.1", tmp_path).reused and not calls
    (root / environments.STAMP).write_text("stale\n")
    with pytest.raises(AssertionError):
        environments.ensure_venv("1.5.1", tmp_path)  # a stale stamp reinstalls (reaches pip)
    assert calls


def test_flips_allowed_by_a_flaky_known_failure_are_kept_apart_from_version_changes():
    flaky = "known failure [uninitialised_delegated_buffer]: a reason"
    columns = [
        _column("1.4.1", "2.51", {STATE: ("xfailed", "uninitialised_delegated_buffer"), EXPORT: PASS}),
        _column("1.5.1", "2.51", {STATE: PASS, EXPORT: FAIL}),
    ]
    document = side_by_side.build(columns, "m", "c", frozenset({flaky}))
    rows = _rows(document)
    assert (
        rows[STATE]["flaky"]
        and rows[STATE]["label"] == "flaky known failure, not a version change: passed in 1 of 2 columns"
    )
    assert not rows[EXPORT]["flaky"] and document["rows"][0] is rows[EXPORT]
    assert document["changed_rows"] == 1 and document["flaky_rows"] == 1
    assert not side_by_side.build(columns, "m", "c")["rows"][1]["flaky"]  # not flaky in the manifest: a change
    markdown = render.render_markdown(document)
    assert markdown.index("fails from executorch 1.5.1 on") < markdown.index("## Checks that differ only by a flaky")


def test_a_combination_runs_as_in_its_activated_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("QNNSUITE_TRACE", "/tmp/stale-trace")
    steps = runner.RealSteps(tmp_path / "home")
    env = steps._env(
        PythonEnv("1.3.1", tmp_path / "venv", reused=True), QnnTree("2.7.0", tmp_path / "tree", BUILD["2.51"])
    )
    assert env["PATH"].split(":")[:2] == [str(tmp_path / "venv" / "bin"), "/usr/bin"]
    assert env["QNN_SDK_ROOT"] == str(tmp_path / "tree") and env["QNNSUITE_HOME"] == str(tmp_path / "home" / "state")
    assert "QNNSUITE_TRACE" not in env


def _fake_python(root: Path, runtime: str, setup: str) -> PythonEnv:
    """A venv whose `python` is a shell script: `-c` (the runtime feature check) and `-m harness setup`
    answer with the given shell snippets, so RealSteps.setup's reading of both is tested without executorch."""
    (root / "bin").mkdir(parents=True)
    script = root / "bin" / "python"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then {runtime}; fi\n{setup}\n')
    script.chmod(0o755)
    return PythonEnv("1.3.1", root, reused=True)


RUNTIME_BROKEN = (
    "echo 'Traceback (most recent call last):' >&2; "
    'echo "ImportError: $VIRTUAL_ENV/lib/_portable_lib.so: undefined symbol: _ZN3c10" >&2; exit 1'
)
SETUP_OK = "echo 'setup: QNN v2.51.0.1 from QNN_SDK_ROOT, device-config bridge off'; exit 0"
SETUP_BROKEN = "echo 'setup: QNN backend does not start (FileNotFoundError: flatc)' >&2; exit 1"


@pytest.mark.parametrize(
    ("runtime", "setup", "expected"),
    [
        (
            RUNTIME_BROKEN,
            SETUP_OK,
            "executorch.extension.pybindings.portable_lib does not load in this venv: "
            "ImportError: lib/_portable_lib.so: undefined symbol: _ZN3c10",
        ),
        ("exit 0", SETUP_BROKEN, "bridge probe failed: QNN backend does not start (FileNotFoundError: flatc)"),
        ("exit 0", SETUP_OK, None),
    ],
)
def test_setup_checks_the_runtime_then_reads_the_probe(tmp_path, runtime, setup, expected):
    env = _fake_python(tmp_path / "venv", runtime, setup)
    tree = QnnTree("2.7.0", tmp_path / "tree", BUILD["2.51"])
    steps = runner.RealSteps(tmp_path / "home")
    if expected is None:
        assert steps.setup(env, tree) == "off"
        return
    with pytest.raises(MatrixSetupError) as error:
        steps.setup(env, tree)
    assert str(error.value) == expected


def test_the_report_after_a_partial_rerun_names_every_command(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "RealSteps", lambda home, pytest_args: FakeSteps())
    root = tmp_path / "reports"
    first = ["--id", "x", "--report-root", str(root), "--executorch", "1.4.1,1.5.1", "--qnn-wheel", "2.7.0"]
    assert cli.main(first) == 0
    assert cli.main(["--id", "x", "--report-root", str(root), "--executorch", "1.4.1", "--qnn-wheel", "2.7.0"]) == 0
    document = json.loads((root / "matrix-x" / "matrix.json").read_text())
    assert document["command"].splitlines() == [
        "python -m harness matrix --id x --report-root " + str(root) + " --executorch 1.4.1,1.5.1 --qnn-wheel 2.7.0",
        "python -m harness matrix --id x --report-root " + str(root) + " --executorch 1.4.1 --qnn-wheel 2.7.0",
    ]
    assert len(document["columns"]) == 2 and document["changed_rows"] == 1


def test_rows_follow_the_reports_check_columns_a_new_check_included():
    """The order of a case's rows comes from report.json's check columns (the registry's order, carried in
    the report), not a list of its own: a check added with @check sorts where its reports put it."""
    made_up = ("kv_arange_init-fp16-delegate_mutbuf-SM8650", "made_up_check")
    columns = []
    for qairt in ("2.47", "2.51"):
        column = _column("1.5.0", qairt, {STATE: PASS, EXPORT: PASS, made_up: PASS})
        for document in column.documents:
            document["checks"] = [
                {"name": "made_up_check", "short": "mu"},
                {"name": "export", "short": "exp"},
                {"name": "state", "short": "state"},
            ]
        columns.append(column)
    assert side_by_side.check_order(columns) == ("made_up_check", "export", "state")
    assert [row["check"] for row in side_by_side.build(columns, "m", "c")["rows"]] == [
        "made_up_check",
        "export",
        "state",
    ]
    for document in (document for column in columns for document in column.documents):
        document["checks"] = [{"name": "state", "short": "state"}, {"name": "made_up_check", "short": "mu"}]
    # export is in no report's columns: after the known ones, by name
    assert [row["check"] for row in side_by_side.build(columns, "m", "c")["rows"]] == [
        "state",
        "made_up_check",
        "export",
    ]


def test_the_side_by_side_labels_every_verdict_from_the_verdict_itself():
    """Each verdict, not measured and infrastructure errors too, has its own label in both renderers."""
    case = "kv_arange_init-fp16-delegate_mutbuf-SM8650"
    verdicts = {(case, f"check_{verdict.value}"): (verdict.value, f"why {verdict.value}") for verdict in Verdict}
    columns = [
        _column("1.4.1", "2.51", verdicts),
        _column("1.5.1", "2.51", {key: PASS for key in verdicts}),
    ]
    document = side_by_side.build(columns, "m", "c")
    markdown, page = render.render_markdown(document), render.render_html(document)
    for verdict in Verdict:
        row = next(line for line in markdown.splitlines() if f"check_{verdict.value} " in line)
        assert f" {verdict.label} |" in row, (verdict, row)
        assert f">{verdict.label}<" in page, verdict
    assert render.label(None) == "n/a" and render.label({"verdict": side_by_side.ABSENT}) == "absent"
