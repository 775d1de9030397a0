"""report.html of one SoC's report: the matrix a person opens every morning, rendered with jinja2.

Rows are model cards, column groups dtype x mode, one cell per check. The page is self-contained
(inline CSS, script and SVG; nothing fetched), so it opens from a CI artifact or a mail attachment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jinja2
from markupsafe import Markup

from harness.device import kinds
from harness.device.device import devices_display
from harness.report.document import (
    by_finding,
    check_order,
    checks_of,
    finding_of,
    problems,
    rank,
    stage_times,
    with_verdict,
)
from harness.report.gate import GateResult
from harness.report.perf_gate import FAIL, PASS, WARN, finding_candidates, profile_top, speedups
from harness.report.render.chart import error_chart, step_time_chart
from harness.report.structure_gate import counts as structure_counts, in_words
from harness.repro.layout import LINK
from harness.text import printable
from harness.vocabulary import DTYPES, MODE_ORDER, VERDICTS, Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
MODE_LABELS = {"delegate_mutbuf": "delegated", "skip_mutbuf": "skip_mutbuf", "meta_llama": "meta llama"}
ENVIRONMENT_FIRST = (
    "executorch",
    "torch",
    "torchao",
    "qnn_build_id",
    "bridge",
    "soc",
    "htp_arch",
    "device_model",
    "device_serial",
    "host",
    "python",
    "started",
    "finished",
)
ENV_PAIRS_PER_ROW = 4
SLOWEST_STAGES = 8
# The gate's kinds in the order the page lists them (GateResult.entries' words; "missing" also when allowed).
GATE_KINDS = ("regression", "new failure", "known failure now passes", "missing", "infrastructure error")
FINDINGS = "docs/FINDINGS.md"


@dataclass(frozen=True)
class Cell:
    """One check of one case, as the page shows it (in the matrix, and in the failure list)."""

    card: str
    dtype: str
    mode: str
    check: str
    verdict: str
    message: str
    known_failure: str
    evidence: str
    chart: Markup
    duration_s: object
    nodeid: str
    opens_left: bool
    repro: str = ""  # the case's reproduction bundle (repro/<folder>), only when it has that shape
    case_id: str = ""
    finding: str = ""  # the docs/FINDINGS.md anchor of its known failure

    @property
    def anchor(self) -> str:
        return anchor(self.case_id, self.check)

    @property
    def label(self) -> str:
        return verdict.label if (verdict := Verdict.of(self.verdict)) else self.verdict

    @property
    def title(self) -> str:
        head = f"{self.card} · {self.dtype} · {MODE_LABELS.get(self.mode, self.mode)} · {self.check}: {self.label}"
        return head + (f"\n{self.message}" if self.message else "")

    @property
    def expandable(self) -> bool:
        """Everything but a plain pass or skip opens to its details; state passes too, for their chart."""
        return self.verdict not in (Verdict.PASSED, Verdict.SKIPPED) or bool(self.chart)


def _pretty(value: object, depth: int = 0) -> str:
    """Indented JSON, but a record of plain values (such as one step's numbers) stays on one line, and
    floats show 4 significant digits: evidence is read by a person here, report.json keeps it exact."""
    pad = "  " * depth
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        items = [f"{pad}  {json.dumps(key)}: {_pretty(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(f"{pad}  {_pretty(item, depth + 1)}" for item in value) + f"\n{pad}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(key)}: {_pretty(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_pretty(item) for item in value) + "]"
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


def _cell(case: dict, check_name: str, check: dict, opens_left: bool) -> Cell:
    evidence = check["evidence"] or {}
    steps = evidence.get("steps") if isinstance(evidence.get("steps"), list) else None  # per-step numbers: a chart
    shown = evidence if check["verdict"] != Verdict.PASSED else {}  # a pass's numbers are in its chart's tooltips
    return Cell(
        case["card"],
        case["dtype"],
        case["mode"],
        check_name,
        check["verdict"],
        check["message"],
        check["known_failure"],
        _pretty(shown) if shown else "",
        Markup(error_chart(steps)) if steps else Markup(""),
        check["duration_s"],
        check["nodeid"] or "",
        opens_left,
        repro if LINK.match(repro := str(check.get("repro") or "")) else "",
        case["case_id"],
        finding_of(check),
    )


def anchor(case_id: str, check: str) -> str:
    """The id of a check's cell in the matrix: what the gate and the failure lists link to."""
    return f"cell-{case_id}-{check}"


def _table(cases: list[dict], checks: list[str]) -> dict:
    """One table of a dtype's fold: rows are the cards given, columns the (mode, check) pairs at least
    one of them has, so a column no row fills (the meta llama checks for the zoo's cards) is not drawn."""
    by_key = {(c["card"], c["mode"]): c for c in cases}
    modes = sorted({c["mode"] for c in cases}, key=lambda m: rank(MODE_ORDER, m))
    groups = [
        (mode, [name for name in checks if any(name in c["checks"] for c in cases if c["mode"] == mode)])
        for mode in modes
    ]
    groups = [(mode, names) for mode, names in groups if names]
    columns = [(mode, name, index == 0) for mode, names in groups for index, name in enumerate(names)]
    rows = []
    for card in sorted({c["card"] for c in cases}):
        cells = []
        for index, (mode, check_name, _) in enumerate(columns):
            case = by_key.get((card, mode))
            check = case["checks"].get(check_name) if case else None
            cells.append(_cell(case, check_name, check, index > len(columns) / 2) if check else None)
        verdicts = [c.verdict for c in cells if c]
        tags = next(c["tags"] for c in cases if c["card"] == card)
        rows.append(
            {
                "card": card,
                "tags": tags,
                "cells": cells,
                "failures": sum(Verdict(v).fails_run for v in verdicts),
                "infrastructure": verdicts.count(Verdict.INFRA_ERROR),
                "xfails": verdicts.count(Verdict.XFAILED),
            }
        )
    return {"groups": groups, "columns": columns, "rows": rows}


def _matrix(document: dict, flagged: set[str]) -> dict:
    """A fold per dtype (open when it holds a failure, an infrastructure error or a check the gate names, and
    the first one otherwise), and in each a table per set of modes its cards have, empty columns left out.
    flagged: the case ids the gate names."""
    cases = document["cases"]
    checks = sorted({name for c in cases for name in c["checks"]}, key=lambda n: rank(check_order(document), n))
    folds = []
    for dtype in sorted({c["dtype"] for c in cases}, key=lambda d: rank(DTYPES, d)):
        mine = [c for c in cases if c["dtype"] == dtype]
        modes_of: dict[str, tuple[str, ...]] = {}
        for case in mine:
            modes_of[case["card"]] = tuple(sorted({*modes_of.get(case["card"], ()), case["mode"]}))
        shapes = sorted(set(modes_of.values()), key=lambda modes: (-sum(m == modes for m in modes_of.values()), modes))
        tables = [_table([c for c in mine if modes_of[c["card"]] == shape], checks) for shape in shapes]
        verdicts = [check["verdict"] for c in mine for check in c["checks"].values()]
        needs_a_look = any(Verdict(v).fails_run or v == Verdict.INFRA_ERROR for v in verdicts) or any(
            c["case_id"] in flagged for c in mine
        )
        folds.append(
            {
                "dtype": dtype,
                "tables": tables,
                "counts": {v: verdicts.count(v) for v in VERDICTS if verdicts.count(v)},
                "open": needs_a_look,
                "cards": len({c["card"] for c in mine}),
            }
        )
    if folds and not any(fold["open"] for fold in folds):
        folds[0]["open"] = True
    return {"checks": checks, "folds": folds, "cards": len({c["card"] for c in cases})}


def _environment_rows(environment: dict, soc: str) -> list[list[tuple[str, str]]]:
    """The environment as key/value pairs, the devices by their short names (report.json keeps the addresses)."""
    keys = [k for k in ENVIRONMENT_FIRST if k in environment] + sorted(
        k for k in environment if k not in ENVIRONMENT_FIRST
    )
    shown = {**environment}
    if environment.get("device_serial"):
        shown["device_serial"] = devices_display(
            str(environment["device_serial"]), soc, bool(environment.get("emulated"))
        )
    pairs = [(key, "" if shown[key] is None else str(shown[key])) for key in keys]
    return [pairs[i : i + ENV_PAIRS_PER_ROW] for i in range(0, len(pairs), ENV_PAIRS_PER_ROW)]


@dataclass(frozen=True)
class DeviceProvenanceRow:
    """One device's line in the page's provenance block: what ran the programs there."""

    serial: str
    kind: str
    health: str
    runner: str  # "<name> <sha256>", or what is missing; the suite's compiled runner's after it, when pushed
    backend: str
    qnn_build_id: str


def _file_line(entry: object) -> str:
    if not isinstance(entry, dict):
        return "not measured"
    where = "pushed" if entry.get("pushed") else "host file, not pushed"
    return f"{entry.get('name')} sha256 {entry.get('sha256') or 'unreadable'} ({where})"


def _provenance(document: dict) -> dict | None:
    """The header's provenance block (None for reports without one): host versions, a row per device, warnings."""
    provenance = document.get("provenance")
    if not isinstance(provenance, dict):
        return None
    rows = [
        DeviceProvenanceRow(
            str(d.get("serial")),
            str(d.get("kind", "")),
            str(d.get("health", "")),
            "; ".join(_file_line(d.get(key)) for key in ("runner", "suite_runner") if key == "runner" or d.get(key)),
            _file_line(d.get("backend")),
            str(d.get("qnn_build_id") or "none readable"),
        )
        for d in provenance.get("devices", [])
        if isinstance(d, dict)
    ]
    return {"host": provenance.get("host", {}), "devices": rows, "warnings": provenance.get("warnings", [])}


def visible(value: object) -> object:
    """Every value the template prints, before HTML escaping: unprintable characters become their escapes.
    Markup is the page's own: the charts, which escape what they take from the report (chart.py)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


@dataclass(frozen=True)
class GateLine:
    """A check the gate names, as the page's opening section lists it (linked to its cell when it has one)."""

    case_id: str
    check: str
    before: str
    after: str
    why: str
    target: str  # the cell's anchor, "" when this run has no cell for it (a missing check)


def _gate(document: dict, gate: GateResult | None) -> dict | None:
    """The gate's section: every kind it fails on, in the gate's order, each with its checks (None: not gated)."""
    if gate is None:
        return None
    cells = {(case["case_id"], name) for case, name, _ in checks_of(document)}
    kinds: dict[str, list[GateLine]] = {kind: [] for kind in GATE_KINDS}
    for entry in gate.entries():
        kind = "missing" if entry["kind"].startswith("missing") else entry["kind"]
        key = (entry["case_id"], entry["check"])
        kinds.setdefault(kind, []).append(
            GateLine(*key, entry["before"], entry["after"], entry["why"], anchor(*key) if key in cells else "")
        )
    return {
        "ok": gate.ok,
        "baseline": gate.baseline_line(),
        "scope": gate.scope_line(),
        "allow_missing": gate.allow_missing,
        "kinds": kinds,
        "named": len(gate.entries()),
        "performance": [v for v in gate.performance if v.verdict != PASS],
        "performance_counts": {name: sum(v.verdict == name for v in gate.performance) for name in (PASS, WARN, FAIL)},
        "perf_fails_gate": gate.perf_fails_gate,
        "structure": [v for v in gate.structure if v.changes],
        "structure_counts": structure_counts(gate.structure),
    }


def _performance(document: dict) -> dict | None:
    """The step-time section: per case p50/p90 (steps after the first), the first step apart and peak memory;
    the delegation speed-up and, per card x dtype, a chart of both modes' step times; phones' finding
    candidates (harness/report/perf_gate.py). None when no case was timed."""
    timed = [case for case in document["cases"] if isinstance(case.get("timing"), dict)]
    if not timed:
        return None
    series: dict[str, dict[str, list[int]]] = {}
    for case in timed:
        series.setdefault(f"{case['card']} {case['dtype']}", {})[MODE_LABELS.get(case["mode"], case["mode"])] = list(
            case["timing"].get("steps_us") or []
        )
    return {
        "simulator": any(kinds.simulated(case["timing"].get("device_kind")) for case in timed),
        "cases": timed,
        "speedups": speedups(document),
        "candidates": finding_candidates(document),
        "profile": profile_top(document),
        "charts": [(name, Markup(step_time_chart(modes))) for name, modes in series.items()],
    }


def render(document: dict, gate: GateResult | None = None, findings_link: str = FINDINGS) -> str:
    """The whole page; StrictUndefined so a template typo fails the tests instead of rendering blank.
    gate: this SoC's gate result when the run was gated (the page then opens with it); findings_link:
    docs/FINDINGS.md as the page reaches it."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        finalize=visible,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    times = stage_times(document)[:SLOWEST_STAGES]
    gated = _gate(document, gate)
    flagged = {line.case_id for lines in gated["kinds"].values() for line in lines} if gated else set()
    return environment.get_template("report.html.j2").render(
        document=document,
        summary=document["summary"],
        verdicts=VERDICTS,
        labels={verdict.value: verdict.label for verdict in Verdict},
        spoken={verdict.value: verdict.spoken for verdict in Verdict},
        short_checks={column["name"]: column["short"] for column in document.get("checks") or ()},
        mode_labels=MODE_LABELS,
        matrix=_matrix(document, flagged),
        environment_rows=_environment_rows(document["environment"], document["soc"]),
        provenance=_provenance(document),
        gate=gated,
        findings_link=findings_link,
        problems=[_cell(case, name, check, False) for case, name, check in problems(document)],
        infrastructure=[
            _cell(case, name, check, False) for case, name, check in with_verdict(document, Verdict.INFRA_ERROR)
        ],
        findings=[
            (finding, [_cell(case, name, check, False) for case, name, check in finding.members])
            for finding in by_finding(document)
        ],
        performance=_performance(document),
        structures=[
            (case["case_id"], words) for case in document["cases"] if (words := in_words(case.get("structure")))
        ],
        stage_times=times,
        slowest_total=max((t.total_s for t in times), default=0.0),
    )
