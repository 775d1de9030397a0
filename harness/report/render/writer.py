"""Writes a run's reports, one folder per SoC, and the line per SoC the end of a pytest run prints."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from harness.device.device import device_display
from harness.files import say, write_atomically
from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report.document import Column, build, tally
from harness.report.gate import GateResult, summary as gate_summary
from harness.report.render import junit, markdown, page
from harness.repro import layout
from harness.vocabulary import Verdict

LATEST = "latest"
FINDINGS = REPO_ROOT / "docs" / "FINDINGS.md"
FINDINGS_NAME = "FINDINGS.md"  # the copy in each run folder (and so in each night of a store)
DOCS_URL_ENV = "QNNSUITE_DOCS_URL"  # where the docs are published, e.g. https://github.com/ORG/REPO/blob/main/docs/
URL = re.compile(r"^https?://[A-Za-z0-9._~:/?&=%+,;@!$*()\[\]-]+$")


class DocsUrlError(ValueError):
    """A docs base URL that is not a plain http(s) URL; the message names it and the fix."""


def docs_url(given: str | None = None) -> str | None:
    """--docs-url, else $QNNSUITE_DOCS_URL, as a base ending in "/"; None: link the run folder's own copy of
    FINDINGS.md, which travels with the folder (copies, store nights, a published folder). A CI comment
    or a page published without its run folder needs the URL."""
    value = given if given is not None else os.environ.get(DOCS_URL_ENV, "")
    if not value:
        return None
    if not URL.match(value):
        origin = "--docs-url" if given is not None else DOCS_URL_ENV
        raise DocsUrlError(
            f"{origin} {value!r} is not an http(s) URL: give the docs folder's URL, e.g. "
            "https://github.com/ORG/REPO/blob/main/docs/, or leave it unset"
        )
    return value if value.endswith("/") else value + "/"


def _run_docs_url() -> str | None:
    """The suite run's docs URL: a bad $QNNSUITE_DOCS_URL is said and the copy linked, not a lost report."""
    try:
        return docs_url()
    except DocsUrlError as error:
        say(f"qnnsuite: {error}; the reports link their own copy of FINDINGS.md")
        return None


def copy_findings(run_folder: Path) -> None:
    """The run folder's copy of docs/FINDINGS.md, which the reports link: the links then work wherever the
    folder goes, and never name this machine's checkout."""
    if FINDINGS.is_file():
        write_atomically(run_folder / FINDINGS_NAME, FINDINGS.read_text(encoding="utf-8"))


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
    url = _run_docs_url()
    if folders and url is None:
        copy_findings(report_root / run_id)
    for soc, folder in folders.items():
        _write_views(folder, documents[soc], soc, gate, url)
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
    url: str | None = None,
) -> None:
    """One SoC's files in folder (a run's, or a merge's), each written whole or not at all. url: the docs
    base URL (writer.docs_url); None: the caller copies FINDINGS.md into folder's parent (copy_findings)."""
    document = build(records, environment, run_id, soc, columns, provenance)
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder, document)
    _write_views(folder, document, soc, gate, url)


def _write_json(folder: Path, document: dict) -> None:
    write_atomically(folder / "report.json", json.dumps(document, indent=1, allow_nan=False) + "\n")


def findings_link(url: str | None) -> str:
    """FINDINGS.md as a SoC folder's page and summary.md reach it: under the docs URL, else the run
    folder's copy (relative, so it works from any copy of the folder)."""
    return f"{url}{FINDINGS_NAME}" if url else f"../{FINDINGS_NAME}"


def _write_views(folder: Path, document: dict, soc: str, gate: GateResult | None, url: str | None) -> None:
    """What report.json is read as (JUnit, Markdown, HTML) and the gate's verdict."""
    mine = gate.for_soc(soc) if gate is not None else None
    write_atomically(folder / "junit.xml", junit.render(document))
    # A lone surrogate (from a name or a log) is written as its escape rather than failing the file.
    findings = findings_link(url)
    write_atomically(
        folder / "summary.md",
        markdown.render(document, mine, layout.sizes(folder), findings),
        errors="backslashreplace",
    )
    write_atomically(folder / "report.html", page.render(document, mine, findings), errors="backslashreplace")
    if mine is not None:
        write_atomically(folder / "gate.json", json.dumps(gate_summary(mine), indent=1) + "\n")


def summary_line(
    records: list[CheckRecord], soc: str, html: Path | None = None, shard: str | None = None, emulated: bool = False
) -> str:
    """e.g. `SM8650 (shard 1/2): 120 passed, 3 failed, 10 xfailed on R5CW -> reports/<run>/SM8650/report.html`
    (zero counts other than passed and failed are left out; the devices are those that ran a case, named as
    device_display names them: emulated, the SoC's environment says)."""
    mine = [record for record in records if record.soc == soc]
    counts = tally(mine)
    shown = ", ".join(
        f"{counts[verdict]} {verdict.spoken}" for verdict in Verdict if counts[verdict] or verdict.always_counted
    )
    devices = sorted({device_display(r.device_serial, soc, emulated) for r in mine if r.device_serial})
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
