"""The nightly store: `python -m harness.report promote RUN --to DIR [--keep N]`, and which night a
`--baseline DIR` means.

`reports/latest` moves with every ad-hoc run, so it is a poor baseline for a nightly gate. A store is a
folder of promoted runs, one per night, each copied in whole before it appears (copied into a hidden
temporary folder inside the store, then renamed: a reader sees a night complete or not at all), named
`NNNNNN-<run id>` so the newest is the highest number whatever the run ids look like. Only a run whose
reports were all written is promoted: a run that stopped half way would become the next night's baseline.

A store's contents are data: night folders are recognised by name, never followed through a link, and
their reports are read through harness/report/intake.py like any other report file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import filelock

from harness.files import write_atomically
from harness.report.gate import BaselineError, read_documents
from harness.repro.layout import REPRO_DIR as REPRO

MARKER = "nightly-store.json"  # what makes a folder a store (and not any folder that holds runs)
NIGHT = re.compile(r"^([0-9]{6})-([A-Za-z0-9][A-Za-z0-9_.-]{0,120})$")
NIGHT_FILE = "night.json"  # inside each night: which run it was, from where, when it was promoted
VIEWS = ("report.json", "junit.xml", "summary.md", "report.html")  # what a finished run wrote per SoC
STAGING, PRUNING = ".promoting-", ".pruning-"
DEFAULT_KEEP = 30


class PromoteError(ValueError):
    """A run that cannot be promoted, or a folder that is not a store; the message is one line."""


@dataclass(frozen=True)
class Night:
    index: int
    run_id: str
    folder: Path


def is_store(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and (folder / MARKER).is_file()


def nights(store: Path) -> list[Night]:
    """The store's nights, oldest first: folders named NNNNNN-<run id>, links and other names ignored."""
    found = []
    for entry in store.iterdir() if store.is_dir() else ():
        match = NIGHT.match(entry.name)
        if match and stat.S_ISDIR(entry.lstat().st_mode):
            found.append(Night(int(match.group(1)), match.group(2), entry))
    return sorted(found, key=lambda night: night.index)


def baseline_path(path: Path) -> Path:
    """What `--baseline path` reads: the newest night when path is a store, else path itself."""
    if not is_store(path):
        return path
    stored = nights(path)
    if not stored:
        raise BaselineError(f"{path} is a nightly store with no night yet: promote a run first, or pass a run folder")
    return stored[-1].folder


def _safe_name(run_id: str) -> str:
    """A report's run id as part of a folder name (the schema leaves run_id free text)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:120]
    return name if name[:1].isalnum() else f"run{name}"[:120]


def check_complete(run: Path) -> str:
    """The run's id when every SoC of it has its report.json (valid) and the views written after it; else
    PromoteError naming what is missing."""
    if not run.is_dir():
        raise PromoteError(f"{run} is not a run folder: pass reports/<run> (a folder holding <SOC>/report.json)")
    run = run.resolve()  # reports/latest is the suite's own link to a run
    try:
        documents = read_documents(run)
    except BaselineError as error:
        raise PromoteError(f"{run} cannot be promoted: {error}") from None
    run_ids = {document["run_id"] for _, document in documents}
    if len(run_ids) > 1:
        raise PromoteError(f"{run} holds reports of {len(run_ids)} runs: promote one run folder")
    for file, document in documents:
        if file.parent.name != document["soc"] or file.parent.parent != run:
            raise PromoteError(f"{file} is not at <run>/{document['soc']}/report.json: promote the run folder itself")
        absent = [name for name in VIEWS if not stat.S_ISREG(_mode(file.parent / name))]
        if absent:
            raise PromoteError(
                f"{run}'s report is incomplete ({document['soc']} lacks {', '.join(absent)}: the run stopped "
                "before its reports were written): promote a run that finished"
            )
    return run_ids.pop()


def _mode(path: Path) -> int:
    try:
        return path.lstat().st_mode
    except OSError:
        return 0


def _copy_tree(source: Path, target: Path, bundles: bool = True) -> None:
    """Directories and regular files of the run; a link or a special file is skipped and named, so a
    night never links to, nor copies, a file outside the run. bundles=False leaves out each SoC's repro/
    (most of a run's bytes; history reads only the reports)."""
    for folder, directories, files in os.walk(source):  # os.walk does not descend into linked directories
        here = Path(folder)
        if not bundles and here != source and here.parent == source and REPRO in directories:
            directories.remove(REPRO)
        destination = target / here.relative_to(source)
        destination.mkdir(exist_ok=True)
        for name in [*directories, *files]:
            entry = here / name
            mode = entry.lstat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                print(f"promote: skipped {entry}: not a regular file (a link or a special file)", file=sys.stderr)
                continue
            shutil.copyfile(entry, destination / name, follow_symlinks=False)
            os.chmod(destination / name, stat.S_IMODE(mode) & 0o755)


def _discard(folder: Path, store: Path) -> None:
    """Remove a folder of the store: renamed aside first, so it leaves the night list in one step."""
    aside = Path(tempfile.mkdtemp(prefix=PRUNING, dir=store))
    os.replace(folder, aside / "night")
    shutil.rmtree(aside)


def promote(run: Path, store: Path, keep: int = DEFAULT_KEEP, bundles: bool = True) -> Path:
    """Copy a finished run into the store as its newest night and keep the newest `keep` nights; returns
    the night's folder. One promotion at a time per store (a lock file in it). bundles=False: without the
    reproduction bundles."""
    if keep < 1:
        raise PromoteError(f"--keep {keep}: keep at least 1 night")
    run_id = check_complete(run)
    source = run.resolve()
    if store.exists() and not is_store(store):
        if store.is_symlink() or not store.is_dir() or any(store.iterdir()):
            raise PromoteError(
                f"{store} is not a nightly store (no {MARKER}) and not empty: pass a new or empty folder"
            )
    if store.resolve().is_relative_to(source):
        raise PromoteError(f"{store} is inside the run {run}: pass a folder outside it")
    store.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(store / ".promote.lock", timeout=600):
        if not (store / MARKER).is_file():
            write_atomically(store / MARKER, json.dumps({"kind": "qnnsuite nightly store", "version": 1}) + "\n")
        for leftover in store.glob(f"{STAGING}*"):  # a promotion killed half way (we hold the lock)
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in store.glob(f"{PRUNING}*"):
            shutil.rmtree(leftover, ignore_errors=True)
        stored = nights(store)
        if stored and stored[-1].run_id == _safe_name(run_id):
            raise PromoteError(f"{run_id} is already the newest night ({stored[-1].folder.name}): nothing to promote")
        staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=store))
        try:
            _copy_tree(source, staging, bundles)
            about = {
                "run_id": run_id,
                "promoted": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+0000"),
                "source": str(source),
            }
            write_atomically(staging / NIGHT_FILE, json.dumps(about, indent=1) + "\n")
            os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide the night from the CI user that publishes it
            night = store / f"{(stored[-1].index + 1 if stored else 1):06d}-{_safe_name(run_id)}"
            os.rename(staging, night)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        for old in nights(store)[:-keep]:
            _discard(old.folder, store)
    return night
