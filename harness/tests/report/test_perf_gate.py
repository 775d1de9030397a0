"""The performance gate and the step-time views: the rule (harness/report/perf_gate.py) with a
slowed input it catches and healthy ones it must not flag, the delegation speed-up and phones' finding
candidates, report.json (schema), summary.md, report.html and gate.json, and the emulated slowdown switch.
The end-to-end Must show (a slowdown injected into one mode fails the gate naming exactly those cases; two
runs without it pass) is test_perf_gate_end_to_end.py."""

from __future__ import annotations

import json
from dataclasses import replace
from html import unescape

import jsonschema
import pytest

from harness.emulator.compiled_runner import slowdown
from harness.record import CheckRecord, step_stats
from harness.report import write_run
from harness.report.gate import compare as gate_compare, of_records
from harness.report.perf_gate import (
    FAIL,
    PASS,
    WARN,
    compare,
    finding_candidates,
    judge,
    repeats_of,
    speedups,
)
from harness.report.render import page
from harness.report.render.chart import step_time_chart
from harness.tests.child_suite import run_suite
from harness.tests.report.test_report import COLUMNS, SCHEMA, environments, make_records, typed

CARD = "counter_add"


def timing(repeats: list[int], kind: str = "emulated", steps: list[int] | None = None) -> dict:
    steps = steps or [repeats[0] * 3, repeats[0], repeats[0] + 1, repeats[0] - 1]
    return {
        "runner": "suite_runner",
        "steps_us": steps,
        "first_step_us": steps[0],
        "peak_rss_kb": 133000,
        "device_kind": kind,
        **step_stats(steps),
        "repeats_p50_us": repeats,
    }


def records_with(times: dict[str, dict | None], soc: str = "SM8650") -> list[CheckRecord]:
    """The report tests' records of one card, dtype (fp16) and SoC, each case given the timing of its mode."""
    records = [record for record in make_records({CARD: ()}, (soc,)) if record["dtype"] == "fp16"]
    for record in records:
        record["timing"] = times.get(record["mode"])
    return typed(records)


def test_step_stats_are_the_steps_after_the_first_nearest_rank():
    assert step_stats([900, 10, 30, 20]) == {"p50_us": 20, "p90_us": 30}
    assert step_stats([900]) == {"p50_us": None, "p90_us": None}, "one step: only the load, no steady time"
    assert step_stats(list(range(11)))["p90_us"] == 9


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ([1000, 1010, 1005], [1000, 1020, 1003], PASS),  # the same
        ([1000, 1010, 1005], [1080, 1090, 1100], PASS),  # +8%: within a 10% budget
        ([1000, 1300], [1250, 1260, 1255], WARN),  # +25%, inside budget + the baseline's 30% band
        ([1000, 1010, 1005], [1250, 1260, 1255], FAIL),  # +25% with a 1% band: a regression
        ([1000, 1300, 1005], [1500, 1510, 1505], FAIL),  # +50%: beyond budget + band
        ([1000, 1010, 1005], [700, 720, 710], PASS),  # faster is never a regression
        ([1000], [2000], WARN),  # +100% but one repeat each: the noise was not measured, never a FAIL
        ([1000, 1010, 1005], [2000], WARN),  # one repeat on one side is not enough either
        ([1000], [1050], WARN),  # within budget, but one repeat: insufficient data, never a PASS
        ([1000, 1700], [1000, 1010, 1005], WARN),  # a 70% band cannot tell a 10% change: insufficient data
        ([1000, 1005, 1700], [1250, 1260, 1255], FAIL),  # one slow repeat of three is load: the band is 0.5%
    ],
)
def test_the_rule_fails_growth_beyond_budget_and_noise_and_only_that(before, after, expected):
    judged = judge(before, after, 10.0)
    assert judged.verdict == expected, judged


def test_the_band_is_the_noisier_of_the_two_runs_repeats():
    assert judge([1000, 1010], [1100, 1650], 10.0).band_pct == pytest.approx(50.0)


def test_compare_names_the_slowed_case_only_and_never_a_simulator_against_a_phone():
    baseline_records = records_with(
        {"delegate_mutbuf": timing([6000, 6100, 6050]), "skip_mutbuf": timing([9000, 9100])}
    )
    baseline = {(r.soc, r.case_id): r.timing for r in baseline_records}
    slowed = records_with(
        {"delegate_mutbuf": timing([206000, 206100, 206200]), "skip_mutbuf": timing([9050, 9000, 9100])}
    )
    verdicts = compare(baseline, slowed, 10.0)
    assert {v.verdict for v in verdicts if "delegate_mutbuf" in v.case_id} == {FAIL}
    assert {v.verdict for v in verdicts if "skip_mutbuf" in v.case_id} == {WARN}, "the simulator's drift: no PASS"
    on_a_phone = records_with({"delegate_mutbuf": timing([206000], kind="phone")})
    assert compare(baseline, on_a_phone, 10.0) == (), "a phone's time is not compared with a simulator's"


def test_a_report_written_before_repeats_reads_its_one_run():
    old = {"runner": "suite_runner", "steps_us": [50, 10, 30, 20], "first_step_us": 50, "peak_rss_kb": None}
    assert repeats_of(old) == [20]
    assert repeats_of(None) == [] and repeats_of({"steps_us": [5]}) == []


def test_the_conformance_gate_fails_on_a_perf_fail_only_when_asked():
    records = records_with({"delegate_mutbuf": timing([6000, 6100]), "skip_mutbuf": timing([9000, 9050])})
    result = gate_compare(of_records(records), of_records(records))
    slowed = compare(
        {(r.soc, r.case_id): r.timing for r in records}, records_with({"delegate_mutbuf": timing([60000, 60500])}), 10.0
    )
    reported = replace(result, performance=slowed)
    assert reported.ok and any("performance FAIL" in line and "reported" in line for line in reported.lines())
    gated = replace(result, performance=slowed, perf_fails_gate=True)
    assert not gated.ok and not gated.for_soc("SM8650").ok and gated.for_soc("SM8750").ok
    healthy = replace(result, performance=compare({(r.soc, r.case_id): r.timing for r in records}, records, 10.0))
    assert replace(healthy, perf_fails_gate=True).ok


def _document(records: list[CheckRecord], tmp_path) -> dict:
    folders = write_run(records, environments(("SM8650",)), tmp_path / "reports", "run1", COLUMNS)
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    return document


def test_phones_report_a_delegated_case_slower_than_its_skip_twin_simulators_never(tmp_path):
    slower = {"delegate_mutbuf": timing([13000], kind="phone"), "skip_mutbuf": timing([10000], kind="phone")}
    document = _document(records_with(slower), tmp_path / "phone")
    (line,) = finding_candidates(document)
    assert line.startswith(f"{CARD} fp16 SM8650: delegated p50 step 13000 us") and "finding candidate" in line
    faster = {"delegate_mutbuf": timing([5000], kind="phone"), "skip_mutbuf": timing([10000], kind="phone")}
    assert finding_candidates(_document(records_with(faster), tmp_path / "fast")) == []
    emulated = {"delegate_mutbuf": timing([13000]), "skip_mutbuf": timing([10000])}
    emulated_document = _document(records_with(emulated), tmp_path / "emulated")
    assert finding_candidates(emulated_document) == [], "a simulator says nothing of the NPU's speed"
    (row,) = speedups(emulated_document)
    assert row.simulator and row.ratio == pytest.approx(10000 / 13000)


def test_reports_show_p50_p90_first_step_memory_speedup_and_the_chart(tmp_path):
    records = records_with({"delegate_mutbuf": timing([6000, 6600, 6300]), "skip_mutbuf": timing([9000, 9900])})
    folders = write_run(records, environments(("SM8650",)), tmp_path / "reports", "run1", COLUMNS)
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    case = next(c for c in document["cases"] if c["mode"] == "delegate_mutbuf")
    assert case["timing"]["p50_us"] == 6000 and case["timing"]["repeats_p50_us"] == [6000, 6600, 6300]
    summary = (folders["SM8650"] / "summary.md").read_text()
    assert "## Step times (HTP simulator times on the host: not phone performance)" in summary
    assert "a simulator's ratio is not a phone's" in summary and "speed-up" not in summary
    assert (
        f"| {CARD}-fp16-delegate_mutbuf-SM8650 | simulator | 18,000 | 6,000 | 6,001 | 6,000 · 6,600 · 6,300 | 133,000 |"
        in summary
    )
    assert "1.50 |" in summary, "the speed-up: skip 9000 / delegated 6000"
    html = (folders["SM8650"] / "report.html").read_text()
    assert 'id="step-times"' in html and 'aria-label="execute time per step"' in html
    # folded by default (the page's longest part), and never read as a phone's speed
    assert '<details class="fold" id="step-times-detail"><summary>' in html
    step_times = unescape(html.split('id="step-times"')[1].split("</section>")[0])
    assert "HTP simulator times on the host: not phone performance" in step_times
    assert "(the simulator's, not a phone's)" in step_times and "speed-up" not in step_times
    assert "<summary>counter_add fp16: execute time per step, both modes</summary>" in html


def test_the_step_chart_escapes_names_and_draws_each_mode():
    svg = step_time_chart({"delegated": [10, 5, 6], '<script>alert("x")</script>': [12, 9, 9]})
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 6
    assert step_time_chart({"delegated": []}) == ""


def test_gate_json_and_the_page_name_the_performance_verdicts(tmp_path):
    baseline_records = records_with({"delegate_mutbuf": timing([6000, 6100]), "skip_mutbuf": timing([9000, 9050])})
    now = records_with({"delegate_mutbuf": timing([60000, 60100]), "skip_mutbuf": timing([9000, 9050])})
    result = replace(
        gate_compare(of_records(baseline_records), of_records(now)),
        performance=compare({(r.soc, r.case_id): r.timing for r in baseline_records}, now, 10.0),
        perf_fails_gate=True,
    )
    folders = write_run(now, environments(("SM8650",)), tmp_path / "reports", "run2", COLUMNS, result)
    gated = json.loads((folders["SM8650"] / "gate.json").read_text())
    assert gated["ok"] is False
    assert [(e["case_id"], e["verdict"]) for e in gated["performance"]] == [
        (f"{CARD}-fp16-delegate_mutbuf-SM8650", FAIL),
        (f"{CARD}-fp16-skip_mutbuf-SM8650", WARN),
    ]
    summary = (folders["SM8650"] / "summary.md").read_text()
    assert (
        "### Performance gate: 1 WARN, 1 FAIL" in summary
        and "performance FAIL: SM8650 counter_add-fp16-delegate" in summary
    )
    html = page.render(json.loads((folders["SM8650"] / "report.json").read_text()), result.for_soc("SM8650"))
    assert 'id="gate-performance"' in html and "performance FAIL: SM8650 counter_add-fp16-delegate_mutbuf" in html


@pytest.mark.parametrize(
    ("fault", "folder", "expected"),
    [
        ({"ms": 200, "match": "delegate_mutbuf"}, "counter_add-fp16-delegate_mutbuf-SM8650", (200, 0)),
        ({"pct": 25, "match": "delegate_mutbuf"}, "counter_add-fp16-delegate_mutbuf-SM8650", (0, 25)),
        ({"ms": 200, "match": "delegate_mutbuf"}, "counter_add-fp16-skip_mutbuf-SM8650", (0, 0)),
        ({"ms": "200", "pct": 2.5, "match": "delegate_mutbuf"}, "counter_add-fp16-delegate_mutbuf-SM8650", (0, 0)),
        (True, "counter_add-fp16-delegate_mutbuf-SM8650", (0, 0)),
    ],
)
def test_the_slowdown_switch_slows_only_the_cases_it_names(fault, folder, expected):
    assert slowdown(fault, folder) == expected


@pytest.mark.child_suite
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--perf-repeats", "0"], "ERROR: --perf-repeats 0: give a count of 1 or more"),
        (["--perf-budget", "-5"], "ERROR: --perf-budget -5.0: give a finite percentage of 0 or more"),
        (["--perf-budget", "nan"], "ERROR: --perf-budget nan: give a finite percentage of 0 or more"),
    ],
)
def test_a_bad_perf_option_is_one_line_naming_the_fix(argv, line):
    completed = run_suite("--collect-only", *argv, timeout=120)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 4 and line in output and "Traceback" not in output, output[-2000:]


@pytest.mark.child_suite
def test_good_perf_options_are_accepted():
    completed = run_suite(
        *("--collect-only", "--perf-repeats", "3", "--perf-budget", "0", "--perf-gate", "--compile-only"),
        *("-k", "counter_add"),
        timeout=120,
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-2000:]


def test_one_repeat_is_at_most_a_warn_that_says_so_and_the_terminal_lists_only_fails():
    records = records_with({"delegate_mutbuf": timing([6000]), "skip_mutbuf": timing([9000, 9050])})
    slower = records_with({"delegate_mutbuf": timing([60000]), "skip_mutbuf": timing([90000, 90500])})
    verdicts = compare({(r.soc, r.case_id): r.timing for r in records}, slower, 10.0)
    by_mode = {v.case_id.split("-")[2]: v for v in verdicts}
    assert by_mode["delegate_mutbuf"].verdict == WARN and "noise not measured" in by_mode["delegate_mutbuf"].line()
    assert by_mode["skip_mutbuf"].verdict == FAIL
    lines = replace(gate_compare(of_records(records), of_records(records)), performance=verdicts).lines()
    assert [line.split(" p50")[0] for line in lines] == [f"performance FAIL: SM8650 {CARD}-fp16-skip_mutbuf-SM8650"]
