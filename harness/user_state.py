"""Per-user state (device locks, run folders): under a 0700 directory that only this user owns.

A fixed folder in a world-writable /tmp lets another user plant it (or a symlink in it) first and then
read, block or redirect what the suite writes there. So the base is $XDG_RUNTIME_DIR when it is usable,
else the temporary directory with the uid in the name; it and every folder made in it are created 0700
and checked (a real directory, owned by this user, nobody else may enter) before use, and files in it
are opened without following symlinks.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import IO

from harness.files import say

KEY_BYTES = 32


class UnsafeStateDir(RuntimeError):
    """A state folder that someone else could tamper with; the message names it and the fix."""


def folder_problem(info: os.stat_result, forbidden_mode: int, mode_words: str) -> str:
    """Why a folder (its lstat) is not this user's own private one ("" when it is): the one rule behind the
    state folder, the artifact cache and the emulated phone's SDK and build folders, each of which words
    its own fix. forbidden_mode: the permission bits others must not have (0o077 private, 0o022 not
    writable by others); mode_words: what having them means, e.g. "others may enter"."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}"
    if info.st_mode & forbidden_mode:
        return f"has mode {stat.S_IMODE(info.st_mode):o} ({mode_words})"
    return ""


def ancestry_problem(path: Path) -> str:
    """Why the folders above path (an absolute, resolved path) would let another account swap it or what it
    holds ("" when none would): each, from the root down, must be a real directory owned by this user or
    root that nobody else may write, unless it is sticky (as /tmp is: there only an entry's owner may
    rename or remove it). A check of the folder alone holds only until a writable parent renames it away."""
    for parent in reversed(path.parents):
        try:
            info = os.lstat(parent)
        except OSError as error:
            return f"its parent {parent} cannot be examined ({error.strerror})"
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            return f"its parent {parent} is not a directory (a link, swapped since the path was resolved)"
        if info.st_uid not in (0, os.getuid()):
            return f"its parent {parent} belongs to uid {info.st_uid}"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return f"its parent {parent} has mode {stat.S_IMODE(info.st_mode):o} (others may swap what it holds)"
    return ""


def entry_problem(entry: Path) -> str:
    """Why a cache entry (a file, or a folder and the files in it) is not this user's own ("" when it is, or
    is not there): what another account owns is never served, whatever it holds, nor written into."""
    try:
        info = os.lstat(entry)
    except FileNotFoundError:
        return ""
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}"
    if not stat.S_ISDIR(info.st_mode):
        return ""
    try:
        with os.scandir(entry) as found:
            for item in found:
                try:
                    owner = item.stat(follow_symlinks=False).st_uid
                except FileNotFoundError:
                    continue  # a worker's temporary file, renamed into place meanwhile
                if owner != os.getuid():
                    return f"holds {item.name}, which belongs to uid {owner}"
    except FileNotFoundError:
        return ""  # set aside meanwhile by another worker
    return ""


def claim_entry(entry: Path, what: str) -> None:
    """Make way for this user's own entry where another account's is: that one is renamed aside in the cache
    folder (this user's, checked), never read, followed or written, and named in one line."""
    problem = entry_problem(entry)
    if not problem:
        return
    aside = entry.with_name(f".foreign-{entry.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(entry, aside)
    except FileNotFoundError:
        return  # another worker set it aside first
    say(f"qnnsuite: {what} {entry.name} {problem}, not yours: not served, moved aside to {aside} (remove it)")


def checked_dir(path: Path) -> Path:
    """`path` as a private directory: created 0700 if missing, else verified to be one."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise UnsafeStateDir(
            f"cannot create state folder {path} ({error.strerror}): check its parent or set XDG_RUNTIME_DIR"
        ) from error
    problem = folder_problem(os.lstat(path), forbidden_mode=0o077, mode_words="others may enter")
    if problem:
        raise UnsafeStateDir(
            f"state folder {path} {problem}: remove it (someone may have planted it) or point XDG_RUNTIME_DIR elsewhere"
        )
    return path


def base_dir() -> Path:
    """This user's private folder for the suite's state."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        try:
            return checked_dir(checked_dir(Path(runtime)) / "qnnsuite")
        except UnsafeStateDir:
            pass  # an unusable runtime dir (not ours, say after `su`): fall back to the temporary directory
    return checked_dir(Path(tempfile.gettempdir()) / f"qnnsuite-{os.getuid()}")


def state_dir(name: str, override: str | None = None) -> Path:
    """A private sub-folder (`locks`, `runs`); `override` (an environment setting) replaces it, checked alike."""
    if override:
        return checked_dir(Path(override))
    return checked_dir(base_dir() / name)


def open_append(path: Path) -> IO[str]:
    """Append to a file in a state folder, never through a symlink, creating it 0600."""
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    return os.fdopen(descriptor, "a")


@cache
def user_key(name: str) -> bytes:
    """This user's secret key `name` (e.g. the cache's, the nightly store's): made once (0600, atomically: the
    first writer wins) in the user's private 0700 state folder, and read only if it is a regular file of
    this user's that nobody else can read. What it seals (harness/pipeline/prepared.py's programs, the nights
    of harness/report/nightly/promote.py) was written by this user's suite, not planted."""
    path = base_dir() / name
    if not os.path.lexists(path):
        temporary = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(descriptor, secrets.token_bytes(KEY_BYTES))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)  # fails if another process made it first: then theirs is the key
        except FileExistsError:
            pass
        finally:
            os.unlink(temporary)
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(descriptor)
        key = file.read(KEY_BYTES + 1)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077 or len(key) != KEY_BYTES:
        raise UnsafeStateDir(
            f"key {path} is not a 0600 file of {KEY_BYTES} bytes of yours: remove it (a new one is made; "
            f"what the old one sealed is made again or refused)"
        )
    return key


def seal(data: bytes, key: bytes) -> str:
    """HMAC-SHA256 of data under key, hex: compare with `sealed_by`, never with ==."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def sealed_by(data: bytes, mark: str, key: bytes) -> bool:
    return hmac.compare_digest(mark.encode("ascii", "replace"), seal(data, key).encode())
