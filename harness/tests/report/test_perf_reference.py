"""The performance gate against the interleaved reference program: where both runs timed their repeats beside
it (report.json timing `drift_reference`), a case's figure is its steady state over the reference's, so a host
twice as slow in the second run (both the case and the reference slowed) is no regression, while the case
alone 25% slower is; a ratio whose spread is too wide WARNs "insufficient data", never PASSes; a baseline
without the reference is judged as before."""

from __future__ import annotations

import pytest

from harness.report.perf_gate import (
    FAIL,
    PASS,
    RATIO,
    RATIO_DRIFT_PCT,
    STEADY,
    WARN,
    compare,
    ratio_judgement,
    ratios_of,
)
from harness.tests.report.test_perf_gate import records_with, timing

CASE = [200, 202, 201]  # the case's fastest later step per repeat
REFERENCE = [100, 100, 101]  # the reference's fastest execute in the same repeats


def beside(case: list[int], reference: list[int], kind: str = "phone") -> dict:
    return {
        **timing(case, kind=kind),
        "repeats_min_us": [case[0], *case],
        "drift_reference": {"case_min_us": case, "min_us": reference, "steps_us": [[r, r + 5] for r in reference]},
    }


def gate(before: dict, after: dict):
    baseline = records_with({"delegate_mutbuf": before})
    (verdict,) = compare({(r.soc, r.case_id): r.timing for r in baseline}, records_with({"delegate_mutbuf": after}), 10)
    return verdict


def scaled(values: list[int], factor: float) -> list[int]:
    return [round(value * factor) for value in values]


def test_a_host_twice_as_slow_slows_both_and_passes():
    """The raw steady state doubled (+100%: a FAIL by time alone on a phone); the ratio did not move."""
    verdict = gate(beside(CASE, REFERENCE), beside(scaled(CASE, 2), scaled(REFERENCE, 2)))
    assert verdict.statistic == RATIO and verdict.verdict == PASS, verdict.line()
    assert abs(verdict.growth_pct) < 2 and verdict.detectable_pct < 15
    assert "fastest step / reference 2 -> 2 (200 -> 400 us)" in verdict.line()


@pytest.mark.parametrize("kind", ["phone", "emulated"])
def test_the_case_alone_25_percent_slower_fails(kind):
    verdict = gate(beside(CASE, REFERENCE, kind), beside(scaled(CASE, 1.25), REFERENCE, kind))
    assert verdict.verdict == (FAIL if 10 + 1.5 + RATIO_DRIFT_PCT * (kind == "emulated") < 25 else WARN)
    assert verdict.entry()["before_ratio"] == 2.0 and verdict.entry()["after_ratio"] == 2.5
    assert f"detectable {verdict.detectable_pct:.0f}%" in verdict.line()


def test_a_ratio_too_noisy_to_judge_is_insufficient_data_never_pass():
    noisy = beside([200, 400, 300], REFERENCE)  # the ratio spreads by 100%
    verdict = gate(noisy, noisy)
    assert verdict.verdict == WARN and verdict.reason.startswith("insufficient data"), verdict.line()


def test_one_repeat_beside_the_reference_is_noise_not_measured():
    verdict = gate(beside([200], [100]), beside([200], [100]))
    assert verdict.verdict == WARN and verdict.reason == "insufficient data"


def test_a_baseline_without_the_reference_is_judged_on_the_steady_state():
    before = {**timing(CASE, kind="phone"), "repeats_min_us": CASE}
    verdict = gate(before, beside(CASE, REFERENCE))
    assert verdict.statistic == STEADY


def test_an_implausible_baseline_is_named_before_any_ratio():
    verdict = gate(beside([0, 0, 0], REFERENCE), beside(CASE, REFERENCE))
    assert verdict.verdict == WARN and verdict.reason.startswith("implausible baseline")


@pytest.mark.parametrize(
    "reference",
    [None, {"case_min_us": [1, 2], "min_us": [1]}, {"case_min_us": [200], "min_us": [0]}, {"min_us": [1]}, "x"],
)
def test_a_reference_record_that_is_no_measurement_gives_no_ratio(reference):
    assert ratios_of({"drift_reference": reference}) == []


def test_the_band_is_the_wider_runs_full_spread():
    judged = ratio_judgement([2.0, 2.2, 2.1], [2.0, 2.05, 2.0], 10.0, 0.0)
    assert judged.band_pct == pytest.approx(10.0) and judged.verdict == PASS


def test_a_ratio_band_that_could_hide_25_percent_is_insufficient_data_never_pass():
    """A band of 20% (detectable 30%) could hide a 25% regression: no PASS, though well within the raw times'
    MAX_BAND_PCT; at 15% (detectable 25%) the case PASSes."""
    wide = ratio_judgement([2.0, 2.4, 2.2], [2.0, 2.1, 2.05], 10.0, 0.0)
    assert wide.verdict == WARN and wide.reason.startswith("insufficient data: a noise band of 20%"), wide
    assert ratio_judgement([2.0, 2.3, 2.2], [2.0, 2.1, 2.05], 10.0, 0.0).verdict == PASS
