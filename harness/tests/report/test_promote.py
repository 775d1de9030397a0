"""promote: a finished run becomes the store's newest night in one rename, N nights are kept, an
unfinished or malformed run is refused in one line, and `--baseline`/`diff` given the store read its
newest night. The runs come from the history test's fixture (the suite's own report writer)."""

from __future__ import annotations

import json
import os

import pytest

from harness.report import promote
from harness.report.gate import BaselineError
from harness.tests.report.test_history import _cli, _run


def test_promote_keeps_n_nights_and_the_newest_is_the_baseline(tmp_path):
    store = tmp_path / "nightly"
    for night in (1, 2, 3):
        completed = _cli("promote", _run(tmp_path / "reports", night), "--to", store, "--keep", "2")
        assert completed.returncode == 0, completed.stderr
    assert [n.folder.name for n in promote.nights(store)] == [
        "000002-2026-12-02-20261202-020000-2",
        "000003-2026-12-03-20261203-020000-3",
    ]
    assert not [p for p in store.iterdir() if p.name.startswith((promote.STAGING, promote.PRUNING))]
    newest = promote.baseline_path(store)
    assert newest.name == "000003-2026-12-03-20261203-020000-3"
    assert json.loads((newest / promote.NIGHT_FILE).read_text())["run_id"] == "20261203-020000-3"
    for soc in ("SM8650", "SM8750"):
        assert sorted(p.name for p in (newest / soc).iterdir()) == sorted(promote.VIEWS)
    # the store as diff's baseline means night 3: against run 3 nothing changed; against run 2 the check
    # that failed only on night 3 passes (night 2 as the baseline would show no change at all)
    assert _cli("diff", store, tmp_path / "reports" / "20261203-020000-3").returncode == 0
    completed = _cli("diff", store, tmp_path / "reports" / "20261202-020000-2")
    assert completed.returncode == 0 and "counter_add-fp16-delegate_mutbuf-SM8750 state failed -> passed" in (
        completed.stdout
    )
    assert promote.baseline_path(tmp_path / "reports") == tmp_path / "reports"  # not a store: as given


def test_promoting_the_newest_night_again_is_refused(tmp_path):
    run = _run(tmp_path / "reports", 1)
    assert _cli("promote", run, "--to", tmp_path / "store").returncode == 0
    completed = _cli("promote", run, "--to", tmp_path / "store")
    assert completed.returncode == 2 and "already the newest night" in completed.stderr


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda run: (run / "SM8750" / "report.html").unlink(), "report is incomplete (SM8750 lacks report.html"),
        (lambda run: (run / "SM8650" / "report.json").write_text('{"schema_version": 1}'), "not a valid report.json"),
        (lambda run: [p.unlink() for p in run.rglob("report.json")], "no report.json under"),
    ],
    ids=["views-missing", "malformed", "no-report"],
)
def test_an_unfinished_or_malformed_run_is_refused_in_one_line(tmp_path, damage, words):
    run = _run(tmp_path / "reports", 1)
    damage(run)
    completed = _cli("promote", run, "--to", tmp_path / "store")
    assert completed.returncode == 2, completed.stdout
    assert words in completed.stderr and completed.stderr.strip().count("\n") == 0, completed.stderr
    assert not promote.nights(tmp_path / "store")


def test_the_check_does_not_refuse_a_finished_run(tmp_path):
    assert promote.check_complete(_run(tmp_path / "reports", 1)) == "20261201-020000-1"


def test_a_folder_that_is_not_a_store_is_never_filled(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    completed = _cli("promote", _run(tmp_path / "reports", 1), "--to", other)
    assert completed.returncode == 2 and "is not a nightly store" in completed.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_store_contents_are_data_a_planted_link_is_neither_a_night_nor_copied(tmp_path):
    outside = _run(tmp_path / "elsewhere", 4)
    run = _run(tmp_path / "reports", 1)
    (run / "SM8650" / "repro").mkdir()
    os.symlink("/etc/passwd", run / "SM8650" / "repro" / "passwd")
    store = tmp_path / "store"
    assert _cli("promote", run, "--to", store).returncode == 0
    os.symlink(outside, store / "000009-planted")  # newer by number, but a link: not a night
    (newest,) = promote.nights(store)
    assert newest.folder.name == "000001-2026-12-01-20261201-020000-1" and promote.baseline_path(store) == newest.folder
    assert not (newest.folder / "SM8650" / "repro" / "passwd").exists()


def test_an_empty_store_as_baseline_is_one_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / promote.MARKER).write_text("{}")
    with pytest.raises(BaselineError, match="no night yet"):
        promote.baseline_path(store)
    completed = _cli("diff", store, _run(tmp_path / "reports", 1))
    assert completed.returncode == 2 and "no night yet" in completed.stderr and "Traceback" not in completed.stderr


def test_pytest_baseline_option_resolves_a_store(tmp_path, monkeypatch):
    from harness import options

    store = tmp_path / "store"
    assert _cli("promote", _run(tmp_path / "reports", 1), "--to", store).returncode == 0
    given = {
        "--baseline": str(store),
        "--known-failures": str(options.MANIFEST),
        "--report-dir": str(tmp_path / "out"),
        "--no-cache": True,
        "--dtype": [],
        "--device": [],
        "--models": [],
        "--perf-repeats": 1,
        "--perf-budget": 10.0,
        "--profile-level": "off",
    }

    class Config:  # what pytest.Config.getoption answers for a run given only --baseline
        def getoption(self, name):
            return given.get(name)

    seen = {}
    monkeypatch.setattr(options, "RunOptions", lambda **values: seen.update(values))
    for helper in ("_shard", "_adb_servers", "_socs"):  # device and shard options: not what this test is about
        monkeypatch.setattr(options, helper, lambda *args: ())
    options.parse(Config())
    assert seen["baseline"] == promote.nights(store)[-1].folder
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / promote.MARKER).write_text("{}")
    given["--baseline"] = str(empty)
    with pytest.raises(pytest.UsageError, match="no night yet"):
        options.parse(Config())


def test_no_bundles_leaves_out_only_the_bundles(tmp_path):
    run = _run(tmp_path / "reports", 1)
    (run / "SM8650" / "repro" / "case-a").mkdir(parents=True)
    (run / "SM8650" / "repro" / "case-a" / "case.json").write_text("{}")
    completed = _cli("promote", run, "--to", tmp_path / "store", "--no-bundles")
    assert completed.returncode == 0, completed.stderr
    (night,) = promote.nights(tmp_path / "store")
    assert not (night.folder / "SM8650" / "repro").exists()
    assert sorted(p.name for p in (night.folder / "SM8650").iterdir()) == sorted(promote.VIEWS)
    assert _cli("promote", _run(tmp_path / "reports", 2), "--to", tmp_path / "store").returncode == 0
