"""A run killed outright leaves a record; the next run kills what is still the recorded processes (pid and
start time, never a name), removes the killed run's work folder, and leaves live runs and reused pids be."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from harness import run_records


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()
    return finished.pid


def _write(folder: Path, run_id: str, controller: list, work_dir: Path, processes: list) -> Path:
    path = folder / f"{run_id}.json"
    path.write_text(
        json.dumps({"run_id": run_id, "controller": controller, "work_dir": str(work_dir), "processes": processes})
    )
    return path


def test_a_killed_runs_processes_and_folder_are_removed(tmp_path):
    records = tmp_path / "runs"
    records.mkdir()
    work_dir = tmp_path / "qnnsuite-killed-run-abc"
    (work_dir / "emulator").mkdir(parents=True)
    leftover = subprocess.Popen(["sleep", "120"])
    reused = subprocess.Popen(["sleep", "120"])  # a live process whose pid a record names with another start time
    try:
        _write(
            records,
            "killed",
            [_dead_pid(), 12345],
            work_dir,
            [[leftover.pid, run_records.start_time(leftover.pid)], [reused.pid, 1]],
        )
        live = run_records.record("live", tmp_path / "qnnsuite-live", (), records)  # this process: still running
        lines = run_records.clean_up_after_killed_runs(records)
        assert lines == [
            f"qnnsuite: cleaned up after run killed, which was killed: 1 process(es) stopped, {work_dir} removed"
        ]
        assert leftover.wait(timeout=10) == -9, "the recorded process, still itself, was killed"
        assert reused.poll() is None, "a pid recorded with another start time is someone else's now"
        assert not work_dir.exists() and not (records / "killed.json").exists()
        assert live.exists(), "a run whose controller is alive is left alone"
    finally:
        for process in (leftover, reused):
            process.kill()
            process.wait()


def test_a_clean_stop_forgets_its_record(tmp_path):
    path = run_records.record("run1", tmp_path / "qnnsuite-run1", (), tmp_path)
    assert json.loads(path.read_text())["controller"][1] == run_records.start_time(__import__("os").getpid())
    run_records.forget("run1", tmp_path)
    assert not path.exists()


def test_a_killed_run_on_phones_leaves_a_list_of_device_folders_ticked_off_one_by_one(tmp_path):
    records = tmp_path / "runs"
    records.mkdir()
    path = _write(records, "20261201-101010-4242", [_dead_pid(), 12345], tmp_path / "qnnsuite-x", [])
    path.write_text(json.dumps({**json.loads(path.read_text()), "devices": ["PHONE1", "PHONE2"]}))
    run_records.clean_up_after_killed_runs(records)
    assert run_records.leftover_folders({"PHONE2", "OTHER"}, records) == [("20261201-101010-4242", "PHONE2")]
    run_records.leftover_removed("20261201-101010-4242", "PHONE2", records)
    assert run_records.leftover_folders({"PHONE1", "PHONE2"}, records) == [("20261201-101010-4242", "PHONE1")]
    run_records.leftover_removed("20261201-101010-4242", "PHONE1", records)
    assert list((tmp_path / run_records.LEFTOVERS).iterdir()) == []


def test_a_leftover_list_naming_a_path_is_dropped_not_followed(tmp_path):
    """Its run id becomes a folder that is removed on the phone: `..` or a slash must never get there."""
    records = tmp_path / "runs"
    records.mkdir()
    leftovers = tmp_path / run_records.LEFTOVERS
    leftovers.mkdir()
    (leftovers / "evil.json").write_text(json.dumps({"run_id": "../..", "devices": ["PHONE1"]}))
    assert run_records.leftover_folders({"PHONE1"}, records) == []
    assert not (leftovers / "evil.json").exists()


def test_a_torn_record_is_one_line_and_treated_as_missing(tmp_path, capsys):
    """A record half written (a disk full under an older suite, a crash) must not stop the next run, nor
    the clean-up of the others."""
    records = tmp_path / "runs"
    records.mkdir()
    (records / "torn.json").write_text('{"run_id": "torn", "contr')
    (records / "odd.json").write_text('{"run_id": "odd", "controller": "not a pair"}')
    work_dir = tmp_path / "qnnsuite-killed"
    work_dir.mkdir()
    _write(records, "killed", [_dead_pid(), 12345], work_dir, [])
    lines = run_records.clean_up_after_killed_runs(records)
    assert lines == [
        f"qnnsuite: cleaned up after run killed, which was killed: 0 process(es) stopped, {work_dir} removed"
    ]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all("treated as missing" in line for line in said), said
    assert any(
        line.startswith(f"qnnsuite: run record {records / 'torn.json'} is unreadable (JSONDecodeError: ")
        for line in said
    )
    assert list(records.iterdir()) == []


def test_a_torn_leftover_list_is_one_line_and_dropped(tmp_path, capsys):
    records = tmp_path / "runs"
    records.mkdir()
    leftovers = tmp_path / run_records.LEFTOVERS
    leftovers.mkdir()
    (leftovers / "torn.json").write_bytes(b"\xff\xfe{")
    (leftovers / "good-1.json").write_text(json.dumps({"run_id": "good-1", "devices": ["PHONE1"]}))
    assert run_records.leftover_folders({"PHONE1"}, records) == [("good-1", "PHONE1")]
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith(f"qnnsuite: leftover list {leftovers / 'torn.json'} is unreadable (UnicodeDecodeError")
    assert not (leftovers / "torn.json").exists() and (leftovers / "good-1.json").exists()
