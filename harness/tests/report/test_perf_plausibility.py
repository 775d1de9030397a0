"""A performance baseline must be a plausible measurement before the gate trusts it: a baseline of zeros, of
huge values or with one wild repeat never PASSes a 5x slower run (it WARNs, naming why), and a case whose
noise is too wide to judge a change of the budget's size WARNs "insufficient data" instead of passing.
Each figure carries the smallest change the gate could detect for its case (budget + noise band)."""

from __future__ import annotations

import pytest

from harness.report.perf_gate import FAIL, PASS, SIMULATOR_DRIFT_PCT, WARN, compare, judge
from harness.tests.report.test_perf_gate import records_with, timing

HEALTHY = [300, 305, 302]
FIVE_TIMES_SLOWER = [1500, 1510, 1505]


@pytest.mark.parametrize(
    ("baseline", "why"),
    [
        ([0, 0, 0], "implausible baseline: a p50 step of 0 us"),
        ([0, 300, 301], "implausible baseline: a p50 step of 0 us"),
        ([10**12, 10**12, 10**12], "implausible baseline: a p50 step of 1000000000000 us"),
        ([100_000, 100_500, 100_200], "implausible baseline: 67x this run's time"),
    ],
)
def test_an_absurd_baseline_never_passes_a_five_times_slower_run(baseline, why):
    judged = judge(baseline, FIVE_TIMES_SLOWER, 10.0)
    assert judged.verdict == WARN and why in judged.reason, judged


def test_one_wild_baseline_repeat_no_longer_keeps_a_five_times_slower_run_from_failing():
    """Before, its band (10000000%) made every later verdict a WARN: the gate could never fail."""
    judged = judge([300, 302, 30_000_000], FIVE_TIMES_SLOWER, 10.0)
    assert judged.verdict == FAIL and judged.band_pct < 1, judged


def test_a_wild_baseline_repeat_is_named_on_the_gate_line():
    baseline = records_with({"delegate_mutbuf": timing([0, 0, 0]), "skip_mutbuf": timing(HEALTHY)})
    slower = records_with({"delegate_mutbuf": timing(FIVE_TIMES_SLOWER), "skip_mutbuf": timing(FIVE_TIMES_SLOWER)})
    verdicts = {
        v.case_id.split("-")[2]: v for v in compare({(r.soc, r.case_id): r.timing for r in baseline}, slower, 10.0)
    }
    assert verdicts["delegate_mutbuf"].verdict == WARN
    assert verdicts["delegate_mutbuf"].line().endswith("implausible baseline: a p50 step of 0 us")
    assert verdicts["skip_mutbuf"].verdict == FAIL, "a plausible baseline still fails the slower run"


@pytest.mark.parametrize("now", [[0, 0, 0], [10**13, 10**13, 10**13]])
def test_an_absurd_measurement_now_is_a_warn_too(now):
    assert judge(HEALTHY, now, 10.0).verdict == WARN


def test_a_plausible_steady_case_passes_and_reports_what_it_could_detect():
    baseline = records_with({"delegate_mutbuf": timing(HEALTHY, kind="phone")})
    (verdict,) = compare({(r.soc, r.case_id): r.timing for r in baseline}, baseline, 10.0)
    assert verdict.verdict == PASS and verdict.detectable_pct == pytest.approx(10.0 + 2 / 300 * 100)
    entry = verdict.entry()
    assert entry["detectable_pct"] == pytest.approx(10.7) and entry["reason"] == ""
    assert "detectable 11%" in verdict.line()


def test_a_genuine_speedup_below_the_plausibility_bound_passes():
    assert judge(HEALTHY, [200, 201, 202], 10.0).verdict == PASS


def steady(repeats: list[int], fastest: list[int]) -> dict:
    return {**timing(repeats), "repeats_min_us": fastest}


def test_the_steady_state_is_compared_where_both_runs_kept_it():
    """Warm-up makes a short plan's p50 swing (here 30 ms in both runs), while each repeat's fastest later step
    holds the steady cost: a 5 ms slowdown per execute FAILs on it, beyond even the simulator's drift; the
    untouched case is a WARN "insufficient data" there, as every simulator case within the drift is."""
    baseline = records_with(
        {"delegate_mutbuf": steady([30000, 31000, 30500], [300, 310, 305]), "skip_mutbuf": steady(HEALTHY, HEALTHY)}
    )
    now = records_with(
        {
            "delegate_mutbuf": steady([30400, 31000, 30800], [5300, 5310, 5305]),
            "skip_mutbuf": steady(HEALTHY, HEALTHY),
        }
    )
    verdicts = {
        v.case_id.split("-")[2]: v for v in compare({(r.soc, r.case_id): r.timing for r in baseline}, now, 10.0)
    }
    assert verdicts["delegate_mutbuf"].verdict == FAIL and verdicts["delegate_mutbuf"].statistic == "repeats_min_us"
    assert "fastest step 300 -> 5300 us" in verdicts["delegate_mutbuf"].line()
    skipped = verdicts["skip_mutbuf"]
    assert skipped.verdict == WARN and skipped.band_pct == SIMULATOR_DRIFT_PCT, "on a simulator: the drift's band"
    assert skipped.reason.startswith("insufficient data: a noise band of 150%")


def test_a_baseline_without_the_steady_state_is_read_as_p50_on_both_sides():
    baseline = records_with({"delegate_mutbuf": timing([30000, 31000, 30500])})
    now = records_with({"delegate_mutbuf": steady([30400, 31000, 30800], [5300, 5310, 5305])})
    (verdict,) = compare({(r.soc, r.case_id): r.timing for r in baseline}, now, 10.0)
    assert verdict.statistic == "repeats_p50_us" and verdict.before_us == 30000 and verdict.verdict != FAIL
