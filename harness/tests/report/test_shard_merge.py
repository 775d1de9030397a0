"""Shards and merged reports: `--shard INDEX/COUNT` splits cases deterministically (balanced by a previous
report's timings when given), and `python -m harness.report merge` turns shard run folders back into one
run's reports, refusing parts that cannot be one run. The unit tests use made-up records; one test runs
the suite (--compile-only, a 4-case slice) unsharded and as shards 1/2 and 2/2 and diffs the merge."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from harness import shard
from harness.paths import REPO_ROOT
from harness.report import write_run
from harness.report.nightly import merge as merging
from harness.tests.child_suite import run_suite
from harness.tests.report.test_report import COLUMNS, SCHEMA, environments, make_records, typed

SLICE = "(kv_gather_written or kv_index_copy_dim1) and not driver_invariance and not horizon"  # 2 cards x 2 modes in fp16: 4 cases (their driven cases left out)
CASES = {
    f"{card}-fp16-{mode}-SM8650"
    for card in ("kv_gather_written", "kv_index_copy_dim1")
    for mode in ("delegate_mutbuf", "skip_mutbuf")
}


# --- the split -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("3/2", "--shard 3/2: INDEX must be between 1 and COUNT (2)"),
        ("0/4", "--shard 0/4: INDEX must be between 1 and COUNT (4)"),
        ("1-2", "--shard '1-2': write it as INDEX/COUNT"),
        ("a/b", "--shard 'a/b': write it as INDEX/COUNT"),
    ],
)
def test_a_bad_shard_is_refused_naming_the_fix(spelling, expected):
    with pytest.raises(shard.ShardError, match="^" + expected.replace("(", r"\(").replace(")", r"\)")):
        shard.parse(spelling)
    assert shard.parse("2/3").label == "2/3"


def test_without_timings_cases_are_dealt_round_robin_in_id_order():
    cases = [f"case{i}" for i in (3, 1, 4, 0, 2)]
    assert shard.assign(cases, 2, {}) == {"case0": 1, "case1": 2, "case2": 1, "case3": 2, "case4": 1}
    assert shard.assign(list(reversed(cases)), 2, {}) == shard.assign(cases, 2, {}), "order of collection is irrelevant"


def test_timings_balance_longest_first_and_unknown_cases_count_as_the_median():
    durations = {"a": 10.0, "b": 6.0, "c": 5.0, "d": 4.0}  # median 5.5 for "new"
    shard_of = shard.assign(["a", "b", "c", "d", "new"], 2, durations)
    # a(10)->1; b(6)->2; new(5.5)->2 (6 < 10); c(5)->1 (11.5 > 10); d(4)->2 (11.5 > 15? no: 15 vs 11.5 -> 2)
    assert shard_of == {"a": 1, "b": 2, "new": 2, "c": 1, "d": 2}
    loads = {i: sum(durations.get(c, 5.5) for c, s in shard_of.items() if s == i) for i in (1, 2)}
    assert loads == {1: 15.0, 2: 15.5}
    naive = shard.assign(["a", "b", "c", "d", "new"], 2, {})  # what ignoring the timings would give
    naive_loads = [sum(durations.get(c, 5.5) for c, s in naive.items() if s == i) for i in (1, 2)]
    assert max(naive_loads) - min(naive_loads) > abs(loads[1] - loads[2]), "the timings must change the split"


def test_every_case_is_in_exactly_one_shard_and_never_split():
    class Item:  # what partition reads of a pytest item
        def __init__(self, case: str, check: str) -> None:
            self.nodeid, self._case = f"suites/test_{check}.py::test_{check}[{case}]", case

        def get_closest_marker(self, name):
            return pytest.mark.xdist_group(self._case).mark if name == "xdist_group" else None

    items = [Item(f"case{c}", check) for c in range(7) for check in ("export", "state", "partitions")]
    parts = [shard.partition(items, shard.Shard(i, 3))[0] for i in (1, 2, 3)]
    assert sorted(id(i) for part in parts for i in part) == sorted(id(i) for i in items)
    for part in parts:
        assert part and all(len([i for i in part if i._case == item._case]) == 3 for item in part)


def test_case_durations_are_read_from_a_previous_report(tmp_path: Path):
    records = make_records()
    write_run(typed(records), environments(), tmp_path, "run1", COLUMNS)
    durations = shard.case_durations(tmp_path / "run1")
    some = records[0]["case_id"]
    assert durations[some] == pytest.approx(sum(r["duration_s"] for r in records if r["case_id"] == some))
    assert len(durations) == len({r["case_id"] for r in records})
    (tmp_path / "empty").mkdir()
    with pytest.raises(shard.ShardError, match="^--shard-timings: no report.json under"):
        shard.case_durations(tmp_path / "empty")


# --- the merge -------------------------------------------------------------------------------------------------
def _write_shards(root: Path, records: list[dict], count: int, versions: dict | None = None) -> list[Path]:
    """Shard run folders as `--shard i/count` runs of these records would write them."""
    shard_of = shard.assign(sorted({r["case_id"] for r in records}), count, {})
    folders = []
    for index in range(1, count + 1):
        envs = {
            soc: {
                **env,
                "shard": f"{index}/{count}",
                "run_id": f"shard{index}",
                **((versions or {}) if index == count else {}),
            }
            for soc, env in environments().items()
        }
        mine = [r for r in records if shard_of[r["case_id"]] == index]
        write_run(typed(mine), envs, root / f"host{index}", f"shard{index}", COLUMNS)
        folders.append(root / f"host{index}" / f"shard{index}")
    return folders


def _comparable(document: dict) -> dict:
    return {key: value for key, value in document.items() if key not in ("run_id", "environment")}


def test_merge_of_shards_equals_the_unsharded_report(tmp_path: Path):
    records = make_records()
    write_run(typed(records), environments(), tmp_path / "whole", "run1", COLUMNS)
    merging.merge(_write_shards(tmp_path, records, 3), tmp_path / "merged")
    for soc in ("SM8650", "SM8750"):
        whole = json.loads((tmp_path / "whole" / "run1" / soc / "report.json").read_text())
        merged = json.loads((tmp_path / "merged" / soc / "report.json").read_text())
        assert _comparable(merged) == _comparable(whole)
        jsonschema.validate(merged, SCHEMA)
        assert merged["environment"]["merged_from"] == "shard1 (shard 1/3), shard2 (shard 2/3), shard3 (shard 3/3)"
        assert "shard" not in merged["environment"]
        assert {p.name for p in (tmp_path / "merged" / soc).iterdir()} >= {
            "report.json",
            "junit.xml",
            "summary.md",
            "report.html",
        }


def _merge_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.report", "merge", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.child_python
def test_merge_refuses_a_version_mix_in_one_line(tmp_path: Path):
    folders = _write_shards(tmp_path, make_records(), 2, versions={"executorch": "1.6.0"})
    refused = _merge_cli(*map(str, folders), "--out", str(tmp_path / "merged"))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("merge: cannot merge a mix of versions: executorch 1.0.0 in ")
    assert "executorch 1.6.0 in " in refused.stderr and str(folders[1]) in refused.stderr
    assert not (tmp_path / "merged").exists()
    accepted = _merge_cli(*map(str, _write_shards(tmp_path / "same", make_records(), 2)), "--out", str(tmp_path / "ok"))
    assert accepted.returncode == 0, accepted.stderr
    lines = accepted.stdout.splitlines()
    assert (
        lines[1].startswith("SM8650: ")
        and lines[1].endswith("ok/SM8650/report.html")
        and lines[2].startswith("SM8750: ")
    )


def test_merge_refuses_overlapping_cases_and_shards_that_do_not_fit(tmp_path: Path):
    records = make_records()
    one, two = _write_shards(tmp_path, records, 2)
    write_run(typed(records), environments(), tmp_path / "plain", "whole", COLUMNS)
    cases = [
        ([one, one], "the shards given are 1/2, 1/2: shard 1/2 given twice"),
        ([one], "the shards given are 1/2: shard 2/2 missing; pass every shard's run folder once"),
        ([one, tmp_path / "plain" / "whole"], "is an unsharded run and the others are shards"),
    ]
    for folders, expected in cases:
        with pytest.raises(merging.MergeError, match=expected):
            merging.merge(folders, tmp_path / "out")
    with pytest.raises(merging.MergeError, match=r"^case \S+ is in both .* and .*: merge each shard once"):
        merging.merge([tmp_path / "plain" / "whole", tmp_path / "plain" / "whole"], tmp_path / "out")
    merging.merge([one, two], tmp_path / "out")
    with pytest.raises(merging.MergeError, match="is not empty: name a new folder"):
        merging.merge([one, two], tmp_path / "out")


@pytest.mark.child_python
def test_a_merged_report_gates_and_diffs_like_a_run(tmp_path: Path):
    records = make_records()
    clean = [r for r in records if r["verdict"] not in ("failed", "xpassed")]
    write_run(typed(clean), environments(), tmp_path / "base", "run0", COLUMNS)
    baseline = tmp_path / "base" / "run0"
    ok = _merge_cli(
        *map(str, _write_shards(tmp_path / "a", clean, 2)), "--out", str(tmp_path / "m1"), "--baseline", str(baseline)
    )
    assert ok.returncode == 0 and "no regressions" in ok.stdout, ok.stdout + ok.stderr
    assert json.loads((tmp_path / "m1" / "SM8650" / "gate.json").read_text())["ok"] is True
    regressed = [dict(r) for r in clean]
    victim = next(r for r in regressed if r["verdict"] == "passed" and r["check"] == "state")
    victim.update(verdict="failed", message="state differs from eager")
    bad = _merge_cli(
        *map(str, _write_shards(tmp_path / "b", regressed, 2)),
        "--out",
        str(tmp_path / "m2"),
        "--baseline",
        str(baseline),
    )
    assert (
        bad.returncode == 1 and f"regression: {victim['soc']} {victim['case_id']} state passed -> failed" in bad.stdout
    )
    gate = json.loads((tmp_path / "m2" / victim["soc"] / "gate.json").read_text())
    assert gate["ok"] is False and [c["case_id"] for c in gate["checks"]] == [victim["case_id"]]
    diff = subprocess.run(
        [sys.executable, "-m", "harness.report", "diff", str(baseline), str(tmp_path / "m2")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diff.returncode == 1 and diff.stdout.strip().endswith("[regression]")
    from harness.report.gate import load

    assert load(tmp_path / "m1") == load(baseline), "a merged folder is read as a baseline like a run folder"


# --- real runs: shards of a compile-only slice merge into the unsharded run ----------------------------------------------
def _suite(
    tmp_path: Path, name: str, cache: Path, *extra: str, workers: tuple[str, ...] = ("-n", "2")
) -> subprocess.CompletedProcess:
    return run_suite(
        *("-W", "ignore", *workers, "--emulate", "SM8650", "--dtype", "fp16", "-k", SLICE, "--compile-only"),
        *("--cache-dir", str(cache), "--report-dir", str(tmp_path / name), *extra),
        env={**os.environ, "COLUMNS": "300"},
    )


def _collected(run: subprocess.CompletedProcess) -> tuple[int, int]:
    """(collected, deselected) from `N/M tests collected (D deselected)`."""
    match = re.search(r"(\d+)/\d+ tests collected \((\d+) deselected\)", run.stdout)
    assert match, run.stdout[-2000:] + run.stderr[-2000:]
    return int(match[1]), int(match[2])


def _run_folder(reports: Path) -> Path:
    (folder,) = [p for p in reports.iterdir() if not p.is_symlink() and p.is_dir()]
    return folder


def _cases(reports: Path) -> set[str]:
    return {
        case["case_id"] for case in json.loads((reports / "latest" / "SM8650" / "report.json").read_text())["cases"]
    }


@pytest.mark.child_suite
def test_shards_of_a_slice_merge_into_the_unsharded_run(tmp_path: Path):
    cache = tmp_path / "cache"
    whole = _suite(tmp_path, "whole", cache)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    assert _cases(tmp_path / "whole") == CASES
    timings = str(tmp_path / "whole" / "latest")
    shards = [_suite(tmp_path, f"shard{i}", cache, "--shard", f"{i}/2", "--shard-timings", timings) for i in (1, 2)]
    for i, run in enumerate(shards, 1):
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert f"SM8650 (shard {i}/2): " in run.stdout, run.stdout[-2000:]
        report = json.loads((tmp_path / f"shard{i}" / "latest" / "SM8650" / "report.json").read_text())
        assert report["environment"]["shard"] == f"{i}/2"
    # pytest is told: the other shard's 12 tests are deselected on top of what -k deselects
    counts = [
        _collected(_suite(tmp_path, "collect", cache, *extra, "--collect-only", workers=("-n", "0")))
        for extra in ((), ("--shard", "2/2"))
    ]
    assert counts[0][0] == 24 and counts[1][0] == 12 and counts[1][1] - counts[0][1] == 12, counts
    one, two = _cases(tmp_path / "shard1"), _cases(tmp_path / "shard2")
    assert one and two and not one & two and one | two == CASES
    merged = _merge_cli(
        str(_run_folder(tmp_path / "shard1")), str(_run_folder(tmp_path / "shard2")), "--out", str(tmp_path / "merged")
    )
    assert merged.returncode == 0, merged.stderr
    diff = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.report",
            "diff",
            str(_run_folder(tmp_path / "whole")),
            str(tmp_path / "merged"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diff.returncode == 0 and diff.stdout == "" and diff.stderr == "", diff.stdout + diff.stderr
    whole_doc = json.loads((tmp_path / "whole" / "latest" / "SM8650" / "report.json").read_text())
    merged_doc = json.loads((tmp_path / "merged" / "SM8650" / "report.json").read_text())
    assert merged_doc["summary"] == whole_doc["summary"] and merged_doc["checks"] == whole_doc["checks"]
    gated = _suite(tmp_path, "gated", cache, "--baseline", str(tmp_path / "merged"))  # the merge as the next baseline
    said = f"gate against {tmp_path / 'merged'} (baseline: run id "  # the merge's: its parts' run id
    assert gated.returncode == 0 and said in gated.stdout and "no regressions" in gated.stdout, gated.stdout[-2000:]


# --- the merged run's id, its links, and a narrowed run's gate ----------------------------------------------------
@pytest.mark.child_python
def test_a_merge_keeps_its_parts_run_id_or_takes_one_and_links_its_own_findings(tmp_path: Path):
    """The run id is the parts' (never the --out folder's name, which a CI job reuses every night), and the
    pages link the merged folder's own FINDINGS.md (or --docs-url), never this machine's checkout."""
    records = make_records()
    for record in records:
        if record["known_failure"]:
            record["known_failure"] = "known failure [x]: a defect (docs/FINDINGS.md#F1; executorch x.cpp)"
    folders = _write_shards(tmp_path, records, 2)
    merging.merge(folders, tmp_path / "merged")
    document = json.loads((tmp_path / "merged" / "SM8650" / "report.json").read_text())
    assert document["run_id"] == document["environment"]["run_id"] == "shard1"
    copy = tmp_path / "merged" / "FINDINGS.md"
    assert copy.read_text() == (REPO_ROOT / "docs" / "FINDINGS.md").read_text()
    for view in ("report.html", "summary.md"):
        text = (tmp_path / "merged" / "SM8650" / view).read_text()
        assert "../FINDINGS.md#F" in text and str(REPO_ROOT) not in text, view
    named = _merge_cli(
        *map(str, folders),
        "--out",
        str(tmp_path / "m2"),
        "--run-id",
        "night-2026-12-06",
        "--docs-url",
        "https://x.org/d",
    )
    assert named.returncode == 0, named.stderr
    assert json.loads((tmp_path / "m2" / "SM8650" / "report.json").read_text())["run_id"] == "night-2026-12-06"
    assert "https://x.org/d/FINDINGS.md#F" in (tmp_path / "m2" / "SM8650" / "report.html").read_text()
    assert not (tmp_path / "m2" / "FINDINGS.md").exists()
    for option, value, words in (
        ("--run-id", "../elsewhere", "--run-id '../elsewhere': use letters"),
        ("--docs-url", "javascript:alert(1)", "--docs-url 'javascript:alert(1)' is not an http(s) URL"),
    ):
        bad = _merge_cli(*map(str, folders), "--out", str(tmp_path / f"bad{option}"), option, value)
        assert bad.returncode == 2 and words in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


@pytest.mark.child_python
def test_a_narrowed_run_is_gated_on_what_it_selected_and_gate_json_stays_small(tmp_path: Path):
    """A one-case run against the whole matrix: with its selection recorded (-k), the rest of the baseline
    is counted as left out and the gate passes; without it, the missing checks fail the gate, the first
    line names --allow-missing, and gate.json counts them instead of listing them all."""
    records = [r for r in make_records() if r["verdict"] not in ("failed", "xpassed")]
    write_run(typed(records), environments(), tmp_path / "base", "run0", COLUMNS)
    case_id = next(r["case_id"] for r in records if r["soc"] == "SM8650")
    small = [r for r in records if r["case_id"] == case_id]
    selected = {"SM8650": {**environments()["SM8650"], "selection": "-k x", "selection_partial": "-k x"}}
    write_run(typed(small), selected, tmp_path / "narrowed", "run1", COLUMNS)
    write_run(typed(small), environments(), tmp_path / "unsaid", "run1", COLUMNS)
    baseline = str(tmp_path / "base" / "run0")
    ok = _merge_cli(str(tmp_path / "narrowed" / "run1"), "--out", str(tmp_path / "m1"), "--baseline", baseline)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    gate = json.loads((tmp_path / "m1" / "SM8650" / "gate.json").read_text())
    assert gate["ok"] and gate["missing"] == 0 and gate["excluded"] == len(records) - len(small)
    assert gate["baseline"] == {"night": "", "run_id": "run0", "executorch": environments()["SM8650"]["executorch"]}
    assert f"{len(records) - len(small)} baseline check(s) outside this run's selection (-k x)" in ok.stdout
    assert "baseline: run id run0, executorch" in (tmp_path / "m1" / "SM8650" / "summary.md").read_text()
    assert "baseline: run id run0, executorch" in (tmp_path / "m1" / "SM8650" / "report.html").read_text()
    failed = _merge_cli(str(tmp_path / "unsaid" / "run1"), "--out", str(tmp_path / "m2"), "--baseline", baseline)
    assert failed.returncode == 1
    missing = len(records) - len(small)
    hint = f"{missing} check(s) of the baseline are missing: if this run left them out on purpose, gate it with --allow-missing"
    lines = failed.stdout.splitlines()
    assert lines[next(i for i, line in enumerate(lines) if line.startswith("gate against")) + 1].strip() == hint
    path = tmp_path / "m2" / "SM8650" / "gate.json"  # the run has no SM8750: its missing checks are counted above
    gate = json.loads(path.read_text())
    assert gate["missing"] == len([r for r in records if r["soc"] == "SM8650"]) - len(small)
    assert len(gate["checks"]) <= 20 and gate["missing_not_listed"] == gate["missing"] - len(gate["checks"])
    assert path.stat().st_size < 10_000
