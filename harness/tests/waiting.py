"""Waiting in tests on a condition with a bound, never on a fixed sleep: under load (two CI workers, a suite
run beside them) a fixed sleep is sometimes too short and the assert after it fails by chance."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def eventually(condition: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.1) -> T | None:
    """condition()'s first truthy value, polled every interval_s; None once timeout_s has passed without one."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            return None
        time.sleep(interval_s)
    return value


def wait_for(condition: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """condition()'s first truthy value; AssertionError naming `what` when none came within timeout_s."""
    value = eventually(condition, timeout_s)
    assert value, f"waited {timeout_s:.0f} s for {what}"
    return value


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), or [] for a process gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def is_gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie: it runs nothing more and holds nothing open)."""
    fields = _stat_fields(pid)
    return not fields or fields[0] == "Z"


def stopped_runners_under(ancestor: int) -> list[int]:
    """Stopped (SIGSTOP) processes of an emulated device's runner wrapper among ancestor's descendants: what
    the runner_hang fault leaves while a run waits on it (harness/emulator/compiled_runner.py)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))):
            parents[int(entry)] = (fields[0], int(fields[1]))

    def descends(pid: int) -> bool:
        seen = set()
        while pid in parents and pid not in seen:
            seen.add(pid)
            pid = parents[pid][1]
            if pid == ancestor:
                return True
        return False

    def runs_runner(pid: int) -> bool:
        try:
            return b"compiled_runner" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    return [pid for pid, (state, _) in parents.items() if state == "T" and descends(pid) and runs_runner(pid)]
