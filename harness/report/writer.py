"""Writes a run's reports, one folder per SoC, and the line per SoC the end of a pytest run prints."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote

from harness.files import write_atomically
from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report import junit, markdown, page
from harness.report.document import Column, build, tally
from harness.report.gate import GateResult
from harness.repro import layout
from harness.vocabulary import Verdict

LATEST = "latest"
FINDINGS = REPO_ROOT / "docs" / "FINDINGS.md"


def _point_latest(report_root: Path, run_id: str) -> None:
    """Swap reports/latest to this run in one rename, so a reader never sees it missing or half made."""
    staging = report_root / f".{LATEST}.{os.getpid()}"
    staging.unlink(missing_ok=True)
    try:
        staging.symlink_to(run_id, target_is_directory=True)
        os.replace(staging, report_root / LATEST)
    finally:
        try:
            staging.unlink(missing_ok=True)  # gone after the rename; left by a failed one
        except OSError:
            pass


def write_run(
    records: list[CheckRecord],
    environments: dict[str, dict],
    report_root: Path,
    run_id: str,
    columns: list[Column],
    gate: GateResult | None = None,
    provenance: dict[str, dict] | None = None,
) -> dict[str, Path]:
    """report.json, junit.xml, summary.md and report.html (and gate.json when gated) under
    report_root/run_id/SOC/ for each SoC in the records, each file written whole or not at all; returns
    {soc: folder}. Every SoC's report.json comes first (the record of the run, should the disk fill up
    meanwhile), and `latest` moves only once every file is written: a run that could not write them all
    raises (OSError) and leaves `latest` at the last complete run. A run without records writes nothing.
    provenance: per SoC."""
    folders = {soc: report_root / run_id / soc for soc in sorted({record.soc for record in records})}
    documents = {
        soc: build(records, environments.get(soc, {"soc": soc}), run_id, soc, columns, (provenance or {}).get(soc))
        for soc in folders
    }
    for soc, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder, documents[soc])
    for soc, folder in folders.items():
        _write_views(folder, documents[soc], soc, gate)
    if folders:
        _point_latest(report_root, run_id)
    return folders


def write_soc(
    records: list[CheckRecord],
    environment: dict,
    folder: Path,
    run_id: str,
    soc: str,
    columns: list[Column],
    gate: GateResult | None = None,
    provenance: dict | None = None,
) -> None:
    """One SoC's files in folder (a run's, or a merge's), each written whole or not at all."""
    document = build(records, environment, run_id, soc, columns, provenance)
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder, document)
    _write_views(folder, document, soc, gate)


def _write_json(folder: Path, document: dict) -> None:
    write_atomically(folder / "report.json", json.dumps(document, indent=1, allow_nan=False) + "\n")


def findings_link(folder: Path) -> str:
    """docs/FINDINGS.md as a relative link from a report folder, so a finding's anchor opens from the page
    and summary.md wherever --report-dir put them on this machine (a link that works elsewhere: docs/ci.md)."""
    return quote(Path(os.path.relpath(FINDINGS, folder.resolve())).as_posix())  # a checkout path may hold ( ) or spaces


def _write_views(folder: Path, document: dict, soc: str, gate: GateResult | None) -> None:
    """What report.json is read as (JUnit, Markdown, HTML) and the gate's verdict."""
    mine = gate.for_soc(soc) if gate is not None else None
    write_atomically(folder / "junit.xml", junit.render(document))
    # A lone surrogate (from a name or a log) is written as its escape rather than failing the file.
    findings = findings_link(folder)
    write_atomically(
        folder / "summary.md",
        markdown.render(document, mine, layout.sizes(folder), findings),
        errors="backslashreplace",
    )
    write_atomically(folder / "report.html", page.render(document, mine, findings), errors="backslashreplace")
    if mine is not None:
        write_atomically(
            folder / "gate.json",
            json.dumps(
                {"ok": mine.ok, "checks": mine.entries(), "performance": [v.entry() for v in mine.performance]},
                indent=1,
            )
            + "\n",
        )


def summary_line(records: list[CheckRecord], soc: str, html: Path | None = None, shard: str | None = None) -> str:
    """e.g. `SM8650 (shard 1/2): 120 passed, 3 failed, 10 xfailed on 127.0.0.1:5037/R5CW -> reports/<run>/SM8650/report.html`
    (zero counts other than passed and failed are left out; the devices are those that ran a case)."""
    mine = [record for record in records if record.soc == soc]
    counts = tally(mine)
    shown = ", ".join(
        f"{counts[verdict]} {verdict.spoken}" for verdict in Verdict if counts[verdict] or verdict.always_counted
    )
    devices = sorted({record.device_serial for record in mine if record.device_serial})
    return (
        f"{soc}"
        + (f" (shard {shard})" if shard else "")
        + f": {shown}"
        + (f" on {', '.join(devices)}" if devices else "")
        + (f" -> {_relative(html)}" if html else "")
    )


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
