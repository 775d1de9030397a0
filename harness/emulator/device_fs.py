"""The emulated device's file system: which absolute paths are the device's, and where they are on the host.

Kept apart (and to os and posixpath) because runner_client imports it, whose start-up time counts.
"""

from __future__ import annotations

import posixpath

DEVICE_TOP_DIRS = ("data", "sdcard", "system", "vendor")


def is_device_path(path: str) -> bool:
    """An absolute path in one of the device's own top directories (/data/..., /sdcard, ...)."""
    return path.startswith("/") and posixpath.normpath(path).split("/")[1] in DEVICE_TOP_DIRS


def host_path(path: str, root: str) -> str:
    """Where a path named by a jailed device command is on the host: device paths are in the sandbox `root`;
    anything else (relative, or a host path already) is left as it is."""
    if not is_device_path(path) or path == root or path.startswith(root.rstrip("/") + "/"):
        return path
    return root.rstrip("/") + posixpath.normpath(path)


# A fault switch that holds the others back: they take effect from the device's (N+1)th program (.pte push;
# adbd sets it to 0 then), so a test can break a device after its health check (one program), not from the start.
AFTER_PROGRAMS = "after_programs"


def active_faults(faults: dict) -> dict:
    """The fault switches in force: none while the device still has programs to take before they arm."""
    pending = faults.get(AFTER_PROGRAMS)
    return {} if isinstance(pending, int) and pending > 0 else faults
