"""File helpers shared across the harness (a leaf: nothing here imports the rest of the suite).

Also the one print that cannot fail: a diagnostic line is written where a terminal, a pytest capture file
or a pipe may be broken or on a full disk, and a line that cannot be shown must not become the error.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# The errors that mean "this folder cannot take the file" (full, read-only, not ours), as against a bug.
UNWRITABLE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# Less room than this where the reports go is a full disk before the run: a run's smallest report.json alone
# is larger, so such a run could only end in "reports not written".
REPORT_ROOM_BYTES = 64 * 1024

# What a fresh work folder must take before a run starts in it: sockets, keys, logs and the first programs.
WORK_FOLDER_ROOM = 1 << 20


class NoWorkFolder(RuntimeError):
    """The run's work folder cannot be made where it belongs; the message is one line naming the fix."""


def make_work_folder(prefix: str) -> Path:
    """A fresh 0700 folder for one run's work in $TMPDIR, else /tmp, and nowhere else, that takes
    WORK_FOLDER_ROOM bytes. tempfile's own choice falls back to /var/tmp or the current folder when /tmp is
    full, silently; a run must say so instead and stop (NoWorkFolder)."""
    base = Path(os.environ.get("TMPDIR") or "/tmp").absolute()
    folder = None
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        with open(folder / ".room", "wb") as probe:
            probe.write(bytes(WORK_FOLDER_ROOM))  # a full file system refuses it here (delayed allocation too)
        (folder / ".room").unlink()
    except OSError as error:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise NoWorkFolder(
            f"cannot make the run's work folder in {base} ({error.strerror or error}): free space there or set "
            f"TMPDIR to a folder of yours with room (the run never falls back to another folder)"
        ) from error
    return folder


def write_atomically(path: Path, text: str, encoding: str = "utf-8", errors: str = "strict") -> None:
    """Write via a temporary file and rename, so a reader in another process never sees half a file, and a
    run killed mid-write leaves the old file (or none), never a torn one."""
    write_bytes_atomically(path, text.encode(encoding, errors))


def write_bytes_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    try:
        temporary.write_bytes(data)
        temporary.replace(path)
    finally:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:  # a read-only folder: the write failed first, and that is the error to report
            pass


def say(line: str) -> None:
    """Print one diagnostic line on stderr; a stderr that cannot take it (closed, broken pipe, its capture
    file on a full disk) loses the line instead of raising where the line was meant to explain a failure."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # ValueError: a closed file
        pass


def read_state(path: Path, what: str, build: Callable[[Any], T]) -> T | None:
    """A JSON state file (a cache entry, a record) as build(its data); None when it is missing, and also when
    it is unreadable or torn (not text, not JSON, not what build takes: a run killed mid-write by an older
    suite, a full disk), with one line naming it: state is rebuilt, never the cause of a failed run."""
    try:
        return build(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError) as error:  # JSONDecodeError is a ValueError
        say(f"qnnsuite: {what} {path} is unreadable ({type(error).__name__}: {error}); treated as missing")
        return None


def unwritable(error: BaseException) -> bool:
    """Whether an error says that a folder cannot take a file (full, read-only, not ours), not a bug."""
    return isinstance(error, OSError) and error.errno in UNWRITABLE


def _existing(folder: Path) -> Path:
    """folder, or the nearest folder above it that exists (where it would be made)."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing


def no_room_reason(folder: Path) -> str | None:
    """None when folder's filesystem has room for a run's reports, else why not in a few words (a disk that
    is full before the run starts is found before anything runs, not at the first file written)."""
    existing = _existing(folder)
    try:
        room = os.statvfs(existing)
    except OSError as error:
        return f"{existing} cannot be examined ({error.strerror})"
    free = room.f_bavail * room.f_frsize
    if free < REPORT_ROOM_BYTES:
        return f"the disk holding {existing} is full ({free} bytes free, {REPORT_ROOM_BYTES} at least)"
    if room.f_files and not room.f_favail:
        return f"the disk holding {existing} has no free inodes left"
    return None


def unwritable_reason(folder: Path) -> str | None:
    """None when files can be created in folder (or in the folder that would hold it, when it is not made
    yet), else why not in a few words; creates nothing, so a usage check leaves no trace."""
    existing = _existing(folder)
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only filesystem"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user"
    return None


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, when it holds at most limit: opened without following a link and without
    blocking (a FIFO planted in its place would hang a plain open), then read bounded. For files this run did
    not write (nights, bundles, profiles), which are data. OSError when it cannot be opened; ValueError, with
    the reason in a few words, when it is not a regular file or holds more."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"more than {limit >> 20} MB" if limit % (1 << 20) == 0 else f"more than {limit} bytes")
    return data
