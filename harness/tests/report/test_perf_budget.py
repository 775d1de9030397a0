"""The phones' delegation rule takes the run's --perf-budget, not a fixed 10%: the budget
reaches report.json as the environment's perf_budget_pct, and summary.md / report.html list a finding
candidate only beyond it."""

from __future__ import annotations

import json

import jsonschema

from harness.report import write_run
from harness.report.perf_gate import DEFAULT_BUDGET_PCT, budget_of, finding_candidates
from harness.tests.report.test_perf_gate import CARD, records_with, timing
from harness.tests.report.test_report import COLUMNS, SCHEMA, environments

# A delegated case 20% slower than its skip-mode twin, on a phone.
SLOWER = {"delegate_mutbuf": timing([12000], kind="phone"), "skip_mutbuf": timing([10000], kind="phone")}


def _run(tmp_path, budget: object) -> tuple[dict, str, str]:
    envs = environments(("SM8650",))
    envs["SM8650"]["perf_budget_pct"] = budget
    folder = write_run(records_with(SLOWER), envs, tmp_path / "reports", "run1", COLUMNS)["SM8650"]
    document = json.loads((folder / "report.json").read_text())
    return document, (folder / "summary.md").read_text(), (folder / "report.html").read_text()


def test_a_budget_of_50_percent_keeps_a_20_percent_slower_delegated_case_off_the_candidates(tmp_path):
    document, summary, page = _run(tmp_path, 50.0)
    jsonschema.validate(document, SCHEMA)
    assert budget_of(document) == 50.0
    assert finding_candidates(document) == []
    assert "Finding candidates" not in summary and "Finding candidates" not in page


def test_a_budget_of_10_percent_makes_it_a_candidate_naming_the_budget(tmp_path):
    document, summary, page = _run(tmp_path, 10)
    jsonschema.validate(document, SCHEMA)
    (line,) = finding_candidates(document)
    assert line.startswith(f"{CARD} fp16 SM8650: delegated p50 step 12000 us") and "by 20% (budget 10%)" in line
    assert "Finding candidates" in summary and "by 20% \\(budget 10%\\)" in summary and "(budget 10%)" in page


def test_a_report_without_a_usable_budget_takes_the_default():
    for environment in ({}, {"perf_budget_pct": "50"}, {"perf_budget_pct": -1}, {"perf_budget_pct": True}):
        assert budget_of({"environment": environment, "cases": []}) == DEFAULT_BUDGET_PCT


def test_the_schema_refuses_a_negative_budget(tmp_path):
    document, _, _ = _run(tmp_path, 10)
    document["environment"]["perf_budget_pct"] = -5
    try:
        jsonschema.validate(document, SCHEMA)
    except jsonschema.ValidationError as error:
        assert "perf_budget_pct" in str(error.absolute_path)
    else:
        raise AssertionError("a negative budget passed the schema")
