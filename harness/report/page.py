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

from harness.report.chart import error_chart
from harness.report.document import check_order, known_failures, problems, rank, stage_times, with_verdict
from harness.repro.layout import LINK
from harness.text import printable
from harness.vocabulary import DTYPES, MODE_ORDER, VERDICTS

TEMPLATES = Path(__file__).resolve().parent / "templates"
LABELS = {
    "passed": "pass",
    "failed": "FAIL",
    "xpassed": "XPASS",
    "xfailed": "xfail",
    "skipped": "skip",
    "not_measured": "n/m",
    "infra_error": "INFRA",
}
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

    @property
    def label(self) -> str:
        return LABELS.get(self.verdict, self.verdict)

    @property
    def title(self) -> str:
        head = f"{self.card} · {self.dtype} · {MODE_LABELS.get(self.mode, self.mode)} · {self.check}: {self.label}"
        return head + (f"\n{self.message}" if self.message else "")

    @property
    def expandable(self) -> bool:
        """Everything but a plain pass or skip opens to its details; state passes too, for their chart."""
        return self.verdict not in ("passed", "skipped") or bool(self.chart)


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
    shown = evidence if check["verdict"] != "passed" else {}  # a pass's numbers are in its chart's tooltips
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
    )


def _matrix(document: dict) -> dict:
    cases = document["cases"]
    dtypes = sorted({c["dtype"] for c in cases}, key=lambda d: rank(DTYPES, d))
    modes = sorted({c["mode"] for c in cases}, key=lambda m: rank(MODE_ORDER, m))
    checks = sorted({name for c in cases for name in c["checks"]}, key=lambda n: rank(check_order(document), n))
    columns = [(dtype, mode, check) for dtype in dtypes for mode in modes for check in checks]
    by_key = {(c["card"], c["dtype"], c["mode"]): c for c in cases}
    rows = []
    for card in sorted({c["card"] for c in cases}):
        cells = []
        for index, (dtype, mode, check_name) in enumerate(columns):
            case = by_key.get((card, dtype, mode))
            check = case["checks"].get(check_name) if case else None
            cells.append(_cell(case, check_name, check, index > len(columns) / 2) if check else None)
        verdicts = [c.verdict for c in cells if c]
        tags = next(c["tags"] for c in cases if c["card"] == card)
        rows.append(
            {
                "card": card,
                "tags": tags,
                "cells": cells,
                "failures": sum(v in ("failed", "xpassed") for v in verdicts),
                "infrastructure": verdicts.count("infra_error"),
                "xfails": verdicts.count("xfailed"),
            }
        )
    return {"dtypes": dtypes, "modes": modes, "checks": checks, "rows": rows, "group_size": len(checks)}


def _environment_rows(environment: dict) -> list[list[tuple[str, str]]]:
    keys = [k for k in ENVIRONMENT_FIRST if k in environment] + sorted(
        k for k in environment if k not in ENVIRONMENT_FIRST
    )
    pairs = [(key, "" if environment[key] is None else str(environment[key])) for key in keys]
    return [pairs[i : i + ENV_PAIRS_PER_ROW] for i in range(0, len(pairs), ENV_PAIRS_PER_ROW)]


@dataclass(frozen=True)
class DeviceProvenanceRow:
    """One device's line in the page's provenance block: what ran the programs there."""

    serial: str
    kind: str
    health: str
    runner: str  # "<name> <sha256>", or what is missing
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
            _file_line(d.get("runner")),
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


def render(document: dict) -> str:
    """The whole page; StrictUndefined so a template typo fails the tests instead of rendering blank."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        finalize=visible,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    times = stage_times(document)[:SLOWEST_STAGES]
    return environment.get_template("report.html.j2").render(
        document=document,
        summary=document["summary"],
        verdicts=VERDICTS,
        labels=LABELS,
        short_checks={column["name"]: column["short"] for column in document.get("checks") or ()},
        mode_labels=MODE_LABELS,
        matrix=_matrix(document),
        environment_rows=_environment_rows(document["environment"]),
        provenance=_provenance(document),
        problems=[_cell(case, name, check, False) for case, name, check in problems(document)],
        infrastructure=[_cell(case, name, check, False) for case, name, check in with_verdict(document, "infra_error")],
        known=[
            (reason, [_cell(case, name, check, False) for case, name, check in members])
            for reason, members in known_failures(document).items()
        ],
        stage_times=times,
        slowest_total=max((t.total_s for t in times), default=0.0),
    )
