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


def package_version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@cache
def build_identity(package: str) -> str:
    """What a package's build is, by content, not by version string: a wheel's RECORD (the sha256 of every
    file it installed); for an editable install, its source checkout's git commit and changed files, or
    else the size and mtime of its Python and shared-library files. The version string alone misses a
    rebuilt editable checkout or a locally built wheel that kept the version."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return "not installed"
    source = _editable_source(dist)
    if source is None:
        return "record:" + hashlib.sha256((dist.read_text("RECORD") or dist.version).encode()).hexdigest()[:20]
    return f"editable:{source}:" + _tree_identity(source)


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
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
        changed = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "-uno"], capture_output=True,
                                 text=True, timeout=GIT_TIMEOUT_S)
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
