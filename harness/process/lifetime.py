"""Processes that die with the one that started them, even when it is SIGKILLed.

PR_SET_PDEATHSIG asks the kernel to signal a child when its parent thread exits; set between fork and
exec (Popen's preexec_fn), it also covers programs we do not write (the adb server). Children must be
started from a thread that lives as long as the run: the run's main thread.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: nothing to load in the child


def die_with_parent() -> None:
    """For Popen(preexec_fn=...): SIGKILL this child when the process that started it dies."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
