"""`python -m harness.report history DIR`: what the nights of a nightly store (harness/report/nightly/promote.py)
say together, as history.json and history.html.

`diff` compares two runs; a nightly owner asks other questions: since when has this failed, which night
broke it, which checks flip between nights (flaky across nights, which no single run can show), which
devices or cards stopped being measured, how each finding's count moves (a finding as
harness/report/nightly/issues.py names it), how a case's error moves. Every
night's reports are read through harness/report/intake.py (they are data); a night that cannot be read is
named in the history, not fatal.

Verdict classes (Verdict's `fails` and `passes`): a check *fails* when it failed (a new failure) or xfailed
(a known failure that still shows), and *passes* when it passed or xpassed (a known failure that passed: the defect did not show, the
news a nightly owner waits for, so it is listed apart and drawn in its own colour); skipped, not measured
and infrastructure errors say nothing about executorch and neither start nor end a failure. Nights are
stored whether their gate passed or not (promote records the verdict), so *failing since* counts real
failures, not only those accepted into the known-failures manifest.

Links: every row links to the night's page (report.html#cell-...) of the newest night that measured the
check, to its finding (FINDINGS.md in the night, or --docs-url) and to its bundle when the night kept it;
each square of a strip links to that night's cell. They are relative to where history.html is written,
so the store published as a folder (GitHub Pages) keeps them working; the store's nights are only read.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from html import escape
from pathlib import Path
from urllib.parse import quote

import jinja2
import markupsafe

from harness.device import kinds
from harness.files import write_atomically
from harness.report.document import checks_of, json_safe
from harness.report.gate import BaselineError, read_documents
from harness.report.nightly.issues import finding_of
from harness.report.nightly.promote import Night, gate_of, night_record, nights
from harness.report.render.page import anchor
from harness.report.render.writer import FINDINGS_NAME
from harness.repro.layout import LINK
from harness.vocabulary import Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
ABOUT_CHARS = 240
MAX_PLOTS = 120  # error plots on the page (history.json has every case): the ones that moved come first
PLOT_W, PLOT_H, LEFT, TOP, BOTTOM = 300, 110, 42, 8, 20
SHADES = ("#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")


NOT_SEALED = "not written by this user's promote (no valid seal, or its reports changed since): not read"


def verdict_class(verdict: str | None) -> str | None:
    """'fail', 'pass', or None for a verdict that says nothing about executorch (or an absent check)."""
    meaning = Verdict.of(verdict)
    if meaning is not None and meaning.fails:
        return "fail"
    return "pass" if meaning is not None and meaning.passes else None


def square_class(verdict: str | None) -> str:
    """A strip square's colour: failed, xfailed and xpassed each their own, apart from passed and the rest."""
    if verdict is None:
        return "absent"
    meaning = Verdict.of(verdict)
    return verdict if meaning is not None and meaning.measured else "other"


def finding_order(name: str) -> tuple:
    """F1, F2, F11 in numeric order, then the findings without a number by name."""
    match = re.fullmatch(r"F([0-9]+)", name)
    return (0, int(match.group(1)), "") if match else (1, 0, name)


@dataclass(frozen=True)
class NightReports:
    night: Night
    documents: dict[str, dict]  # per SoC
    problem: str = ""  # why the night's reports could not be read (then documents is empty)
    gate: str = ""  # what its gate said when it was promoted (promote.gate_of)
    promoted: str = ""  # when, from its sealed night.json

    @property
    def label(self) -> str:
        return self.night.folder.name


def read_store(store: Path) -> list[NightReports]:
    """Every night of the store, oldest first, each with its reports (or the one line saying why not)."""
    found = []
    for night in nights(store):
        record = night_record(night)
        if record is None:
            found.append(NightReports(night, {}, NOT_SEALED))
            continue
        promoted = record.get("promoted")
        promoted = promoted[:40] if isinstance(promoted, str) else ""
        try:
            documents = {document["soc"]: document for _, document in read_documents(night.folder)}
        except BaselineError as error:
            found.append(NightReports(night, {}, str(error), gate_of(record), promoted))
            continue
        found.append(NightReports(night, documents, "", gate_of(record), promoted))
    return found


def _emulated(kind_name: object) -> bool:
    kind = kinds.named(kind_name)
    return kind is not None and kind.emulated


def _device_names(document: dict) -> set[str]:
    """Devices that measured this SoC, named so the same device has the same name every night: an
    emulated device's adb address changes each run, so it is known by its SoC."""
    devices = (document.get("provenance") or {}).get("devices") or []
    if devices:
        return {
            f"emulated {document['soc']}" if _emulated(d.get("kind")) else d["serial"].rsplit("/", 1)[-1]
            for d in devices
        }
    if document["environment"].get("emulated"):
        return {f"emulated {document['soc']}"}
    serials = str(document["environment"].get("device_serial") or "")
    return {serial.strip().rsplit("/", 1)[-1] for serial in serials.split(",") if serial.strip()}


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _transitions(verdicts: list[str | None], labels: list[str]) -> dict:
    """failing since, started and stopped failing, flaky (the pass/fail class changed twice or more), and the
    nights a known failure passed (xpassed)."""
    started, stopped, since = [], [], None
    previous = None
    changes = 0
    for verdict, label in zip(verdicts, labels):
        kind = verdict_class(verdict)
        if kind is None:
            continue
        if previous is not None and kind != previous:
            changes += 1
            (started if kind == "fail" else stopped).append(label)
        if kind == "fail" and previous != "fail":
            since = label
        previous = kind
    return {
        "failing_since": since if previous == "fail" else None,
        "started_failing": started,
        "stopped_failing": stopped,
        "flaky": changes >= 2,
        "xpassed": [label for label, verdict in zip(labels, verdicts) if verdict == "xpassed"],
    }


def _presence(seen: dict[str, list[bool]], labels: list[str], kind: str) -> list[dict]:
    """Items that were measured one night and not a later one: the nights they were absent, and since
    when, if they still are."""
    missing = []
    for item, present in sorted(seen.items()):
        first = present.index(True)
        absent = [label for label, here in zip(labels[first:], present[first:]) if not here]
        if not absent:
            continue
        last_here = max(i for i, here in enumerate(present) if here)
        since = labels[last_here + 1] if last_here + 1 < len(labels) else None
        missing.append({"kind": kind, "name": item, "absent": absent, "missing_since": since})
    return missing


def _night_entry(night: NightReports) -> dict:
    """history.json's line of one night: which it is, its gate verdict, what it measured."""
    return {
        "name": night.label,
        "run_id": night.night.run_id,
        "date": night.night.date,
        "gate": night.gate,
        "promoted": night.promoted,
        "socs": sorted(night.documents),
        "problem": night.problem,
        "executorch": sorted({str(d["environment"].get("executorch")) for d in night.documents.values()}),
    }


def build(store_nights: list[NightReports]) -> dict:
    """history.json's document."""
    labels = [n.label for n in store_nights]
    count = len(labels)
    verdicts: dict[tuple[str, str, str], list[str | None]] = {}
    cards_of: dict[tuple[str, str], str] = {}
    socs: dict[str, list[bool]] = {}
    cards: dict[str, list[bool]] = {}
    devices: dict[str, list[bool]] = {}
    findings: dict[str, list[int]] = {}
    about: dict[str, str] = {}  # a finding's words: the first failure of it seen
    errors: dict[tuple[str, str, str], list[list[float] | None]] = {}
    newest: dict[tuple[str, str, str], dict] = {}  # per check: the newest night's finding and bundle
    for i, night in enumerate(store_nights):
        for soc, document in night.documents.items():
            socs.setdefault(soc, [False] * count)[i] = True
            for device in _device_names(document):
                devices.setdefault(f"{soc}: {device}", [False] * count)[i] = True
            for case, name, check in checks_of(document):
                key = (soc, case["case_id"], name)
                cards_of[key] = case["card"]
                cards.setdefault(f"{soc}: {case['card']}", [False] * count)[i] = True
                verdicts.setdefault(key, [None] * count)[i] = check["verdict"]
                finding = finding_of(name, check)
                newest[key] = {"newest": night.label, "finding": finding, "bundle": _bundle(night, soc, check)}
                if finding is not None:
                    findings.setdefault(finding, [0] * count)[i] += 1
                    about.setdefault(finding, (check["known_failure"] or check["message"])[:ABOUT_CHARS])
                steps = (check.get("evidence") or {}).get("steps")
                if isinstance(steps, list) and steps:
                    errors.setdefault(key, [None] * count)[i] = [
                        _number(step.get("max_abs_error")) if isinstance(step, dict) else math.nan for step in steps
                    ]
    # a card (device) of a SoC that was absent that night is counted once, as the SoC
    for presence in (cards, devices):
        for item, present in presence.items():
            soc_present = socs[item.split(": ", 1)[0]]
            presence[item] = [here or not soc_present[i] for i, here in enumerate(present)]
    checks = []
    for (soc, case_id, name), strip in sorted(verdicts.items()):
        checks.append(
            {
                "soc": soc,
                "case_id": case_id,
                "card": cards_of[(soc, case_id, name)],
                "check": name,
                "verdicts": strip,
                **_transitions(strip, labels),
                **newest[(soc, case_id, name)],
            }
        )
    return json_safe(
        {
            "history_version": 1,
            "nights": [_night_entry(n) for n in store_nights],
            "checks": checks,
            "missing": _presence(socs, labels, "soc")
            + _presence(cards, labels, "card")
            + _presence(devices, labels, "device"),
            "findings": [
                {"finding": name, "about": about[name], "counts": counts}
                for name, counts in sorted(findings.items(), key=lambda item: finding_order(item[0]))
            ],
            "errors": [
                {"soc": soc, "case_id": case_id, "check": name, "max_abs_error": series}
                for (soc, case_id, name), series in sorted(errors.items())
            ],
        }
    )


def _bundle(night: NightReports, soc: str, check: dict) -> str:
    """The check's bundle as a path inside the store (night/SOC/repro/<case>), "" when the night has none
    (promoted --no-bundles, or no bundle was written): a link is only made to what is there."""
    link = str(check.get("repro") or "")
    if not LINK.match(link) or not (night.night.folder / soc / link).is_dir():
        return ""
    return f"{night.label}/{soc}/{link}"


def error_plot(series: list, labels: list[str]) -> str:
    """Inline SVG: max abs error per step (log scale), one line per night, older nights lighter.
    Drawn by hand (no script, no network); the only text from the reports is escaped."""
    values = [_number(v) for steps in series if steps for v in steps]
    positive = [v for v in values if math.isfinite(v) and v > 0]
    low = math.floor(math.log10(min(positive))) - 1 if positive else -6
    high = max(math.ceil(math.log10(max(positive))) if positive else 0, low + 1)
    most = max((len(steps) for steps in series if steps), default=1)
    plot_w, plot_h = PLOT_W - LEFT - 8, PLOT_H - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + (plot_w / 2 if most == 1 else plot_w * i / (most - 1))

    def y(v: float) -> float:
        if not math.isfinite(v):
            return TOP
        return TOP + plot_h * (high - (math.log10(v) if v > 0 else low)) / (high - low)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PLOT_W}" height="{PLOT_H}" role="img" '
        'aria-label="max abs error per step, one line per night">'
    ]
    for exponent in (high, low):
        parts.append(
            f'<line x1="{LEFT}" x2="{PLOT_W - 8}" y1="{y(10.0**exponent):.1f}" y2="{y(10.0**exponent):.1f}" '
            f'stroke="#ddd"/><text x="{LEFT - 3}" y="{y(10.0**exponent) + 3:.1f}" font-size="9" '
            f'text-anchor="end">1e{exponent}</text>'
        )
    drawn = [(i, steps) for i, steps in enumerate(series) if steps]
    for rank, (i, steps) in enumerate(drawn):
        newest = rank == len(drawn) - 1
        colour = "#d62728" if newest else SHADES[min(len(SHADES) - 1, rank * len(SHADES) // max(1, len(drawn)))]
        points = " ".join(f"{x(s):.1f},{y(_number(v)):.1f}" for s, v in enumerate(steps))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="{2 if newest else 1}" points="{points}">'
            f"<title>{escape(labels[i])}: "
            + escape(", ".join(f"{_number(v):.3g}" for v in steps))
            + "</title></polyline>"
        )
    parts.append(
        f'<text x="{LEFT}" y="{PLOT_H - 5}" font-size="9">step 0</text>'
        f'<text x="{PLOT_W - 8}" y="{PLOT_H - 5}" font-size="9" text-anchor="end">step {most - 1}</text></svg>'
    )
    return "".join(parts)


def _moved(series: list) -> bool:
    present = [tuple(steps) for steps in series if steps]
    return len(set(map(repr, present))) > 1


@dataclass(frozen=True)
class Links:
    """Where history.html's links go: the store as reached from where the page is written (relative, so
    a published copy of the store keeps them), and the findings (each night's FINDINGS.md, or docs_url)."""

    store: Path
    base: str  # the store relative to the page's folder, "" or ending in "/"
    docs_url: str | None = None

    def page(self, night: str, soc: str, case_id: str = "", check: str = "") -> str:
        cell = f"#{quote(anchor(case_id, check))}" if case_id else ""
        return f"{self.base}{quote(f'{night}/{soc}/report.html')}{cell}"

    def finding(self, night: str, finding: str | None) -> str:
        if not finding or not re.fullmatch(r"F[0-9]+", finding):
            return ""
        if self.docs_url:
            return f"{self.docs_url}{FINDINGS_NAME}#{finding}"
        here = (self.store / night / FINDINGS_NAME).is_file()
        return f"{self.base}{quote(night)}/{FINDINGS_NAME}#{finding}" if here else ""

    def bundle(self, path: str) -> str:
        return f"{self.base}{quote(path)}/" if path else ""


def _deltas(counts: list[int]) -> list[tuple[int, str]]:
    """Each night's count with its change from the night before (+2, -1; "" when unchanged or first)."""
    return [(n, f"{n - counts[i - 1]:+d}" if i and n != counts[i - 1] else "") for i, n in enumerate(counts)]


def render(history: dict, links: Links) -> str:
    """history.html: self-contained (inline style and SVG, no script), every report string escaped."""
    labels = [n["name"] for n in history["nights"]]
    checks = history["checks"]
    changed = [c for c in checks if c["started_failing"] or c["stopped_failing"] or c["flaky"]]
    steady = [c for c in checks if c not in changed and any(verdict_class(v) == "fail" for v in c["verdicts"])]
    plots = sorted(history["errors"], key=lambda e: (not _moved(e["max_abs_error"]), e["soc"], e["case_id"]))
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    return environment.get_template("history.html.j2").render(
        nights=history["nights"],
        changed=changed,
        steady=steady,
        xpassed=[c for c in checks if c["xpassed"]],
        passing=len(checks) - len(changed) - len(steady),
        flaky=[c for c in checks if c["flaky"]],
        missing=history["missing"],
        findings=[{**f, "deltas": _deltas(f["counts"])} for f in history["findings"]],
        plots=[{**e, "svg": markupsafe.Markup(error_plot(e["max_abs_error"], labels))} for e in plots[:MAX_PLOTS]],
        plots_left=max(0, len(plots) - MAX_PLOTS),
        square_class=square_class,
        links=links,
    )


def write(store: Path, out: Path | None = None, docs_url: str | None = None) -> tuple[Path, Path]:
    """history.json and history.html of the store, in out (default: the store); returns both paths.
    docs_url: where FINDINGS.md is published (default: the copy promote keeps in each night)."""
    history = build(read_store(store))
    out = out or store
    out.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.relpath(store.resolve(), out.resolve())).as_posix()
    links = Links(store, "" if base == "." else quote(base) + "/", docs_url)
    write_atomically(out / "history.json", json.dumps(history, indent=1, allow_nan=False) + "\n")
    write_atomically(out / "history.html", render(history, links), errors="backslashreplace")
    return out / "history.json", out / "history.html"


def headline(history: dict) -> list[str]:
    """The lines the command prints: what started failing on the newest night, flaky checks, missing items."""
    lines = []
    newest = history["nights"][-1]["name"] if history["nights"] else None
    for c in history["checks"]:
        if c["failing_since"] and c["failing_since"] == newest and c["started_failing"]:
            lines.append(f"started failing on {newest}: {c['soc']} {c['case_id']} {c['check']}")
    for c in history["checks"]:
        if newest in c["xpassed"]:
            lines.append(f"known failure passed on {newest}: {c['soc']} {c['case_id']} {c['check']}")
    for c in history["checks"]:
        if c["flaky"]:
            lines.append(f"flaky across nights: {c['soc']} {c['case_id']} {c['check']}")
    for m in history["missing"]:
        if m["missing_since"]:
            lines.append(f"missing since {m['missing_since']}: {m['kind']} {m['name']}")
    for n in history["nights"]:
        if n["problem"]:
            lines.append(f"unreadable night {n['name']}: {n['problem']}")
    return lines
