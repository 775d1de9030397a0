"""promote: a finished run becomes the store's newest night in one rename, N nights are kept, an
unfinished or malformed run is refused in one line, and `--baseline`/`diff` given the store read its
newest night. The runs come from the history test's fixture (the suite's own report writer)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil

import pytest

from harness.report.gate import BaselineError
from harness.report.nightly import history, promote
from harness.tests.report.test_history import _cli, _run


@pytest.mark.child_python
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


@pytest.mark.child_python
def test_promoting_the_newest_night_again_is_refused(tmp_path):
    run = _run(tmp_path / "reports", 1)
    assert _cli("promote", run, "--to", tmp_path / "store").returncode == 0
    completed = _cli("promote", run, "--to", tmp_path / "store")
    assert completed.returncode == 2 and "already the newest night" in completed.stderr


@pytest.mark.child_python
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


@pytest.mark.child_python
def test_a_folder_that_is_not_a_store_is_never_filled(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    completed = _cli("promote", _run(tmp_path / "reports", 1), "--to", other)
    assert completed.returncode == 2 and "is not a nightly store" in completed.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


@pytest.mark.child_python
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


@pytest.mark.child_python
def test_an_empty_store_as_baseline_is_one_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / promote.MARKER).write_text("{}")
    with pytest.raises(BaselineError, match="no night yet"):
        promote.baseline_path(store)
    completed = _cli("diff", store, _run(tmp_path / "reports", 1))
    assert completed.returncode == 2 and "no night yet" in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.child_python
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


@pytest.mark.child_python
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


# --- the store is this user's: another account's store, a forged night, a swapped staging folder -------------
NOBODY = 65534


def _merge_gate(tmp_path, store):
    """`merge --baseline STORE` of a fresh run: what the nightly gate does with the store."""
    return _cli("merge", _run(tmp_path / "next", 3), "--out", tmp_path / "merged", "--baseline", store)


@pytest.mark.child_python
def test_a_store_another_account_owns_or_may_write_is_refused(tmp_path):
    """Attack: a store (or a folder above it) that another account controls could hold nights it forged, or
    swap a folder during a promotion; promote, the gate and history refuse it in one line."""
    store = tmp_path / "shared" / "nightly"
    assert _cli("promote", _run(tmp_path / "reports", 1), "--to", store).returncode == 0
    for mode, words in ((0o777, "has mode 777 (writable by others)"), (0o775, "has mode 775 (writable by others)")):
        store.chmod(mode)
        for completed in (
            _cli("promote", _run(tmp_path / "reports", 2), "--to", store),
            _merge_gate(tmp_path, store),
            _cli("history", store),
        ):
            assert completed.returncode == 2 and words in completed.stderr, completed.stderr
            assert completed.stderr.strip().count("\n") == 0 and "Traceback" not in completed.stderr
    store.chmod(0o755)
    store.parent.chmod(0o777)  # a parent others may write: they could rename the store away and plant theirs
    completed = _cli("promote", _run(tmp_path / "reports", 2), "--to", store)
    assert completed.returncode == 2 and f"its parent {store.parent} has mode 777" in completed.stderr
    store.parent.chmod(0o1777)  # sticky like /tmp: nobody renames another's entry
    assert _cli("promote", _run(tmp_path / "reports", 2), "--to", store).returncode == 0
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    os.chown(store, NOBODY, NOBODY)
    for completed in (
        _cli("promote", _run(tmp_path / "reports", 3), "--to", store),
        _merge_gate(tmp_path, store),
        _cli("history", store),
    ):
        assert completed.returncode == 2 and f"belongs to uid {NOBODY}" in completed.stderr, completed.stderr
    assert len(promote.nights(store)) == 2


@pytest.mark.child_python
def test_a_forged_night_is_not_accepted_as_baseline(tmp_path, capfd):
    """Attack: a night added to the store by hand (its reports edited to hide a regression, or sealed with
    another key) is newer than the real one; the gate skips it and history does not read it."""
    store = tmp_path / "nightly"
    assert _cli("promote", _run(tmp_path / "reports", 2), "--to", store).returncode == 0
    (real,) = promote.nights(store)
    edited = store / "000002-2026-12-03-forged"
    shutil.copytree(real.folder, edited)  # night.json and its seal are genuine, the reports are not
    report = edited / "SM8650" / "report.json"
    report.write_text(report.read_text().replace('"failed"', '"passed"'))
    other_key = store / "000003-2026-12-04-otherkey"
    shutil.copytree(real.folder, other_key)
    data = (other_key / promote.NIGHT_FILE).read_bytes()
    (other_key / promote.SEAL_FILE).write_text(hmac.new(b"another key" * 3, data, hashlib.sha256).hexdigest())
    capfd.readouterr()
    assert promote.baseline_path(store) == real.folder
    err = capfd.readouterr().err
    assert f"{other_key.name} (not sealed by this user's promote)" in err and edited.name in err
    assert promote.night_record(real) is not None
    assert [promote.night_record(n) for n in promote.nights(store)[1:]] == [None, None]
    document = history.build(history.read_store(store))
    assert [n["problem"] for n in document["nights"]] == ["", history.NOT_SEALED, history.NOT_SEALED]
    (unsealed := store / "000004-2026-12-05-unsealed").mkdir()
    shutil.copytree(real.folder / "SM8650", unsealed / "SM8650")  # no night.json, no seal at all
    assert promote.baseline_path(store) == real.folder
    for night in promote.nights(store)[1:]:
        shutil.rmtree(night.folder)
    (real.folder / promote.SEAL_FILE).unlink()
    with pytest.raises(BaselineError, match="no night whose gate passed and that this user's promote sealed"):
        promote.baseline_path(store)


def test_a_swapped_staging_folder_does_not_redirect_the_copy(tmp_path, monkeypatch):
    """Attack: the staging folder is replaced by a link to a folder elsewhere while the run is copied; the
    copy goes on through the handle of the folder promote made, nothing lands where the link points, and
    the promotion stops in one line."""
    store, outside = tmp_path / "nightly", tmp_path / "outside"
    outside.mkdir()
    copy_file = promote._copy_file

    def swap_then_copy(entry, target, files, name):
        for staging in store.glob(f"{promote.STAGING}*"):
            if not staging.is_symlink():
                staging.rename(tmp_path / "aside")
                staging.symlink_to(outside, target_is_directory=True)
        copy_file(entry, target, files, name)

    monkeypatch.setattr(promote, "_copy_file", swap_then_copy)
    with pytest.raises(promote.PromoteError, match="was replaced while the run was copied"):
        promote.promote(_run(tmp_path / "reports", 1), store)
    assert not list(outside.iterdir()) and not promote.nights(store)
    assert (tmp_path / "aside" / "SM8650" / "report.json").is_file()  # where the writes went
    monkeypatch.setattr(promote, "_copy_file", copy_file)
    promote.promote(_run(tmp_path / "reports", 1), store)  # the next promotion clears the planted link away
    assert not [p for p in store.iterdir() if p.is_symlink()] and len(promote.nights(store)) == 1
