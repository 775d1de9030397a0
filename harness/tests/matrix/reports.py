"""report.json documents for the matrix tests: ones the schema accepts (harness/report/report.schema.json), as the
suite writes them, since the matrix reads every combination's report through the one report reader
(harness/report/intake.py)."""

from __future__ import annotations

TAGS = {"kv_arange_init": ["kv", "nonzero_init"]}  # the card's tags as the suite writes them (sorted); others none


def case(case_id: str, soc: str) -> dict:
    """A case of a report (no checks yet); its card, dtype and mode are read from the id."""
    card, dtype, mode = case_id.split("-")[:3]
    return {
        "case_id": case_id,
        "card": card,
        "tags": TAGS.get(card, []),
        "dtype": dtype,
        "mode": mode,
        "soc": soc,
        "device_serial": "127.0.0.1:5037/emulator-5554",
        "delegates": 1,
        "timings_s": {},
        "checks": {},
    }


def document(verdicts: dict[tuple[str, str], tuple[str, str]], build_id: str, soc: str = "SM8650") -> dict:
    """A report.json with the given {(case_id, check): (verdict, message)}."""
    cases: dict[str, dict] = {}
    for (case_id, check), (verdict, message) in verdicts.items():
        found = cases.setdefault(case_id, case(case_id, soc))
        known = f"known failure [{message}]: a reason" if verdict in ("xfailed", "xpassed") else ""
        found["checks"][check] = {
            "verdict": verdict,
            "message": "" if known else message,
            "known_failure": known,
            "evidence": {},
            "duration_s": 0.5,
            "nodeid": f"suites/test_{check}.py::test_{check}[{case_id}]",
        }
    summary = {
        v: sum(c["verdict"] == v for found in cases.values() for c in found["checks"].values())
        for v in ("passed", "failed", "xpassed", "xfailed", "skipped")
    }
    return {
        "schema_version": 1,
        "soc": soc,
        "run_id": "r",
        "environment": {"qnn_build_id": build_id, "bridge": "on"},
        "summary": {**summary, "total": sum(summary.values())},
        "cases": list(cases.values()),
    }
