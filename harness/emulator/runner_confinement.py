"""What the emulated device's runner server runs: host_runner, for requests that stay inside the device.

The server runs on the host, outside the device's jail, started by the launcher with ANDROID_ROOT_SANDBOX:
a device command that talks to the server's socket itself must not make the host-side runner read or write
the host's files. So a request runs only when its cwd and files (program, input list and the inputs it
names, output folder) are inside that device's sandbox; the sandbox is read when the server starts, never
from a request.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from harness.emulator import host_runner
from harness.process.fork_server import exit_if_qnn_libraries_mapped

REFUSED_EXIT = 126  # what a shell answers for a command it will not run
SANDBOX_ENV = "ANDROID_ROOT_SANDBOX"


def paths_outside(argv: list[str], root: Path) -> list[str]:
    """The paths a runner invocation would touch outside the device sandbox `root` (relative ones from cwd)."""
    arguments = host_runner.parse_args(argv)
    named = [os.getcwd(), arguments.model_path, arguments.input_list_path, arguments.output_folder_path]
    named += [arguments.etdump_path] if arguments.etdump_path else []
    try:
        named += Path(arguments.input_list_path).read_text().split()
    except (OSError, UnicodeError):
        pass  # the runner reports a missing list itself
    return [path for path in named if not Path(path).resolve().is_relative_to(root)]


def confined(root: Path | None) -> Callable[[list[str]], object]:
    """host_runner.main for requests that stay inside `root` (None: a server of no device, unconfined)."""
    def entry(argv: list[str]) -> object:
        outside = paths_outside(argv, root) if root is not None else []
        if outside:
            print(f"runner server: refused, {', '.join(outside[:3])} is outside this device's sandbox {root}",
                  file=sys.stderr, flush=True)
            return REFUSED_EXIT
        return host_runner.main(argv)
    return entry


def server_entry() -> Callable[[list[str]], object]:
    """Called once when the server starts: the entry point for this device's sandbox, with ExecuTorch's runtime
    extension imported for every run."""
    host_runner.runtime()
    exit_if_qnn_libraries_mapped("importing ExecuTorch's runtime")  # as after the service's preloaded imports
    root = os.environ.get(SANDBOX_ENV)
    return confined(Path(root).resolve() if root else None)
