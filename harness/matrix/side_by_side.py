"""The side-by-side document of a matrix run (what matrix.json holds, and what both renderers read).

Rows are (SoC, case, check), columns are combinations, a cell per verdict, read from the per-SoC
report.json files of each combination (reports/README.md) through the one report reader,
harness/report/intake.py. Rows whose verdict changes across the columns that ran come first, each
labelled with what changed and since which version, worked out from the verdicts alone: "fails from
executorch 1.5.0 on", "fixed in QAIRT 2.51".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from harness.matrix.layout import COMBINATION_FILE, Combination, report_files
from harness.qnn import qairt
from harness.report.document import check_order as document_check_order, rank
from harness.report.intake import read_report
from harness.vocabulary import Verdict

MATRIX_SCHEMA_VERSION = 1
ABSENT = "absent"


@dataclass(frozen=True)
class Column:
    """One combination as the builder needs it: what it is, whether it ran, its report documents."""

    combination: Combination
    qnn_build_id: str
    status: str
    reason: str
    bridge: str
    documents: tuple[dict, ...]
    suite_exit_code: int | None = None
    duration_s: float = 0.0

    @property
    def executorch(self) -> str:
        return self.combination.executorch

    @property
    def qnn_wheel(self) -> str:
        return self.combination.qnn_wheel

    @property
    def qairt(self) -> str:
        """The QAIRT release, shortest form (2.51.0 -> 2.51), from the build id the column reported."""
        build_id = (
            next((d.get("environment", {}).get("qnn_build_id") for d in self.documents), None) or self.qnn_build_id
        )
        try:
            release = qairt.release_of(str(build_id))
        except qairt.QairtVersionError:
            return "?"
        return str(release).removesuffix(".0")

    @property
    def ran(self) -> bool:
        return self.status == "ran"


def _version(text: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, text)


def signature_of(check: dict) -> str:
    """The failure signature of a finding: the known-failure entry's, or the one in its message; a new
    failure without one is grouped by the shape of its message (numbers blanked)."""
    for text in (check.get("known_failure", ""), check.get("message", "")):
        found = re.search(r"known failure \[([a-z_]+)\]|\[signature: ([a-z_]+)", text or "")
        if found:
            return found.group(1) or found.group(2)
    shape = re.sub(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "#", check.get("message", "") or "")
    return f"unclassified: {' '.join(shape.split())[:120]}" if shape.strip() else "unclassified"


def _cells(column: Column) -> dict[tuple[str, str, str], dict]:
    cells = {}
    for document in column.documents:
        for case in document.get("cases", []):
            for check, result in case.get("checks", {}).items():
                key = (str(case.get("soc", document.get("soc", "?"))), str(case.get("case_id", "?")), str(check))
                cells[key] = {
                    "verdict": str(result.get("verdict", "?")),
                    "message": str(result.get("message", "")),
                    "known_failure": str(result.get("known_failure", "")),
                    "card": str(case.get("card", "")),
                    "dtype": str(case.get("dtype", "")),
                    "mode": str(case.get("mode", "")),
                }
    return cells


def _axis_mapping(values: list[tuple[Column, str]], axis: str) -> list[tuple[str, str]] | None:
    """[(version, value)] sorted by version, if the value depends on this axis alone; else None."""
    by_version: dict[str, set[str]] = {}
    for column, value in values:
        by_version.setdefault(column.executorch if axis == "executorch" else column.qairt, set()).add(value)
    if len(by_version) < 2 or any(len(seen) != 1 for seen in by_version.values()):
        return None
    return [(version, next(iter(seen))) for version, seen in sorted(by_version.items(), key=lambda kv: _version(kv[0]))]


def _worded(axis: str, sequence: list[tuple[str, str]]) -> str:
    name = "executorch" if axis == "executorch" else "QAIRT"
    changes = [i for i in range(1, len(sequence)) if sequence[i][1] != sequence[i - 1][1]]
    if len(changes) == 1:
        before, (version, after) = sequence[0][1], sequence[changes[0]]
        if after == "fails" and before == "passes":
            return f"fails from {name} {version} on"
        if after == "passes" and before == "fails":
            return f"fixed in {name} {version}"
        return f"{after} from {name} {version} on (was {before})"
    return f"varies with {name}: " + ", ".join(f"{value} in {version}" for version, value in sequence)


def said_of_check(verdict: str) -> str:
    """What a verdict says about the check itself: a known failure that now passes passes, an expected failure
    fails; any other verdict (a column's `absent` too) as it is."""
    meaning = Verdict.of(verdict)
    if meaning is not None and (meaning.passes or meaning.fails):
        return "passes" if meaning.passes else "fails"
    return verdict


def label(values: list[tuple[Column, str]]) -> str:
    """What changed across the columns (verdicts of the columns that ran), and since which version."""
    outcomes = [(column, said_of_check(verdict)) for column, verdict in values]
    if len({value for _, value in outcomes}) == 1:
        outcomes = list(values)  # same outcome, different verdicts (e.g. failed vs xfailed): name those
    for axis in ("executorch", "qnn"):
        sequence = _axis_mapping(outcomes, axis)
        if sequence is not None:
            return _worded(axis, sequence)
    return "varies with executorch and QAIRT: " + ", ".join(
        f"{value} with {column.executorch}/{column.qairt}" for column, value in outcomes
    )


def check_order(columns: list[Column]) -> tuple[str, ...]:
    """The checks in the reports' column order (each report.json carries the check registry's columns; a check
    some release's suite lacks comes where its reports put it), so a new @check needs no edit here."""
    return tuple(
        dict.fromkeys(
            name for column in columns for document in column.documents for name in document_check_order(document)
        )
    )


def _row_order(row: dict, order: tuple[str, ...]) -> tuple:
    return (
        not row["changed"],
        row["flaky"],
        row["soc"],
        row["card"],
        row["dtype"],
        row["mode"],
        *rank(order, row["check"]),
    )


def only_flaky(verdicts: list[tuple[str, str]], flaky_reasons: frozenset[str]) -> bool:
    """Whether (verdict, known_failure) of the columns differ only as a flaky known failure allows:
    passes, and xfails by entries marked flaky."""
    return all(
        verdict == "passed" or (verdict == "xfailed" and reason in flaky_reasons) for verdict, reason in verdicts
    )


def _flaky_label(values: list[tuple[Column, str]]) -> str:
    passes = sum(verdict == "passed" for _, verdict in values)
    return f"flaky known failure, not a version change: passed in {passes} of {len(values)} columns"


def build(columns: list[Column], matrix_id: str, command: str, flaky_reasons: frozenset[str] = frozenset()) -> dict:
    """matrix.json: columns (sorted by executorch, then QAIRT), rows (changing ones first), findings.

    flaky_reasons: the known-failure descriptions (`KnownFailure.describe()`) of entries marked flaky."""
    columns = sorted(columns, key=lambda c: (_version(c.executorch), _version(c.qairt), _version(c.qnn_wheel)))
    cells = [_cells(column) if column.ran else {} for column in columns]
    rows = []
    for key in sorted({key for column_cells in cells for key in column_cells}):
        # None: the column did not run at all; {"verdict": "absent"}: it ran without this check.
        row_cells = [
            column_cells.get(key, {"verdict": ABSENT}) if column.ran else None
            for column, column_cells in zip(columns, cells)
        ]
        ran = [(column, cell["verdict"]) for column, cell in zip(columns, row_cells) if cell is not None]
        changed = len({verdict for _, verdict in ran}) > 1
        flaky = changed and only_flaky(
            [(cell["verdict"], cell.get("known_failure", "")) for cell in row_cells if cell], flaky_reasons
        )
        case = next(cell for cell in row_cells if cell and cell["verdict"] != ABSENT)
        rows.append(
            {
                "soc": key[0],
                "case_id": key[1],
                "check": key[2],
                "card": case["card"],
                "dtype": case["dtype"],
                "mode": case["mode"],
                "changed": changed,
                "flaky": flaky,
                "label": _flaky_label(ran) if flaky else label(ran) if changed else "",
                "cells": [
                    cell and {name: cell.get(name, "") for name in ("verdict", "message", "known_failure")}
                    for cell in row_cells
                ],
            }
        )
    order = check_order(columns)
    rows.sort(key=lambda row: _row_order(row, order))
    return {
        "schema_version": MATRIX_SCHEMA_VERSION,
        "matrix_id": matrix_id,
        "command": command,
        "columns": [_column_entry(column) for column in columns],
        "rows": rows,
        "findings": _findings(columns, cells),
        "changed_rows": sum(row["changed"] and not row["flaky"] for row in rows),
        "flaky_rows": sum(row["flaky"] for row in rows),
        "total_rows": len(rows),
    }


def _column_entry(column: Column) -> dict:
    summary = Counter()
    for document in column.documents:
        summary.update({k: v for k, v in document.get("summary", {}).items() if isinstance(v, int)})
    environment = next((d.get("environment", {}) for d in column.documents), {})
    return {
        "id": column.combination.id,
        "executorch": column.executorch,
        "onnxruntime_qnn": column.qnn_wheel,
        "qairt": column.qairt,
        "qnn_build_id": environment.get("qnn_build_id") or column.qnn_build_id,
        "executorch_reported": environment.get("executorch", ""),
        "torch": environment.get("torch", ""),
        "bridge": environment.get("bridge") or column.bridge,
        "status": column.status,
        "reason": column.reason,
        "socs": sorted({str(d.get("soc", "?")) for d in column.documents}),
        "summary": dict(summary),
        "suite_exit_code": column.suite_exit_code,
        "duration_s": column.duration_s,
    }


def _findings(columns: list[Column], cells: list[dict]) -> list[dict]:
    """Per signature, how many checks of each column failed (or xfailed, or xpassed) that way (None:
    the column did not run)."""
    table: dict[str, list[int | None]] = {}
    examples: dict[str, str] = {}
    for index, column_cells in enumerate(cells):
        for cell in column_cells.values():
            if (verdict := Verdict.of(cell["verdict"])) is not None and verdict.bundled:
                signature = signature_of(cell)
                table.setdefault(signature, [0 if column.ran else None for column in columns])[index] += 1
                examples.setdefault(signature, cell["message"] or cell["known_failure"])
    return [
        {"signature": signature, "counts": counts, "example": examples[signature][:300]}
        for signature, counts in sorted(table.items(), key=lambda item: (-sum(n or 0 for n in item[1]), item[0]))
    ]


def load_columns(folder: Path) -> list[Column]:
    """Every combination folder of a matrix run: its combination.json and the report.json files beside it,
    each read as data through harness/report/intake.py (bounded, schema-validated); a report that is not a
    valid report.json raises ReportDataError, one line naming the file and the problem."""
    columns = []
    for entry in sorted(path for path in folder.glob(f"*/{COMBINATION_FILE}")):
        run = json.loads(entry.read_text())
        latest: dict[str, dict] = {}
        for path in report_files(entry.parent):  # sorted by run id: a later run of the same SoC wins
            document = read_report(path)
            latest[str(document.get("soc", path.parent.name))] = document
        columns.append(
            Column(
                Combination(run["executorch"], run["qnn_wheel"]),
                run.get("qnn_build_id", ""),
                run["status"],
                run.get("reason", ""),
                run.get("bridge", ""),
                tuple(latest[soc] for soc in sorted(latest)),
                run.get("suite_exit_code"),
                run.get("duration_s", 0.0),
            )
        )
    return columns
