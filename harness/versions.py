"""Installed package versions and build identities, for the doctor, the reports and the artifact cache key."""

from __future__ import annotations

import hashlib
import json
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

SOURCE_SUFFIXES = (".py", ".so")
GIT_TIMEOUT_S = 20


@cache
def package_version(package: str) -> str:
    """Once per process: importlib.metadata scans every distribution on sys.path each time (three lookups per
    content key, 2.5 s of a warm run)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@cache
def build_identity(package: str) -> str:
    """What a package's build is, by content, not by version string: a wheel's RECORD (the sha256 of every
    file it installed) and the size, mtime and ctime of each of those files as they are now; for an editable
    install, its source checkout's git commit and changed files, or else the size and mtime of its Python and
    shared-library files. The version string alone misses a rebuilt editable checkout or a locally built
    wheel that kept the version, and the RECORD alone misses a file patched in place after installing (a
    cached lowering would then hide the patch's effect)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return "not installed"
    source = _editable_source(dist)
    if source is None:
        record = hashlib.sha256((dist.read_text("RECORD") or dist.version).encode()).hexdigest()[:20]
        return f"record:{record}:" + _installed_files_identity(dist)
    return f"editable:{source}:" + _tree_identity(source)


def _installed_files_identity(dist: metadata.Distribution) -> str:
    """The installed files as they are: a change to one changes its size or mtime, and always its ctime,
    which nothing short of a rewrite sets (touch cannot put it back). 0.5 s for torch, executorch and torchao."""
    digest = hashlib.sha256()
    for file in dist.files or ():
        try:
            stat = file.locate().stat()
        except OSError:
            digest.update(f"{file}\0missing\n".encode())
            continue
        digest.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}\n".encode())
    return digest.hexdigest()[:20]


def _editable_source(dist: metadata.Distribution) -> Path | None:
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        return None
    if not direct.get("dir_info", {}).get("editable"):
        return None
    url = direct.get("url", "")
    return Path(url.removeprefix("file://")) if url.startswith("file://") else None


def _tree_identity(source: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
        changed = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "-uno"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        head = changed = None
    digest = hashlib.sha256()
    if head is not None and head.returncode == 0:
        digest.update(head.stdout.encode())
        files = [source / line[3:] for line in changed.stdout.splitlines() if len(line) > 3]
    else:  # not a git checkout: every source file counts
        files = sorted(path for path in source.rglob("*") if path.suffix in SOURCE_SUFFIXES)
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            continue
        digest.update(f"{path.relative_to(source)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]
