"""A report.json read as data from elsewhere (a shard, a baseline, a CI artifact): bounded, parsed, validated.

merge, diff, `--baseline` and `--shard-timings` read report files that another job, host or person wrote.
Whatever such a file holds must end as one line naming it, never as a traceback half-way through a merge
or an INTERNALERROR before a run: so the file is opened without blocking (a FIFO planted as report.json
is refused, not waited on), must be a regular file of bounded size, is parsed with its nesting bounded
(json's recursion would otherwise fail deep inside the interpreter), and must match the repository's
schema (harness/report/report.schema.json, which also pins the SoC name that becomes a folder name) before
any code looks at a key.
"""

from __future__ import annotations

import json
import os
import stat
from functools import cache
from pathlib import Path

import jsonschema

from harness.report.document import SCHEMA_VERSION

SCHEMA_PATH = Path(__file__).resolve().parent / "report.schema.json"
MAX_BYTES = 256 * 1024 * 1024  # a real run's report.json is a few MB; this only stops a file meant to exhaust memory
MESSAGE_CHARS = 200  # of the schema's complaint, which quotes the offending value
MAX_DEPTH = 32  # a real report nests 7 deep (cases, checks, evidence, steps); evidence is free-form, so leave room


class ReportDataError(ValueError):
    """A file that is not a usable report.json; the message names the file and what is wrong."""


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def _read_bounded(path: Path) -> bytes:
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ReportDataError(f"{path} cannot be opened ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise ReportDataError(f"{path} is not a regular file: pass the report.json a run wrote")
        if info.st_size > MAX_BYTES:
            raise ReportDataError(
                f"{path} is {info.st_size} bytes, more than any report.json "
                f"({MAX_BYTES} at most): pass the report.json a run wrote"
            )
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ReportDataError(f"{path} grew past {MAX_BYTES} bytes while read: pass the report.json a run wrote")
    return data


def _depth(value: object) -> int:
    """How deep value nests, counted without recursion (a deep value is what this guards against)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                pending.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _where(error: jsonschema.ValidationError) -> str:
    return "/".join(str(part) for part in error.absolute_path) or "the top level"


def read_report(path: Path) -> dict:
    """The document in path, if it is a report.json the schema accepts; else ReportDataError (one line)."""
    data = _read_bounded(path)
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ReportDataError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise ReportDataError(f"{path} is not JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except RecursionError:
        raise ReportDataError(f"{path} nests deeper than any report.json ({MAX_DEPTH} levels at most)") from None
    if not isinstance(document, dict) or document.get("schema_version") != SCHEMA_VERSION:
        raise ReportDataError(f"{path} is not a report.json of schema_version {SCHEMA_VERSION}")
    if _depth(document) > MAX_DEPTH:
        raise ReportDataError(f"{path} nests deeper than any report.json ({MAX_DEPTH} levels at most)")
    problem = jsonschema.exceptions.best_match(_validator().iter_errors(document))
    if problem is not None:
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in " ".join(problem.message.split()))
        message = message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + "..."
        raise ReportDataError(f"{path} is not a valid report.json: at {_where(problem)}: {message}")
    return document
