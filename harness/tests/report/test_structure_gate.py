"""The structural gate (harness/report/structure_gate.py) on recorded facts: every kind of fact with a change it
must catch and one it must not flag, the line that names the graph and the op, gate.json, report.json's
schema, and the conformance gate failing on a structural FAIL only with --perf-gate. Real lowerings with
injected regressions: harness/tests/pipeline/test_structure_facts.py."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import jsonschema
import pytest

from harness.report import write_run
from harness.report.gate import compare as gate_compare, of_records
from harness.report.structure_gate import (
    FAIL,
    PASS,
    WARN,
    StructureVerdict,
    baseline_structures,
    compare,
    facts_of,
    judge,
)
from harness.tests.report.test_perf_gate import records_with, timing
from harness.tests.report.test_report import COLUMNS, SCHEMA, environments
from harness.text import markdown_text

BASE = {
    "methods": {
        "forward": {
            "graphs": {
                "forward": {
                    "qnn_ops": {"ElementWiseAdd": 1, "ElementWiseMultiply": 1, "Reshape": 1},
                    "context_binary_bytes": 50000,
                    "boundary_bytes": 64,
                }
            },
            "ops_outside": {},
            "planned_arena_bytes": [64],
        }
    },
    "pte_bytes": 51000,
    "mem_register_calls_per_execute": 0,
}


def changed(edit) -> dict:
    structure = copy.deepcopy(BASE)
    edit(structure)
    return structure


def graph(structure: dict) -> dict:
    return structure["methods"]["forward"]["graphs"]["forward"]


def _transposes_and_a_cast(s: dict) -> None:
    graph(s)["qnn_ops"].update(Transpose=2, Cast=1)
    graph(s)["context_binary_bytes"] = 59000


@pytest.mark.parametrize(
    ("edit", "expected", "words"),
    [
        (lambda s: None, PASS, ""),
        (_transposes_and_a_cast, FAIL, "forward: +1 Cast, +2 Transpose, context binary +18.0% (50000 -> 59000 B)"),
        (lambda s: graph(s)["qnn_ops"].pop("Reshape"), WARN, "forward: -1 Reshape"),
        (lambda s: s["methods"]["forward"]["ops_outside"].update({"aten.mul.Tensor": 1}), FAIL, "+1 aten.mul.Tensor"),
        (lambda s: graph(s).update(context_binary_bytes=52000), WARN, "context binary +4.0%"),
        (lambda s: graph(s).update(context_binary_bytes=45000), WARN, "context binary -10.0%"),
        (lambda s: graph(s).update(boundary_bytes=96), FAIL, "bytes across the delegate boundary per execute +50.0%"),
        (lambda s: s["methods"]["forward"].update(planned_arena_bytes=[64, 32]), FAIL, "planned memory +50.0%"),
        (lambda s: s.update(pte_bytes=60000), FAIL, ".pte +17.6%"),
        (lambda s: s.update(mem_register_calls_per_execute=2), FAIL, "QnnMem_register calls per execute 0 -> 2"),
        (lambda s: s.pop("mem_register_calls_per_execute"), PASS, ""),  # not traced now: not measured, never 0
        (
            lambda s: s["methods"]["forward"]["graphs"].update({"forward[1]": copy.deepcopy(graph(s))}),
            FAIL,
            "+1 QNN graph(s) (1 -> 2)",
        ),
    ],
)
def test_each_fact_is_judged_against_its_budget_and_named(edit, expected, words):
    verdict, changes = judge(facts_of(BASE), facts_of(changed(edit)))
    assert verdict == expected, changes
    line = StructureVerdict("SM8650", "case", verdict, changes).line()
    assert (words in line) if words else (changes == () and line.endswith("unchanged")), line


def test_no_facts_on_either_side_is_no_verdict():
    records = records_with({"delegate_mutbuf": timing([6000, 6100])})
    assert compare({}, records) == ()
    assert facts_of(None) == {} and facts_of({"error": "AttributeError: x"}) == {}


def test_the_conformance_gate_fails_on_a_structure_fail_only_with_perf_gate(tmp_path):
    before = records_with({"delegate_mutbuf": timing([6000, 6100])})
    before = [replace(r, structure=BASE) for r in before]
    after = [replace(r, structure=changed(_transposes_and_a_cast)) for r in before]
    document = {"soc": "SM8650", "cases": [{"case_id": r.case_id, "structure": r.structure} for r in before]}
    verdicts = compare(baseline_structures([document]), after)
    assert {v.verdict for v in verdicts} == {FAIL}
    result = replace(gate_compare(of_records(before), of_records(after)), structure=verdicts)
    assert result.ok and any(line.startswith("structure FAIL: SM8650 counter_add") for line in result.lines())
    gated = replace(result, perf_fails_gate=True)
    assert not gated.ok and not gated.for_soc("SM8650").ok and gated.for_soc("SM8750").ok
    folders = write_run(after, environments(("SM8650",)), tmp_path / "reports", "run", COLUMNS, gated)
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["cases"][0]["structure"]["methods"]["forward"]["graphs"]["forward"]["qnn_ops"]["Transpose"] == 2
    entry = json.loads((folders["SM8650"] / "gate.json").read_text())["structure"][0]
    assert entry["verdict"] == FAIL and entry["what"].startswith("forward: +1 Cast, +2 Transpose")
    assert {"fact": "qnn_ops", "scope": "forward", "name": "Transpose", "before": 0, "after": 2, "verdict": FAIL} in (
        entry["changes"]
    )


def test_the_schema_refuses_a_structure_it_does_not_know(tmp_path):
    records = [replace(r, structure={**BASE, "free_text": 1}) for r in records_with({"delegate_mutbuf": timing([1])})]
    folders = write_run(records, environments(("SM8650",)), tmp_path / "reports", "run", COLUMNS)
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, SCHEMA)


def test_a_case_carries_the_most_qnnmem_register_calls_one_execute_made_where_the_device_traces(tmp_path):
    from types import SimpleNamespace

    from harness.outcome import CaseOutcome
    from harness.pipeline.facts import LoweringFacts, ProgramFacts

    def execute(pid: int, calls: int, registered: int) -> str:
        mem = {"register_calls": calls, "registered": registered, "deregistered": 0}
        return json.dumps({"event": "execute", "pid": pid, "inputs": [], "outputs": [], "registrations": mem}) + "\n"

    trace, old_trace = tmp_path / "trace.jsonl", tmp_path / "old.jsonl"
    # 3 calls at load and the first execute, then 1 more before the third; a second process starts from 0
    trace.write_text(execute(7, 3, 3) + execute(7, 3, 3) + execute(7, 4, 4) + execute(8, 2, 2))
    old_trace.write_text(json.dumps({"event": "execute", "inputs": [], "outputs": []}) + "\n")
    facts = LoweringFacts(structure={"methods": BASE["methods"]}, program=ProgramFacts("0" * 64, 51000))

    def outcome(traces: bool, path=trace) -> CaseOutcome:
        run = SimpleNamespace(trace=path)
        device = SimpleNamespace(has_execute_trace=traces)
        return CaseOutcome(None, [], SimpleNamespace(facts=facts), [], run=run, device=device)  # type: ignore[arg-type]

    assert outcome(True).structure == {**BASE, "mem_register_calls_per_execute": 3}
    assert "mem_register_calls_per_execute" not in outcome(False).structure, "a device without a trace says nothing"
    assert "mem_register_calls_per_execute" not in outcome(True, old_trace).structure, "an older interposer: no counts"
    assert CaseOutcome(None, [], SimpleNamespace(facts=LoweringFacts()), []).structure is None  # type: ignore[arg-type]


def test_summary_and_page_show_the_structural_gate_a_line_per_changed_fact(tmp_path):
    """summary.md and report.html give the structural gate its heading (counts per verdict), each changed case's
    line and, under it, each changed fact with its own verdict; an unchanged case is only counted."""
    before = [replace(r, structure=BASE) for r in records_with({"delegate_mutbuf": timing([6000, 6100])})]
    after = [
        replace(r, structure=changed(_transposes_and_a_cast) if r.mode == "delegate_mutbuf" else BASE) for r in before
    ]
    document = {"soc": "SM8650", "cases": [{"case_id": r.case_id, "structure": r.structure} for r in before]}
    verdicts = compare(baseline_structures([document]), after)
    gated = replace(gate_compare(of_records(before), of_records(after)), structure=verdicts)
    folders = write_run(after, environments(("SM8650",)), tmp_path / "reports", "run", COLUMNS, gated)
    summary = (folders["SM8650"] / "summary.md").read_text()
    html = (folders["SM8650"] / "report.html").read_text()
    passed = sum(v.verdict == PASS for v in verdicts)
    assert f"### Structural gate: {passed} PASS, 1 FAIL (reported only: --perf-gate fails on it)" in summary
    case = next(v.case_id for v in verdicts if v.verdict == FAIL)
    line = f"structure FAIL: SM8650 {case} forward: +1 Cast, +2 Transpose, context binary +18.0% (50000 -> 59000 B)"
    assert f"- {markdown_text(line)}" in summary
    for fact in ("forward: +1 Cast (FAIL)", "forward: +2 Transpose (FAIL)", "forward: context binary +18.0% (50000"):
        assert f"  - {markdown_text(fact)}" in summary and f"<li>{fact}" in html.replace("&gt;", ">"), fact
    assert 'id="gate-structure"' in html and f"structure FAIL: SM8650 {case}" in html
    assert summary.count("- structure ") == 1, "an unchanged case is counted, not listed"
    assert 'id="structure"' in html, "report.html lists each case's structural facts"
    assert (
        "forward: Cast 1, ElementWiseAdd 1, ElementWiseMultiply 1, Reshape 1, Transpose 2; context binary 59000 B"
        in (html)
    )
