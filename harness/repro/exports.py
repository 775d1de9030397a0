"""The shell lines that give a bundle's repro.py the QNN host environment the suite ran with: the interposer
overlay as QNN_SDK_ROOT, its libraries first on LD_LIBRARY_PATH, and the interposer's bridge variable.

Without the bridge variable an executorch and QNN pair that needs the device-config bridge fails to lower
with 14001 `unknown custom config`, which repro.py reports as a different failure (exit 3), not the recorded
one. One body for `python -m harness doctor` and for the bundle's issue.md, which both print them.
"""

from __future__ import annotations

import shlex

from harness.qnn.toolchain import Toolchain

# What repro.py's children need of Toolchain.child_env(); PYTHONPATH is not one (a bundle imports only itself).
EXPORTED = ("QNN_SDK_ROOT", "LD_LIBRARY_PATH", "QNNSUITE_BRIDGE_DEVICE_CONFIG", "QNNSUITE_BRIDGE_COMPOSE_GRAPHS")


def lines(toolchain: Toolchain) -> list[str]:
    """`export NAME=value` lines, quoted for a POSIX shell; LD_LIBRARY_PATH keeps what the shell had."""
    env = toolchain.child_env(base={})
    found = []
    for name in EXPORTED:
        value = shlex.quote(env[name])
        if name == "LD_LIBRARY_PATH":
            value += "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        found.append(f"export {name}={value}")
    return found
