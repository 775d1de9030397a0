"""The emulated device's qnn_executor_runner: the pybindings runner (host_runner.py), a fresh Python.

    python -m harness.emulator.runner_client --model_path M.pte --input_list_path list.txt ...

The reference runner, beside the suite's compiled one (harness/emulator/compiled_runner.py, the default):
upstream's flags, executorch's Python runtime, one method per process. It runs as any device command does,
in the device's jail: this execs `$QNNSUITE_PYTHON -m harness.emulator.host_runner` with the command's argv,
cwd and environment, so the runner's exit status and signals are the command's. Its stderr also goes, line
by line, into the device log that the device's logcat reads (device_log.copy_stderr), as a phone's runner
logs through liblog. On an emulated phone ($QNNSUITE_EMULATED_PHONE) the loader finds the pushed QNN
libraries (harness/emulator/phone_runtime.py).
"""

from __future__ import annotations

import os
import sys

from harness.emulator import device_log
from harness.emulator.phone_runtime import PHONE_ENV, NoQnnLibrary, runner_environment

HOST_RUNNER = "harness.emulator.host_runner"


def main(argv: list[str]) -> None:
    env = dict(os.environ)
    if PHONE_ENV in env:  # an emulated phone: a runner that loads the pushed libraries (phone_runtime)
        try:
            env = runner_environment(env)
        except NoQnnLibrary as missing:
            print(f"qnn_executor_runner: {missing}", file=sys.stderr, flush=True)
            sys.exit(1)
    device_log.copy_stderr()
    python = os.environ.get("QNNSUITE_PYTHON") or sys.executable
    os.execve(python, [python, "-m", HOST_RUNNER, *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
