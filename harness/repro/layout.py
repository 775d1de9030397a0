"""Where reproduction bundles live in a report folder, and how big they are (torch-free: the reports read it).

reports/<run>/<SOC>/repro/<folder>/ holds one case's bundle and reports/<run>/<SOC>/repro/<folder>.tar.gz
the same files as one attachment. The folder is the case id when it is a plain name; any other case id
(a user's card may be named anything) gets a name of its own that cannot leave the repro folder.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

REPRO_DIR = "repro"
ARCHIVE_SUFFIX = ".tar.gz"
CASE_FILE = "case.json"
PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$")
# What a record's `repro` field may hold: the page links it, so nothing else becomes a link.
LINK = re.compile(rf"^{REPRO_DIR}/[A-Za-z0-9][A-Za-z0-9_.-]{{0,120}}$")


def folder_name(case_id: str) -> str:
    """The case id itself when it is a plain file name, else a readable prefix and a hash of it."""
    if PLAIN_NAME.match(case_id) and ".." not in case_id:
        return case_id
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id).strip("._-")[:60] or "case"
    return f"{readable}-{hashlib.sha256(case_id.encode()).hexdigest()[:12]}"


def link(case_id: str) -> str:
    """The bundle's path relative to its SoC's report folder (what records and pages carry)."""
    return f"{REPRO_DIR}/{folder_name(case_id)}"


@dataclass(frozen=True)
class BundleSize:
    folder: str
    files: int
    bytes: int  # unpacked
    archive_bytes: int  # the .tar.gz beside it (0 when missing)


def sizes(soc_folder: Path) -> list[BundleSize]:
    """Every bundle under a SoC's report folder, by folder name."""
    root = soc_folder / REPRO_DIR
    if not root.is_dir():
        return []
    found = []
    for bundle in sorted(path for path in root.iterdir() if path.is_dir() and (path / CASE_FILE).is_file()):
        files = [path for path in bundle.rglob("*") if path.is_file() and not path.is_symlink()]
        archive = root / (bundle.name + ARCHIVE_SUFFIX)
        found.append(
            BundleSize(
                bundle.name,
                len(files),
                sum(path.stat().st_size for path in files),
                archive.stat().st_size if archive.is_file() else 0,
            )
        )
    return found
