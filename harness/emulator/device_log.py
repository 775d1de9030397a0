"""The emulated device's log buffer: what its `logcat` prints (harness/emulator/logcat.py).

On a phone, the runner's libraries log through liblog into logd (ExecuTorch under the tag `ExecuTorch`,
the QNN backend under `[Qnn ExecuTorch]`, as upstream's backends/qualcomm/runtime/Logging.cpp names it),
and `logcat` reads them back. The emulated runner cannot reach liblog, but the same messages reach its
stderr, so the runner client copies its stderr lines here (tee), each with its time, pid, priority and tag
read from the line's own prefix. One JSON object per line in $QNNSUITE_DEVICE_LOG, a device path.
Imported by the runner client on every run: os, re, json and time only (not even typing: 12 ms a run).
"""

from __future__ import annotations

import json
import os
import re
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import TextIO

LOG_ENV = "QNNSUITE_DEVICE_LOG"
LOG_PATH = "/data/misc/logd/qnnsuite.jsonl"  # on the device (adbd gives its host path when shells are not jailed)
RUNNER_TAG = "qnn_executor_runner"  # lines without a library's prefix are the runner's own
PRIORITIES = "VDIWEFS"
# "[ERROR] [Qnn ExecuTorch]: message" (QNN backend), "E 00:00:01.234567 executorch:file.cpp:12] message" (ET_LOG
# of the portable runtime), "[program.cpp:114] message" (ET_LOG as the python bindings print it: no level)
_QNN_LINE = re.compile(r"\[(VERBOSE|DEBUG|INFO|WARN|ERROR)\] (\[Qnn Execu[Tt]orch\]):? ?(.*)")
_ET_LINE = re.compile(r"([DIEF]) \d\d:\d\d:\d\d\.\d+ executorch:(\S+)\] ?(.*)")
_ET_BINDING_LINE = re.compile(r"\[[\w.-]+\.(?:cpp|cc|h):\d+\] ")
_QNN_PRIORITY = {"VERBOSE": "V", "DEBUG": "D", "INFO": "I", "WARN": "W", "ERROR": "E"}


def entry(line: str, pid: int, now: float) -> dict:
    """A log entry for one stderr line: tag and priority from its prefix."""
    if match := _QNN_LINE.match(line):
        return {
            "time": now,
            "pid": pid,
            "priority": _QNN_PRIORITY[match.group(1)],
            "tag": match.group(2),
            "message": match.group(3),
        }
    if match := _ET_LINE.match(line):
        return {
            "time": now,
            "pid": pid,
            "priority": match.group(1),
            "tag": "ExecuTorch",
            "message": f"{match.group(2)}] {match.group(3)}",
        }
    if _ET_BINDING_LINE.match(line):  # the level is not printed: I, the lowest that logcat's defaults show
        return {"time": now, "pid": pid, "priority": "I", "tag": "ExecuTorch", "message": line}
    return {"time": now, "pid": pid, "priority": "I", "tag": RUNNER_TAG, "message": line}


def tee(source: int, copy_to: int, log: TextIO, pid: int) -> None:
    """Copy everything from fd `source` to fd `copy_to`, and each line of it into the device log, until EOF.
    Drains `source` whatever fails: a writer to a pipe nobody reads would block."""
    pending = b""
    with log:
        while chunk := os.read(source, 65536):
            try:
                os.write(copy_to, chunk)
            except OSError:
                pass  # stderr gone: the log still gets the lines
            pending += chunk
            *lines, pending = pending.split(b"\n")
            _append(log, lines, pid)
        _append(log, [pending] if pending else [], pid)
    os.close(source)


def _append(log: TextIO, lines: list[bytes], pid: int) -> None:
    try:
        for line in lines:
            log.write(json.dumps(entry(line.decode(errors="replace").rstrip("\r"), pid, time.time())) + "\n")
        log.flush()
    except (OSError, ValueError):
        pass  # a full or closed log loses lines, never the run


def threadtime(record: dict) -> str:
    """One entry as `logcat -v threadtime` prints it: `MM-DD HH:MM:SS.mmm  PID  TID P TAG     : message`."""
    stamp = (
        time.strftime("%m-%d %H:%M:%S", time.localtime(record["time"])) + f".{int(record['time'] * 1000) % 1000:03d}"
    )
    return (
        f"{stamp} {record['pid']:5d} {record['pid']:5d} {record['priority']} {record['tag']:<8s}: {record['message']}"
    )
