"""Which QAIRT release a QNN library is, read from the library file itself.

The build id (e.g. `v2.51.0.260929181845`) is a string inside libQnnHtp.so; it is the same one
`PyQnnManagerAdaptor.GetQnnSdkBuildId` returns, but reading it needs no executorch and loads nothing,
so it can be asked at collection time (version-scoped known failures) and before a venv exists (the matrix).
"""

from __future__ import annotations

import mmap
import re
from functools import cache
from pathlib import Path

from packaging.version import Version

BUILD_ID = re.compile(rb"v(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{6,})")


class QairtVersionError(RuntimeError):
    """The library carries no (or more than one) QAIRT build id; one line naming the library."""


def build_id_of(library: Path) -> str:
    """The one build id in `library`, as `v2.51.0.260929181845`."""
    try:
        resolved = library.resolve(strict=True)
        stat = resolved.stat()
    except OSError as error:
        raise QairtVersionError(f"cannot read QNN library {library}: {error.strerror or error}") from error
    return _build_id(resolved, stat.st_size, stat.st_mtime_ns)


@cache
def _build_id(library: Path, size: int, mtime_ns: int) -> str:
    with open(library, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        found = {match.decode() for match in BUILD_ID.findall(data)}
    if len(found) != 1:
        what = "no QAIRT build id" if not found else f"several build ids ({', '.join(sorted(found))})"
        raise QairtVersionError(
            f"QNN library {library} has {what}: point QNN_SDK_ROOT at a QAIRT SDK or "
            f"onnxruntime-qnn tree whose lib/x86_64-linux-clang/libQnnHtp.so is a real QNN library"
        )
    return "v" + found.pop()


def release_of(build_id: str) -> Version:
    """The release a build id names (`v2.51.0.260929181845` -> 2.51.0), what version scopes compare with."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:\.\d+)?", build_id.strip())
    if match is None:
        raise QairtVersionError(f"{build_id!r} is not a QAIRT build id (expected e.g. v2.51.0.260929181845)")
    return Version(".".join(match.groups()))
