"""What an emulated phone does when its shell runs a pushed qnn_executor_runner: the phone's dynamic linker.

A phone's runner loads libQnnHtp.so from LD_LIBRARY_PATH, i.e. from the folder the harness pushed the QNN
libraries to. On an emulated phone those libraries are the host's x86 QNN libraries under their Android
names, and the runner is the host runner (harness/emulator/host_runner.py) in a fresh process, so that the
command's LD_LIBRARY_PATH is what the loader searches, as on a phone (a runner server's would be fixed at its
start). One thing sits in front: the device's own adaptation of the host library to the host executorch
(the device-config bridge, harness/qnn/interposer.c built with the QNNSUITE_PHONE_HW_ prefix), which then
loads the first libQnnHtp.so of LD_LIBRARY_PATH, pushed there by the harness: Qualcomm's library, or the
harness's trace interposer in front of it (--android-ndk). Its system bridge (system_bridge.c, the same
prefix) sits in front of the pushed libQnnSystem.so likewise.
Imported by runner_client, whose start-up time counts: os only.
"""

from __future__ import annotations

import os

PHONE_ENV = "QNNSUITE_EMULATED_PHONE"  # set on an emulated phone's commands: the folder of its bridge library
REAL_LIBRARY_ENV = "QNNSUITE_PHONE_HW_REAL_QNNHTP"  # the bridge's -DENV_PREFIX (harness/emulator/phone.py)
REAL_SYSTEM_LIBRARY_ENV = "QNNSUITE_PHONE_HW_REAL_QNNSYSTEM"  # its system bridge's (harness/qnn/system_bridge.c)
HTP_LIBRARY = "libQnnHtp.so"
SYSTEM_LIBRARY = "libQnnSystem.so"


class NoQnnLibrary(RuntimeError):
    """No libQnnHtp.so on the command's LD_LIBRARY_PATH: a phone's runner would not start either."""


def runner_environment(env: dict[str, str]) -> dict[str, str]:
    """The command's environment as the emulated phone's loader needs it: its bridge first, then the
    command's library path; the bridge forwards to the first pushed libQnnHtp.so on that path."""
    folders = [entry for entry in env.get("LD_LIBRARY_PATH", "").split(":") if entry]
    pushed = next((folder for folder in folders if os.path.isfile(os.path.join(folder, HTP_LIBRARY))), None)
    if pushed is None:
        raise NoQnnLibrary(
            f"cannot load {HTP_LIBRARY}: it is in none of LD_LIBRARY_PATH={env.get('LD_LIBRARY_PATH', '')!r}"
        )
    bridge = env[PHONE_ENV]
    return {
        **env,
        "LD_LIBRARY_PATH": ":".join([bridge, *folders]),
        REAL_LIBRARY_ENV: os.path.join(pushed, HTP_LIBRARY),
        REAL_SYSTEM_LIBRARY_ENV: os.path.join(pushed, SYSTEM_LIBRARY),
    }
