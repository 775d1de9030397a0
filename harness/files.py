"""File helpers shared across the harness (a leaf: nothing here imports the rest of the suite)."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader in another process never sees half a file."""
    temporary = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    temporary.write_text(text)
    temporary.replace(path)
