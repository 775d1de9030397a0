"""The emulated device's log buffer: what its `logcat` prints (harness/emulator/logcat.py).

On a phone, the runner's libraries log through liblog into logd (ExecuTorch under the tag `ExecuTorch`,
the QNN backend under `[Qnn ExecuTorch]`, as upstream's backends/qualcomm/runtime/Logging.cpp names it),
and `logcat` reads them back. The emulated runner cannot reach liblog, but the same messages reach its
stderr, so the runner commands copy its stderr lines here (copy_stderr), each with its time, pid, priority and tag
read from the line's own prefix. One JSON object per line in $QNNSUITE_DEVICE_LOG, a device path.
Imported by the runner commands on every run: os, re and time only at import (json in the copier; not even typing).
"""

from __future__ import annotations

import os
import re
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import TextIO

LOG_ENV = "QNNSUITE_DEVICE_LOG"
LOG_PATH = "/data/misc/logd/qnnsuite.jsonl"  # on the device (adbd gives its host path when shells are not jailed)
RUNNER_TAG = "qnn_executor_runner"  # lines without a library's prefix are the runner's own (its name, by default)
PRIORITIES = "VDIWEFS"
# "[ERROR] [Qnn ExecuTorch]: message" (QNN backend), "E 00:00:01.234567 executorch:file.cpp:12] message" (ET_LOG
# of the portable runtime), "[program.cpp:114] message" (ET_LOG as the python bindings print it: no level)
_QNN_LINE = re.compile(r"\[(VERBOSE|DEBUG|INFO|WARN|ERROR)\] (\[Qnn Execu[Tt]orch\]):? ?(.*)")
_ET_LINE = re.compile(r"([DIEF]) \d\d:\d\d:\d\d\.\d+ executorch:(\S+)\] ?(.*)")
_ET_BINDING_LINE = re.compile(r"\[[\w.-]+\.(?:cpp|cc|h):\d+\] ")
_QNN_PRIORITY = {"VERBOSE": "V", "DEBUG": "D", "INFO": "I", "WARN": "W", "ERROR": "E"}


def entry(line: str, pid: int, now: float, runner_tag: str = RUNNER_TAG) -> dict:
    """A log entry for one stderr line: tag and priority from its prefix (runner_tag: a line without one)."""
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
    return {"time": now, "pid": pid, "priority": "I", "tag": runner_tag, "message": line}


def tee(source: int, copy_to: int, log: TextIO, pid: int, runner_tag: str = RUNNER_TAG) -> None:
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
            _append(log, lines, pid, runner_tag)
        _append(log, [pending] if pending else [], pid, runner_tag)
    os.close(source)


def copy_stderr(runner_tag: str = RUNNER_TAG) -> None:
    """From now on this process's stderr (and that of what it execs or starts) goes through a pipe that a
    forked copier tees to the real stderr and into the device log ($QNNSUITE_DEVICE_LOG) until every writer
    has ended: a runner that execs after this keeps its own exit status and signals, and loses none of its
    last words when it crashes. Nothing changes without a device log, or when it cannot be opened: the run
    itself must not depend on its log. Call it before opening anything the copier should not hold. runner_tag:
    the log tag of the runner's own lines (its command's name, as a phone's runner logs under)."""
    log_path = os.environ.get(LOG_ENV)
    try:
        log = open(log_path, "a", encoding="utf-8", errors="backslashreplace") if log_path else None
    except OSError:
        return
    if log is None:
        return
    read_end, write_end = os.pipe()
    writer = os.getpid()  # the runner, once it execs
    if os.fork() == 0:  # the copier: holds the real stderr and the pipe's read end, nothing else of ours
        try:
            os.close(write_end)
            for fd in (0, 1):
                os.close(fd)
            tee(read_end, 2, log, writer, runner_tag)
        finally:
            os._exit(0)
    log.close()
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)


def _append(log: TextIO, lines: list[bytes], pid: int, runner_tag: str) -> None:
    import json  # in the copier only: the runner's start does not wait for it

    try:
        for line in lines:
            log.write(
                json.dumps(entry(line.decode(errors="replace").rstrip("\r"), pid, time.time(), runner_tag)) + "\n"
            )
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
