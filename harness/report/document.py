"""One SoC's report document (what report.json holds), built from the suite's check records.

Every renderer (JUnit, Markdown, HTML) and the gate read this one document, so the views cannot disagree.
The document also carries its check columns (name and short label, in the check registry's order), so
the renderers need neither the registry nor torch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from harness.record import CheckRecord, finding_in
from harness.vocabulary import DTYPES, MODE_ORDER, VERDICTS, Verdict

SCHEMA_VERSION = 1
CASE_FIELDS = (
    "case_id",
    "card",
    "tags",
    "dtype",
    "mode",
    "soc",
    "device_serial",
    "delegates",
    "work",
    "timing",
    "structure",
)
CHECK_FIELDS = ("verdict", "message", "known_failure", "evidence", "duration_s", "nodeid")
Column = dict[str, str]  # {"name": check name, "short": its column label}


def json_safe(value: Any) -> Any:
    """Strict JSON: SQNR and errors may be infinite or NaN, which JSON has no number for."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def rank(order: tuple[str, ...], value: str) -> tuple[int, str]:
    """Sort key putting known names in their canonical order and unknown ones after, alphabetically."""
    return (order.index(value) if value in order else len(order), value)


def tally(records: list[CheckRecord]) -> dict[str, int]:
    """Checks per verdict; a check recorded twice counts once, with its last verdict."""
    last = {(r.soc, r.case_id, r.check): r.verdict for r in records}
    counts = Counter(last.values())
    return {**{verdict: counts.get(verdict, 0) for verdict in VERDICTS}, "total": len(last)}


def _case_of(record: dict) -> dict:
    return {**{name: record.get(name) for name in CASE_FIELDS}, "timings_s": {}, "checks": {}}


def _check_of(record: dict) -> dict:
    """The check's own fields, plus the record's other fields (retries, cached_lowering, check_s)."""
    known = {*CASE_FIELDS, *CHECK_FIELDS, "check", "timings_s"}
    extra = {name: value for name, value in record.items() if name not in known}
    return {**{name: record.get(name) for name in CHECK_FIELDS}, **extra}


def check_order(document: dict) -> tuple[str, ...]:
    """The document's check names in column order (reports without columns: as they come)."""
    return tuple(column["name"] for column in document.get("checks") or ())


def build(
    records: list[CheckRecord],
    environment: dict,
    run_id: str,
    soc: str,
    columns: list[Column],
    provenance: dict | None = None,
) -> dict:
    """The report document of one SoC; records of other SoCs are ignored. columns: every check's column,
    in report order (those with no record here are left out). provenance: what made the programs and what
    each device ran them with (harness/environment.py provenance_per_soc; None: not measured)."""
    mine = [r for r in records if r.soc == soc]
    order = tuple(column["name"] for column in columns)
    cases: dict[str, dict] = {}
    for record in map(asdict, mine):
        case = cases.setdefault(record["case_id"], _case_of(record))
        case["timings_s"].update(record.get("timings_s") or {})
        case["checks"][record["check"]] = _check_of(record)
    ordered = sorted(cases.values(), key=lambda c: (c["card"], rank(DTYPES, c["dtype"]), rank(MODE_ORDER, c["mode"])))
    for case in ordered:
        case["tags"] = sorted(case["tags"] or ())
        case["checks"] = dict(sorted(case["checks"].items(), key=lambda item: rank(order, item[0])))
    present = {record.check for record in mine}
    shown = [column for column in columns if column["name"] in present]
    shown += [{"name": name, "short": name} for name in sorted(present - set(order))]
    document = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "soc": soc,
        "environment": environment,
        "checks": shown,
        "summary": tally(mine),
        "cases": ordered,
    }
    if provenance is not None:
        document["provenance"] = provenance
    return json_safe(document)


def records_of(document: dict) -> list[CheckRecord]:
    """The check records a document was built from (build's inverse, up to the case-wide timings each
    record carries): what a merge rebuilds documents from, so merged reports are built like run reports."""
    return [
        CheckRecord.from_dict(
            {
                **{name: case.get(name) for name in CASE_FIELDS},
                **check,
                "check": name,
                "timings_s": case.get("timings_s") or {},
            }
        )
        for case, name, check in checks_of(document)
    ]


def checks_of(document: dict) -> list[tuple[dict, str, dict]]:
    """(case, check name, check) for every check of the document, in report order."""
    return [(case, name, check) for case in document["cases"] for name, check in case["checks"].items()]


def problems(document: dict) -> list[tuple[dict, str, dict]]:
    """Checks that need a person: failures, and known failures that now pass."""
    return [(case, name, check) for case, name, check in checks_of(document) if Verdict(check["verdict"]).fails_run]


def with_verdict(document: dict, verdict: str) -> list[tuple[dict, str, dict]]:
    """Checks of one verdict, e.g. infra_error (the device or the lab failed: shown apart from failures)."""
    return [(case, name, check) for case, name, check in checks_of(document) if check["verdict"] == verdict]


_SIGNATURE = re.compile(r"(?:known failure \[|\[signature: )([a-z0-9_]+)")


_NAME = re.compile(r"[a-z0-9_]{1,80}")
_ANCHOR = re.compile(r"F[0-9]{1,4}")


def signature_of(check: dict) -> str:
    """The check's failure signature: the record's, or for reports written before records carried it,
    the one its known-failure description or failure line names ("" for none). Only a name's characters:
    the reports print it in code spans and ids."""
    recorded = str(check.get("signature") or "")
    if not recorded:
        match = _SIGNATURE.search(check.get("known_failure") or check.get("message") or "")
        recorded = match.group(1) if match else ""
    return recorded if _NAME.fullmatch(recorded) else ""


def finding_of(check: dict) -> str:
    """The docs/FINDINGS.md anchor (F<n>) of the known failure behind the check, or "" (see signature_of):
    only that shape, since the reports make a link of it."""
    found = str(check.get("finding") or finding_in(check.get("known_failure") or ""))
    return found if _ANCHOR.fullmatch(found) else ""


def reason_of(description: str) -> str:
    """A known failure's reason without what a list by finding already says: the `known failure [signature]: `
    head and the trailing `(docs/FINDINGS.md#F<n>; ...)` reference (harness/known_failures.py describe())."""
    reason = re.sub(r"^known failure \[[a-z0-9_]+\]: ", "", description)
    cut = reason.rfind(" (")
    return reason[:cut] if cut > 0 and reason.endswith(")") and finding_in(reason[cut:]) else reason


@dataclass(frozen=True)
class Finding:
    """Known failures of one finding (or, without one, of one manifest reason): what a report lists as one line."""

    finding: str  # F<n>, or "" for entries that name no finding
    reasons: tuple[str, ...]  # the manifest entries' reasons (reason_of), as first seen
    signatures: tuple[str, ...]
    members: tuple[tuple[dict, str, dict], ...]

    @property
    def xpassed(self) -> int:
        return sum(check["verdict"] == Verdict.XPASSED for _, _, check in self.members)


def by_finding(document: dict) -> list[Finding]:
    """The document's known failures grouped by finding, most checks first (ties: by finding number);
    entries without a finding form a group per reason, after those with one."""
    groups: dict[str, list[tuple[dict, str, dict]]] = {}
    for case, name, check in checks_of(document):
        if check["known_failure"]:
            groups.setdefault(finding_of(check) or check["known_failure"], []).append((case, name, check))
    findings = [
        Finding(
            finding_of(members[0][2]),
            tuple(dict.fromkeys(reason_of(check["known_failure"]) for _, _, check in members)),
            tuple(dict.fromkeys(signature_of(check) for _, _, check in members if signature_of(check))),
            tuple(members),
        )
        for members in groups.values()
    ]
    return sorted(
        findings, key=lambda f: (not f.finding, -len(f.members), int(f.finding[1:]) if f.finding else 0, f.reasons)
    )


@dataclass(frozen=True)
class StageTime:
    stage: str
    total_s: float
    slowest_case: str
    slowest_s: float


def stage_times(document: dict) -> list[StageTime]:
    """Seconds per stage over all cases, slowest first, each with the case that took longest."""
    per_stage: dict[str, list[tuple[float, str]]] = {}
    for case in document["cases"]:
        for stage, seconds in case["timings_s"].items():
            if isinstance(seconds, (int, float)):
                per_stage.setdefault(stage, []).append((float(seconds), case["case_id"]))
    times = [
        StageTime(stage, sum(s for s, _ in values), max(values)[1], max(values)[0])
        for stage, values in per_stage.items()
    ]
    return sorted(times, key=lambda t: -t.total_s)
