"""File helpers shared across the harness (a leaf: nothing here imports the rest of the suite)."""
from __future__ import annotations

import os
import threading
from pathlib import Path


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
        temporary.unlink(missing_ok=True)
