"""One JSON line per check result, written by whichever worker ran it, read back by the report.

Lines go to <run work dir>/records/<worker>.jsonl, so workers never share a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def _verdict(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    return report.outcome


def record_of(item: pytest.Item, report: pytest.TestReport) -> dict | None:
    from harness.plugin import CHECK_RECORD

    data = item.stash.get(CHECK_RECORD, None)
    if data is None:
        return None
    case, outcome = data["case"], data["outcome"]
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) else (str(longrepr) if longrepr else "")
    if data.get("failure_line") and not message.startswith("[XPASS"):
        message = data["failure_line"]  # a check's one line (its log tail is evidence)
    return {
        "nodeid": item.nodeid, "check": data["check"], "case_id": case.id, "card": case.card.name,
        "tags": sorted(case.card.tags), "dtype": case.dtype, "mode": case.mode, "soc": case.soc,
        "verdict": _verdict(report), "message": message.strip().splitlines()[-1] if message.strip() else "",
        "known_failure": getattr(report, "wasxfail", ""), "evidence": data.get("evidence", {}),
        "device_serial": outcome.device_serial, "delegates": outcome.artifact.delegate_count,
        "retries": outcome.retries, "cached_lowering": outcome.artifact.cached,
        "timings_s": {**outcome.timings_s, "lower_wall": round(outcome.artifact.wall_s, 3)},
        "duration_s": round(report.duration, 3), "check_s": data.get("check_s"),
    }


def write(item: pytest.Item, report: pytest.TestReport) -> None:
    from harness.plugin import CONTEXT

    context = item.config.stash.get(CONTEXT, None)
    record = record_of(item, report)
    if context is None or record is None:
        return
    directory = context.work_dir / "records"
    directory.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(directory / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps(record, default=str) + "\n")


def read_all(work_dir: Path) -> list[dict]:
    records = []
    for path in sorted((work_dir / "records").glob("*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records
