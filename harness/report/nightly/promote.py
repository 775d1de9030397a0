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

import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import filelock

from harness.files import read_regular, say
from harness.report.gate import BaselineError, read_documents
from harness.repro.layout import REPRO_DIR as REPRO
from harness.user_state import UnsafeStateDir, ancestry_problem, folder_problem, seal, sealed_by, user_key

MARKER = "nightly-store.json"  # what makes a folder a store (and not any folder that holds runs)
# NNNNNN-YYYY-MM-DD-<run id> (the date the run started); stores made before dates were added: NNNNNN-<run id>
NIGHT = re.compile(r"^([0-9]{6})-(?:([0-9]{4}-[0-9]{2}-[0-9]{2})-)?([A-Za-z0-9][A-Za-z0-9_.-]{0,120})$")
NIGHT_FILE = "night.json"  # inside each night: which run it was, its gate, when it was promoted, its files
SEAL_FILE = "night.hmac"  # HMAC of night.json under this user's store key: this user's promote wrote the night
STORE_KEY = "store-hmac.key"  # in the user's private state folder (harness/user_state.py)
STORE_KEY_ENV = "QNNSUITE_STORE_KEY"  # a secret shared by the hosts a store travels between (CI jobs)
GATE_FILE = "gate.json"
VIEWS = ("report.json", "junit.xml", "summary.md", "report.html")  # what a finished run wrote per SoC
STAGING, PRUNING = ".promoting-", ".pruning-"
DEFAULT_KEEP = 30
PASSED, FAILED, NOT_GATED = "passed", "failed", "not gated"
ACCEPTED = (PASSED, NOT_GATED)  # a night --baseline STORE may mean: its gate passed, or it had none (the first)
MAX_SMALL_FILE = 64 << 20  # night.json, gate.json: read bounded
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PromoteError(ValueError):
    """A run that cannot be promoted, or a folder that is not a store; the message is one line."""


@dataclass(frozen=True)
class Night:
    index: int
    run_id: str
    folder: Path
    date: str = ""  # the day the run started (YYYY-MM-DD), "" for a night named before dates


def is_store(folder: Path) -> bool:
    return folder.is_dir() and not folder.is_symlink() and (folder / MARKER).is_file()


def store_problem(store: Path) -> str:
    """Why another account could change what the store says ("" when none could): the store must be this
    user's folder that nobody else may write, in folders nobody else may swap, as the artifact cache is
    (harness/options.py trusted_cache_dir)."""
    try:
        problem = folder_problem(os.lstat(store), forbidden_mode=0o022, mode_words="writable by others")
        return problem or ancestry_problem(store.absolute().parent.resolve() / store.name)
    except OSError as error:
        return f"cannot be read ({error.strerror})"


def check_store(store: Path, what: str) -> None:
    """BaselineError naming the fix when store_problem finds one."""
    problem = store_problem(store)
    if problem:
        raise BaselineError(
            f"{what} {store} {problem}: a store another account can write could hold nights it forged; "
            f"keep the store in a folder of your own (chmod go-w, owned by uid {os.getuid()})"
        )


def nights(store: Path) -> list[Night]:
    """The store's nights, oldest first: folders named NNNNNN-[date-]<run id>, links and other names ignored."""
    found = []
    for entry in store.iterdir() if store.is_dir() else ():
        match = NIGHT.match(entry.name)
        if match and stat.S_ISDIR(entry.lstat().st_mode):
            found.append(Night(int(match.group(1)), match.group(3), entry, match.group(2) or ""))
    return sorted(found, key=lambda night: night.index)


def _store_key() -> bytes:
    """The key that seals nights: the user's own (made once in the 0700 state folder), or, where a store
    travels between hosts (a CI artifact), a secret all of them share in QNNSUITE_STORE_KEY."""
    shared = os.environ.get(STORE_KEY_ENV, "")
    return hashlib.sha256(shared.encode()).digest() if shared else user_key(STORE_KEY)


def _read_small(folder: Path, name: str) -> bytes:
    """A small regular file of a night, never through a link (OSError or ValueError when it is not one)."""
    try:
        return read_regular(folder / name, MAX_SMALL_FILE)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def night_record(night: Night) -> dict | None:
    """The night's night.json when this user's promote wrote it and its reports are the ones it copied
    (sealed, and each report.json's sha256 as recorded), else None: a night planted or edited in the store
    is never a baseline, and history names it instead of reading it."""
    try:
        data = _read_small(night.folder, NIGHT_FILE)
        mark = _read_small(night.folder, SEAL_FILE).decode("ascii").strip()
        if not sealed_by(data, mark, _store_key()):
            return None
        record = json.loads(data)
        files = record["files"]
        reports = {str(p.relative_to(night.folder)) for p in night.folder.rglob("report.json")}
        if not reports or any(name not in files for name in reports):
            return None
        for name in reports:
            if hashlib.sha256(_read_small(night.folder, name)).hexdigest() != files[name]:
                return None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, UnsafeStateDir):
        return None
    return record if isinstance(record, dict) else None


def gate_of(record: dict | None) -> str:
    """The night's gate verdict as promote recorded it: passed, failed or not gated."""
    gate = (record or {}).get("gate")
    verdict = gate.get("verdict") if isinstance(gate, dict) else None
    return verdict if verdict in (PASSED, FAILED, NOT_GATED) else NOT_GATED


def baseline_path(path: Path) -> Path:
    """What `--baseline path` reads: when path is a store, its newest night that this user's promote wrote
    and whose gate passed (or that had none: the store's first night); else path itself. A night skipped
    for its failed gate or for no seal is said on stderr; to gate against another night, pass its folder."""
    if not is_store(path):
        return path
    check_store(path, "--baseline")
    stored = nights(path)
    if not stored:
        raise BaselineError(f"{path} is a nightly store with no night yet: promote a run first, or pass a run folder")
    skipped: list[str] = []
    for night in reversed(stored):
        record = night_record(night)
        if record is None:
            skipped.append(f"{night.folder.name} (not sealed by this user's promote)")
        elif gate_of(record) not in ACCEPTED:
            skipped.append(f"{night.folder.name} (its gate failed)")
        else:
            if skipped:
                say(f"qnnsuite: baseline {night.folder}: skipped newer night(s) {', '.join(skipped)}")
            return night.folder
    raise BaselineError(
        f"{path} has no night whose gate passed and that this user's promote sealed (skipped: "
        f"{', '.join(skipped)}): promote a run that passed, or pass a run folder; a store shared between "
        f"hosts needs the same {STORE_KEY_ENV} on each"
    )


def identity(path: Path, documents: list[dict]) -> dict[str, str]:
    """How a gate names its baseline: the night (when path is a night of a store), the run id, executorch."""
    night = path.name if NIGHT.match(path.name) and is_store(path.parent) else ""
    run_ids = sorted({str(document["run_id"]) for document in documents})
    versions = sorted({str(document["environment"].get("executorch")) for document in documents})
    return {"night": night, "run_id": ", ".join(run_ids), "executorch": ", ".join(versions)}


def _safe_name(run_id: str) -> str:
    """A report's run id as part of a folder name (the schema leaves run_id free text)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:120]
    return name if name[:1].isalnum() else f"run{name}"[:120]


def _checked(run: Path) -> tuple[str, list[tuple[Path, dict]]]:
    """The run's id and documents when every SoC of it has its report.json (valid) and the views written
    after it; else PromoteError naming what is missing."""
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
    return run_ids.pop(), documents


def check_complete(run: Path) -> str:
    """The run's id when it can be promoted (see _checked)."""
    return _checked(run)[0]


def _mode(path: Path) -> int:
    try:
        return path.lstat().st_mode
    except OSError:
        return 0


def _run_date(documents: list[tuple[Path, dict]]) -> str:
    """The day the run started (its reports' `started`), else today: the date in the night's name."""
    for _, document in documents:
        started = str(document["environment"].get("started") or "")
        if re.match(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}", started):
            return started[:10]
    return datetime.now(UTC).strftime("%Y-%m-%d")


def _gate(run: Path, documents: list[tuple[Path, dict]]) -> dict:
    """What the run's gate said (each SoC's gate.json, written by merge --baseline or pytest --baseline):
    passed when every SoC's passed, failed when one failed, not gated without any; and its baseline."""
    verdicts, baseline = [], None
    for file, _ in documents:
        try:
            gate = json.loads(_read_small(file.parent, GATE_FILE))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as error:
            raise PromoteError(
                f"{file.parent / GATE_FILE} cannot be read ({error}): promote a run its gate wrote"
            ) from None
        verdicts.append(bool(gate.get("ok")) if isinstance(gate, dict) else False)
        if isinstance(gate, dict) and isinstance(gate.get("baseline"), dict):
            baseline = {k: str(v)[:200] for k, v in gate["baseline"].items()}
    verdict = NOT_GATED if not verdicts else PASSED if all(verdicts) else FAILED
    return {"verdict": verdict, "baseline": baseline}


def _copy_file(entry: os.DirEntry, target: int, files: dict[str, str], name: str) -> None:
    """One regular file of the run into the folder open as `target`, never through a link; its sha256 noted."""
    source = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        info = os.fstat(source)
        mode = stat.S_IMODE(info.st_mode) & 0o755
        written = os.open(
            entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=target
        )
        digest = hashlib.sha256()
        try:
            while chunk := os.read(source, 1 << 20):
                digest.update(chunk)
                os.write(written, chunk)
            os.fchmod(written, mode)
        finally:
            os.close(written)
        files[name] = digest.hexdigest()
    finally:
        os.close(source)


def _copy_tree(source: Path, target: int, bundles: bool, files: dict[str, str], prefix: str = "") -> None:
    """Directories and regular files of the run into the folder open as `target` (a directory handle: a
    folder swapped for a link meanwhile cannot redirect a write); a link or a special file is skipped and
    named, so a night never links to, nor copies, a file outside the run. bundles=False leaves out each
    SoC's repro/ (most of a run's bytes; history reads only the reports)."""
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        info = entry.stat(follow_symlinks=False)
        name = f"{prefix}{entry.name}"
        if stat.S_ISDIR(info.st_mode):
            if not bundles and prefix.count("/") == 1 and entry.name == REPRO:
                continue
            os.mkdir(entry.name, 0o755, dir_fd=target)
            inner = os.open(entry.name, DIRECTORY, dir_fd=target)
            try:
                _copy_tree(Path(entry.path), inner, bundles, files, f"{name}/")
            finally:
                os.close(inner)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(entry, target, files, name)
        else:
            print(f"promote: skipped {entry.path}: not a regular file (a link or a special file)", file=sys.stderr)


def _write_in(folder: int, name: str, data: bytes) -> None:
    """A new file in the folder open as `folder` (never through a link), written whole then renamed."""
    temporary = f".{name}.{secrets.token_hex(4)}"
    descriptor = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
    )
    try:
        os.write(descriptor, data)
    finally:
        os.close(descriptor)
    os.rename(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)


@contextmanager
def _opened(path: Path, at: int | None = None) -> Iterator[int]:
    descriptor = os.open(path, DIRECTORY, dir_fd=at)
    try:
        yield descriptor
    finally:
        os.close(descriptor)


def _discard(name: str, store: int) -> None:
    """Remove a folder of the store: renamed aside first, so it leaves the night list in one step."""
    aside = f"{PRUNING}{secrets.token_hex(6)}"
    os.rename(name, aside, src_dir_fd=store, dst_dir_fd=store)
    shutil.rmtree(aside, dir_fd=store)


def _prepare_store(store: Path, source: Path, run: Path) -> None:
    """The store made (0755) or checked: a store, or a new or empty folder, this user's and nobody else's."""
    if store.exists() and not is_store(store):
        if store.is_symlink() or not store.is_dir() or any(store.iterdir()):
            raise PromoteError(
                f"{store} is not a nightly store (no {MARKER}) and not empty: pass a new or empty folder"
            )
    if store.resolve().is_relative_to(source):
        raise PromoteError(f"{store} is inside the run {run}: pass a folder outside it")
    store.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        check_store(store, "--to")
    except BaselineError as error:
        raise PromoteError(str(error)) from None


def _stage(source: Path, store: int, run_id: str, documents: list, bundles: bool) -> str:
    """The run copied into a new hidden folder of the store, with its night.json and seal; its name."""
    staging = f"{STAGING}{secrets.token_hex(6)}"
    os.mkdir(staging, 0o700, dir_fd=store)
    try:
        with _opened(Path(staging), store) as folder:
            files: dict[str, str] = {}
            _copy_tree(source, folder, bundles, files)
            about = {
                "run_id": run_id,
                "date": _run_date(documents),
                "promoted": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S+0000"),
                "source": str(source),
                "gate": _gate(source, documents),
                "files": files,
            }
            data = (json.dumps(about, indent=1) + "\n").encode()
            _write_in(folder, NIGHT_FILE, data)
            _write_in(folder, SEAL_FILE, (seal(data, _store_key()) + "\n").encode())
            os.fchmod(folder, 0o755)  # 0700 would hide the night from the CI user that publishes it
            if not os.path.samestat(os.fstat(folder), os.stat(staging, dir_fd=store, follow_symlinks=False)):
                raise PromoteError(
                    f"the staging folder {staging} was replaced while the run was copied into it: nothing "
                    "promoted (the copy went into the folder promote made, not through the replacement); "
                    "check who else can write the store"
                )
    except BaseException:
        shutil.rmtree(staging, dir_fd=store, ignore_errors=True)
        raise
    return staging


def promote(run: Path, store: Path, keep: int = DEFAULT_KEEP, bundles: bool = True) -> Path:
    """Copy a finished run into the store as its newest night (with the verdict of its gate, passing or
    not) and keep the newest `keep` nights; returns the night's folder. One promotion at a time per store (a
    lock file in it). bundles=False: without the reproduction bundles. Every write goes through a handle
    of the store's folder, checked first to be this user's alone."""
    if keep < 1:
        raise PromoteError(f"--keep {keep}: keep at least 1 night")
    run_id, documents = _checked(run)
    source = run.resolve()
    _prepare_store(store, source, run)
    with filelock.FileLock(store / ".promote.lock", timeout=600), _opened(store) as handle:
        if not stat.S_ISREG(_mode(store / MARKER)):
            _write_in(handle, MARKER, (json.dumps({"kind": "qnnsuite nightly store", "version": 1}) + "\n").encode())
        for leftover in os.listdir(handle):  # a promotion killed half way (we hold the lock), or a planted link
            if leftover.startswith((STAGING, PRUNING)):
                if stat.S_ISLNK(os.stat(leftover, dir_fd=handle, follow_symlinks=False).st_mode):
                    os.unlink(leftover, dir_fd=handle)
                else:
                    shutil.rmtree(leftover, dir_fd=handle, ignore_errors=True)
        stored = nights(store)
        if stored and stored[-1].run_id == _safe_name(run_id):
            raise PromoteError(f"{run_id} is already the newest night ({stored[-1].folder.name}): nothing to promote")
        staging = _stage(source, handle, run_id, documents, bundles)
        name = f"{(stored[-1].index + 1 if stored else 1):06d}-{_run_date(documents)}-{_safe_name(run_id)}"
        os.rename(staging, name, src_dir_fd=handle, dst_dir_fd=handle)
        for old in nights(store)[:-keep]:
            _discard(old.folder.name, handle)
    return store / name
