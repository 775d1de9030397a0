"""Cross-version programs: a program lowered by one release run on another's runtime.

The classification is tested on its own, with runner results made up at the process boundary (what a
runner process leaves: exit code, log, raw output files): a refusal keeps its error line and is never
taken for a run, outputs within the suite's tolerance of the runtime's own lowering match, outputs beyond
it differ with the max error per step. The driver is run with fake releases (no venv, no runner), and the
renderers must keep a hostile error line inert. One real test runs both directions when the matrix has
made executorch 1.4.1's and 1.5.1's venvs and lowered the case in both (skipped with why otherwise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.matrix import cli, cross, render, runner
from harness.matrix.environments import MATRIX_HOME, PythonEnv, QnnTree
from harness.matrix.layout import Combination
from harness.paths import REPO_ROOT
from harness.report.intake import ReportDataError
from harness.tests.matrix import reports

CASE = "counter_add-fp16-delegate_mutbuf-SM8650"
EAGER = [[np.array([1.0, 1.0, 1.0, 1.0], dtype=np.float32) * (step + 1)] for step in range(3)]


def _raw(outputs: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Outputs as a runner leaves them: the bytes of each file."""
    return [[array.astype(np.float32).view(np.uint8).reshape(-1) for array in row] for row in outputs]


def _shifted(step: int, by: float) -> list[list[np.ndarray]]:
    return [[row[0] + (by if index == step else 0.0)] for index, row in enumerate(EAGER)]


def test_a_runner_that_fails_refuses_and_its_error_line_is_kept():
    log = "runner: heap pattern 0x40\nrunner: cannot load /x/model.pte: Error 0x23 (InvalidProgram)\n"
    decided = cross.classify(cross.RunnerResult(3, log), EAGER, "fp16", own=EAGER)
    assert decided["outcome"] == cross.REFUSES
    assert decided["detail"] == "exit 3: runner: cannot load /x/model.pte: Error 0x23 (InvalidProgram)"


def test_a_run_that_exits_zero_is_never_a_refusal_and_matches_within_tolerance():
    nearly = _shifted(1, 0.004)  # fp16 tolerance: 1e-2 + 1e-2 * |reference|
    decided = cross.classify(cross.RunnerResult(0, "runner: 3 line(s)", _raw(nearly)), EAGER, "fp16", own=EAGER)
    assert decided["outcome"] == cross.MATCHES
    assert decided["reference"] == "own lowering"
    assert decided["mismatches"] == 0
    assert decided["max_error_per_step"][1] == pytest.approx(0.004, rel=1e-3)


def test_outputs_beyond_tolerance_differ_with_the_max_error_per_step():
    decided = cross.classify(cross.RunnerResult(0, "", _raw(_shifted(2, 1.5))), EAGER, "fp16", own=EAGER)
    assert decided["outcome"] == cross.DIFFERS
    assert decided["max_error_per_step"] == [0.0, 0.0, 1.5]
    assert decided["mismatches"] == 4
    assert "4 element(s) out of tolerance vs the own lowering, max abs error 1.5" in decided["detail"]


def test_it_is_held_to_the_runtimes_own_lowering_and_to_eager_only_without_one():
    """Equal to the own lowering's outputs (here: both wrong by the same amount, as a defect in the runtime
    shows in both) matches; the eager numbers are kept beside. Without an own run, eager decides."""
    wrong = _shifted(0, 3.0)
    decided = cross.classify(cross.RunnerResult(0, "", _raw(wrong)), EAGER, "fp16", own=wrong)
    assert decided["outcome"] == cross.MATCHES and decided["eager_max_error_per_step"][0] == 3.0
    alone = cross.classify(cross.RunnerResult(0, "", _raw(wrong)), EAGER, "fp16", own=None)
    assert alone["outcome"] == cross.DIFFERS and alone["reference"] == "eager"


def test_a_missing_or_resized_output_differs_with_one_line():
    short = _raw(EAGER)
    short[1] = [None]
    decided = cross.classify(cross.RunnerResult(0, "", short), EAGER, "fp16", own=EAGER)
    assert decided == {
        "outcome": cross.DIFFERS,
        "detail": "outputs unlike eager's: step 1 output 0: the runner wrote none",
    }
    wide = _raw(EAGER)
    wide[0] = [np.zeros(32, dtype=np.uint8)]
    assert "32 bytes, eager has 16" in cross.classify(cross.RunnerResult(0, "", wide), EAGER, "fp16", None)["detail"]


class FakeSteps:
    """Two releases; what each runtime does with each program is given by `behaviour`."""

    def __init__(self, behaviour: dict[tuple[str, str], cross.RunnerResult], lowered: dict[str, dict]) -> None:
        self.behaviour, self.lowered, self.runs = behaviour, lowered, []

    def release(self, combination: Combination):
        root = Path("/venvs") / combination.executorch
        return PythonEnv(combination.executorch, root, True), QnnTree(combination.qnn_wheel, Path("/qnn"), "v2.51.0.1")

    def describe(self, env, tree, combination, case_ids):
        return {"env": {}, "lowerings": {case_id: self.lowered[env.executorch] for case_id in case_ids}}

    def run(self, env, tree, runtime, program, method_index, inputs, out):
        self.runs.append((program.parent.name, env.executorch))
        assert len(inputs) == len(EAGER) and all(path.is_file() for row in inputs for path in row)
        return self.behaviour[(program.parent.name, env.executorch)]


def _reported(tmp_path: Path, release: str) -> tuple[Combination, Path]:
    folder = tmp_path / release
    (folder / "run" / "SM8650").mkdir(parents=True)
    report = reports.document({(CASE, "state"): ("passed", "")}, "v2.51.0.260929181845")
    (folder / "run" / "SM8650" / "report.json").write_text(json.dumps(report))
    return Combination(release, "2.7.0"), folder


def _feed(card: str, steps: int):
    assert (card, steps) == ("fixtures.zoo:counter_add", 3)
    return [(np.ones(4, dtype=np.float32),)] * steps, EAGER


def _lowering(release: str) -> dict:
    return {"program": f"/cache/{release}/model.pte", "method_index": 0, "card": "fixtures.zoo:counter_add", "steps": 3}


def test_both_directions_run_each_against_the_runtimes_own_program(tmp_path):
    good = cross.RunnerResult(0, "", _raw(EAGER))
    steps = FakeSteps(
        {
            ("1.4.1", "1.4.1"): good,
            ("1.5.1", "1.5.1"): good,
            ("1.4.1", "1.5.1"): cross.RunnerResult(0, "", _raw(_shifted(1, 2.0))),
            ("1.5.1", "1.4.1"): cross.RunnerResult(1, "runner: cannot load m.pte: <b>version</b> | 9"),
        },
        {"1.4.1": _lowering("1.4.1"), "1.5.1": _lowering("1.5.1")},
    )
    ran = [_reported(tmp_path, "1.4.1"), _reported(tmp_path, "1.5.1")]
    rows = cross.run_cross(ran, steps, tmp_path / "work", _feed, progress=lambda line: None)
    assert sorted(steps.runs) == [("1.4.1", "1.4.1"), ("1.4.1", "1.5.1"), ("1.5.1", "1.4.1"), ("1.5.1", "1.5.1")]
    outcomes = {(row.program, row.runtime): (row.outcome, row.max_error_per_step) for row in rows}
    assert outcomes == {("1.4.1", "1.5.1"): ("differs", [0.0, 2.0, 0.0]), ("1.5.1", "1.4.1"): ("refuses", [])}
    found = cross.document(rows, "m", "python -m harness matrix --cross")
    assert found["findings"] == 1 and found["rows"][0]["outcome"] == "differs"  # findings first
    assert {(p["program"], p["runtime"]): p["counts"]["refuses"] for p in found["pairs"]} == {
        ("1.4.1", "1.5.1"): 0,
        ("1.5.1", "1.4.1"): 1,
    }
    markdown = render.render_cross_markdown(found)
    assert "\\<b\\>version\\</b\\> \\| 9" in markdown and "<b>" not in markdown
    page = render.render_html({**_empty_matrix()}, found)
    assert "&lt;b&gt;version&lt;/b&gt;" in page and "<b>version" not in page
    assert "Cross-version programs (2 runs, 1 differ)" in page


def test_a_release_without_the_program_is_not_run_with_why_and_the_other_direction_still_runs(tmp_path):
    good = cross.RunnerResult(0, "", _raw(EAGER))
    steps = FakeSteps(
        {("1.5.1", "1.5.1"): good, ("1.5.1", "1.4.1"): good},
        {"1.4.1": {"missing": "lowering failed: QnnError: op not supported"}, "1.5.1": _lowering("1.5.1")},
    )
    ran = [_reported(tmp_path, "1.4.1"), _reported(tmp_path, "1.5.1")]
    rows = {(r.program, r.runtime): r for r in cross.run_cross(ran, steps, tmp_path / "w", _feed, lambda line: None)}
    assert rows[("1.4.1", "1.5.1")].outcome == cross.NOT_RUN
    assert (
        rows[("1.4.1", "1.5.1")].detail
        == "executorch 1.4.1 has no program: lowering failed: QnnError: op not supported"
    )
    assert rows[("1.5.1", "1.4.1")].outcome == cross.MATCHES and rows[("1.5.1", "1.4.1")].reference == "eager"


def test_releases_of_different_qnn_columns_are_never_paired(tmp_path):
    steps = FakeSteps({}, {})
    first, second = _reported(tmp_path, "1.4.1"), _reported(tmp_path, "1.5.1")
    ran = [first, (Combination("1.5.1", "2.3.0"), second[1])]
    assert cross.run_cross(ran, steps, tmp_path / "w", _feed, lambda line: None) == [] and steps.runs == []


def _empty_matrix() -> dict:
    return {"matrix_id": "m", "command": "c", "columns": [], "rows": [], "findings": [], "total_rows": 0}


def test_cross_needs_two_releases_and_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse(["--executorch", "1.5.1", "--cross"])
    assert exit_info.value.code == 2
    assert "--cross runs programs across releases: give two or more" in capsys.readouterr().err


def test_the_page_takes_the_section_from_cross_json_and_a_broken_one_is_one_line(tmp_path, capsys):
    assert cli.cross_document(tmp_path) is None
    (tmp_path / "cross.json").write_text("{not json")
    assert cli.cross_document(tmp_path) is None
    assert "is unreadable" in capsys.readouterr().err
    (tmp_path / "cross.json").write_text(json.dumps(cross.document([], "m", "c")))
    assert cli.cross_document(tmp_path)["schema_version"] == 1
    assert "No case ran in two releases" in render.render_markdown(_empty_matrix(), cli.cross_document(tmp_path))
    written = render.write(_empty_matrix(), tmp_path / "page", cli.cross_document(tmp_path))
    assert [path.name for path in written] == ["matrix.json", "matrix.md", "matrix.html", "cross.md"]
    assert "Cross-version programs (0 runs, 0 differ)" in (tmp_path / "page" / "matrix.html").read_text()


def test_the_eager_column_says_when_the_runtimes_own_lowering_is_off_eager_too():
    wrong = _shifted(0, 3.0)
    row = {**cross.classify(cross.RunnerResult(0, "", _raw(wrong)), EAGER, "fp16", own=wrong), "case_id": CASE}
    row.update(program="1.4.1", runtime="1.5.1", reference="own lowering")
    found = {**cross.document([], "m", "c"), "rows": [{**row, "detail": "d"}]}
    assert "| matches | own lowering | 0.0, 0.0, 0.0 | 4 off, max 3 | d |" in render.render_cross_markdown(found)
    hostile = {**found, "rows": [{**found["rows"][0], "eager_mismatches": "<x>"}]}
    assert "| 0.0, 0.0, 0.0 |  | d |" in render.render_cross_markdown(hostile)


def test_the_matrix_page_is_written_in_a_process_that_registered_no_checks():
    """The page's flaky reasons come from the manifest; the matrix never imports the checks (a floor above it),
    so the manifest must be read without them (it was refused, and no matrix page was written)."""
    done = subprocess.run(
        [sys.executable, "-c", "from harness.matrix import cli; print(sorted(cli.flaky_reasons()))"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]


REAL_RELEASES = ("1.4.1", "1.5.1")
REAL_CASE = "counter_add-fp16-skip_mutbuf-SM8650"


def test_real_programs_of_two_releases_on_each_others_runtime(tmp_path):
    """Both directions for real: each release's cached program, found by its own harness's key in its venv,
    on both runtimes through the host runner on the HTP simulator."""
    venvs = [MATRIX_HOME / "venvs" / f"executorch-{release}" / "bin" / "python" for release in REAL_RELEASES]
    if not all(path.exists() for path in venvs):
        pytest.skip(f"no matrix venvs of executorch {' and '.join(REAL_RELEASES)}: run the matrix with --cross once")
    caches = [MATRIX_HOME / "artifacts" / Combination(r, cli.pinned_qnn_wheel()).id for r in REAL_RELEASES]
    if not all(any(cache.glob(f"{REAL_CASE}-*/model.pte")) for cache in caches):
        pytest.skip(f"{REAL_CASE} is not lowered by both releases: run the matrix with --cross -k counter_add once")
    ran = [_reported(tmp_path, release) for release in REAL_RELEASES]
    for _, folder in ran:
        report = folder / "run" / "SM8650" / "report.json"
        report.write_text(report.read_text().replace(CASE, REAL_CASE).replace("delegate_mutbuf", "skip_mutbuf"))
    rows = cross.run_cross(ran, cross.RealCrossSteps(), tmp_path / "work", cross.real_feed, lambda line: None)
    assert {(row.program, row.runtime) for row in rows} == {REAL_RELEASES, REAL_RELEASES[::-1]}
    for row in rows:
        assert row.outcome in (cross.MATCHES, cross.DIFFERS, cross.REFUSES), row.detail
        if row.outcome != cross.REFUSES:
            # the runtime's own program ran, so the cross run is held to it; and the numbers are kept
            assert row.reference == "own lowering" and len(row.max_error_per_step) == 4, row.detail
            assert row.eager_mismatches == 0, f"{row.program} on {row.runtime}: off eager ({row.detail})"
    # and a program a runtime cannot load is a refusal with the runner's own line, not a crash of the step
    steps, (combination, _) = cross.RealCrossSteps(), ran[0]
    env, tree = steps.release(combination)
    answer = steps.describe(env, tree, combination, [REAL_CASE])
    broken = tmp_path / "broken.pte"
    broken.write_bytes(Path(answer["lowerings"][REAL_CASE]["program"]).read_bytes()[:200])
    files = [[tmp_path / "work" / "inputs" / REAL_CASE / f"input_{step}_0.raw"] for step in range(4)]
    result = steps.run(env, tree, answer, broken, 0, files, tmp_path / "broken")
    decided = cross.classify(result, cross.real_feed("fixtures.zoo:counter_add", 4)[1], "fp16", None)
    assert decided["outcome"] == cross.REFUSES and "runner: cannot load" in decided["detail"], decided


def test_a_combinations_report_the_schema_refuses_is_one_line_for_the_pairing_and_the_progress(tmp_path):
    """Both readers of a combination's report.json (the cross pairing, the progress line's counts) go through the
    one report reader: a report without its cases' tags is refused with one line naming the file, never read."""
    combination, folder = _reported(tmp_path, "1.5.1")
    assert list(cross.case_ids_ran(folder)) == [CASE] and runner._summary(folder) == "1 passed"
    report = folder / "run" / "SM8650" / "report.json"
    broken = json.loads(report.read_text())
    del broken["cases"][0]["tags"]
    report.write_text(json.dumps(broken))
    with pytest.raises(ReportDataError, match="'tags' is a required property") as raised:
        cross.case_ids_ran(folder)
    assert "\n" not in str(raised.value) and str(report) in str(raised.value)
    assert runner._summary(folder) == f"no counts: {raised.value}"
