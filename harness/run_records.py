"""Records of the runs in progress, so that one killed outright (SIGKILL, a lost terminal) is cleaned up
by the next run of the same user.

Each controller writes `runs/<run id>.json` in the user's private state folder (harness/user_state.py):
its pid with the start time the kernel gives it, its host work folder, and what it started (pid and
start time each). A clean stop deletes the record. At start, a run reads the others: a record whose
controller is no longer that process (gone, or its pid reused by another start) is a killed run's; its
processes that are still the recorded ones are killed, its work folder is removed and its record deleted.
Processes are known by pid and start time, never by name.

A run on attached devices (phones) also records them (server/serial): a killed run leaves its folder on each
phone (`/data/local/tmp/qnnsuite/<run id>`, payload and programs). Its record then becomes a leftover
list (`leftovers/<run id>.json`), and each later run removes the folders on the phones it has
(harness/session.py), ticking them off until none is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

from harness.files import read_state, write_atomically
from harness.user_state import state_dir

RECORDS = "runs"
LEFTOVERS = "leftovers"
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _folder(folder: Path | None) -> Path:
    return folder if folder is not None else state_dir(RECORDS)


def record(
    run_id: str, work_dir: Path, pids: tuple[int, ...], folder: Path | None = None, devices: tuple[str, ...] = ()
) -> Path:
    """Write this run's record (called once its processes are started). devices: serials of attached
    devices that will hold the run's folder (emulated ones die with the run, and their storage with them)."""
    me = os.getpid()
    entry = {
        "run_id": run_id,
        "controller": [me, start_time(me)],
        "work_dir": str(work_dir),
        "processes": [[pid, start_time(pid)] for pid in pids],
        "devices": list(devices),
    }
    path = _folder(folder) / f"{run_id}.json"
    write_atomically(path, json.dumps(entry))
    return path


def forget(run_id: str, folder: Path | None = None) -> None:
    (_folder(folder) / f"{run_id}.json").unlink(missing_ok=True)


def clean_up_after_killed_runs(folder: Path | None = None) -> list[str]:
    """Remove what killed runs left; returns one line per run cleaned up."""
    lines = []
    for path in sorted(_folder(folder).glob("*.json")):
        entry = read_state(path, "run record", _checked_record)
        if entry is None:  # a torn record (one line said so): nothing in it can be trusted to kill by
            path.unlink(missing_ok=True)
            continue
        pid, started = entry["controller"]
        if start_time(pid) == started and started is not None:
            continue  # that run is still going
        killed = 0
        for process, process_started in entry.get("processes", []):
            if process_started is not None and start_time(process) == process_started:
                try:
                    os.kill(process, signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        work_dir = Path(entry.get("work_dir", ""))
        if work_dir.is_absolute() and work_dir.name.startswith("qnnsuite-"):
            shutil.rmtree(work_dir, ignore_errors=True)
        devices = [d for d in entry.get("devices", []) if isinstance(d, str)]
        run_id = str(entry.get("run_id", path.stem))
        if devices and SAFE_RUN_ID.fullmatch(run_id):
            write_atomically(
                _leftovers_folder(folder) / f"{run_id}.json", json.dumps({"run_id": run_id, "devices": devices})
            )
        path.unlink(missing_ok=True)
        lines.append(
            f"qnnsuite: cleaned up after run {entry.get('run_id', path.stem)}, which was killed: "
            f"{killed} process(es) stopped, {work_dir} removed"
        )
    return lines


def _leftovers_folder(folder: Path | None) -> Path:
    """Beside the records folder (tests pass their own records folder)."""
    if folder is None:
        return state_dir(LEFTOVERS)
    (folder.parent / LEFTOVERS).mkdir(mode=0o700, exist_ok=True)
    return folder.parent / LEFTOVERS


def leftover_folders(serials: set[str], folder: Path | None = None) -> list[tuple[str, str]]:
    """(killed run id, serial) for each folder a killed run left on one of these devices."""
    found = []
    for path in sorted(_leftovers_folder(folder).glob("*.json")):
        entry = read_state(path, "leftover list", _checked_leftovers)
        if entry is None:
            path.unlink(missing_ok=True)
            continue
        found += [(entry["run_id"], serial) for serial in entry["devices"] if serial in serials]
    return found


def _checked_record(entry: dict) -> dict:
    """A run record whose controller can be read (KeyError, TypeError, ValueError otherwise)."""
    pid, started = entry["controller"]
    if not isinstance(pid, int) or not isinstance(started, (int, type(None))):
        raise TypeError(f"controller {entry['controller']!r}")
    return entry


def _checked_leftovers(entry: dict) -> dict:
    run_id = str(entry["run_id"])
    if not SAFE_RUN_ID.fullmatch(run_id):  # it becomes a device path that is removed: one plain name only
        raise ValueError(f"run id {run_id!r}")
    if not isinstance(entry["devices"], list):
        raise TypeError("devices")
    return {"run_id": run_id, "devices": [serial for serial in entry["devices"] if isinstance(serial, str)]}


def leftover_removed(run_id: str, serial: str, folder: Path | None = None) -> None:
    """Tick one device off a killed run's leftovers; the list goes when no device is left on it."""
    path = _leftovers_folder(folder) / f"{run_id}.json"
    entry = read_state(path, "leftover list", _checked_leftovers)
    if entry is None:
        return
    remaining = [serial_ for serial_ in entry.get("devices", []) if serial_ != serial]
    if remaining:
        write_atomically(path, json.dumps({**entry, "devices": remaining}))
    else:
        path.unlink(missing_ok=True)
