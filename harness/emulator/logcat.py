"""The emulated device's `logcat` (in its /system/bin): the device log buffer (harness/emulator/device_log.py)
read back as a phone's logcat prints it, for what the harness asks of one:

    logcat -d -v threadtime -T 'MM-DD HH:MM:SS.mmm' ExecuTorch:V '[Qnn ExecuTorch]:V' '*:S'

-d (dump and exit; this logcat never follows), -v threadtime (the one format it prints), -t/-T TIME or COUNT
(lines since a time, or the last COUNT), -s (everything silent unless named), -b main, -c (clear) and
TAG:PRIORITY filter specs with `*` for every tag, as Android's logcat reads them. Anything else is refused
with one line, as logcat refuses what it does not know.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from harness.emulator.device_log import LOG_ENV, PRIORITIES, threadtime

TIME_ARGUMENT = re.compile(r"\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,3})?")


class LogcatError(ValueError):
    """A command line this logcat cannot serve."""


def parse_filters(specs: list[str], silent: bool) -> tuple[dict[str, str], str]:
    """Per-tag lowest priority shown, and the default for the other tags."""
    per_tag, default = {}, "S" if silent else "V"
    for spec in specs:
        tag, _, priority = spec.rpartition(":") if ":" in spec else (spec, "", "V")
        priority = priority.upper() or "V"
        if priority not in PRIORITIES or not tag:
            raise LogcatError(f"Invalid filter expression '{spec}'")
        if tag == "*":
            default = priority
        else:
            per_tag[tag] = priority
    return per_tag, default


def since(value: str | None) -> tuple[str | None, int | None]:
    """-t/-T: a time (as threadtime prints it, compared as text: same year) or a count of last lines."""
    if value is None:
        return None, None
    if value.isdigit():
        return None, int(value)
    if TIME_ARGUMENT.fullmatch(value):
        stamp, _, millis = value.partition(".")
        return f"{stamp}.{millis.ljust(3, '0')}", None
    raise LogcatError(f"-t/-T wants a count or a time as 'MM-DD hh:mm:ss.mmm', not '{value}'")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="logcat", add_help=False)
    parser.add_argument("-d", action="store_true")
    parser.add_argument("-c", action="store_true")
    parser.add_argument("-s", action="store_true")
    parser.add_argument("-v", default="threadtime")
    parser.add_argument("-b", default="main")
    parser.add_argument("-t", dest="tail")
    parser.add_argument("-T", dest="tail_follow")
    parser.add_argument("filters", nargs="*")
    try:
        args = parser.parse_args(argv)
        if args.v != "threadtime" or args.b not in ("main", "default", "all"):
            raise LogcatError(f"this device's logcat prints only -v threadtime of -b main, not -v {args.v} -b {args.b}")
        if not (args.d or args.c or args.tail or args.tail_follow):
            raise LogcatError("this device's logcat only dumps (-d, -t, -T): it cannot follow the log")
        per_tag, default = parse_filters(args.filters, args.s)
        start, count = since(args.tail or args.tail_follow)
    except (LogcatError, SystemExit) as error:
        print(f"logcat: {error if isinstance(error, LogcatError) else 'unknown option'}", file=sys.stderr)
        return 1
    path = os.environ.get(LOG_ENV, "")
    if args.c:
        if path and os.path.exists(path):
            open(path, "w").close()
        return 0
    records = []
    try:
        with open(path, encoding="utf-8", errors="replace") as log:
            records = [json.loads(line) for line in log if line.strip()]
    except (OSError, json.JSONDecodeError):
        pass  # an empty buffer
    lines = []
    for record in records:
        shown = per_tag.get(record["tag"], default)
        if PRIORITIES.index(record["priority"]) < PRIORITIES.index(shown):
            continue
        line = threadtime(record)
        if start is None or line[:18] >= start:
            lines.append(line)
    for line in lines[-count:] if count else lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
