"""The horizon judgement (harness/horizon.py) on synthetic long runs: a registration leaked per execute, memory
and execute time growing with the step count are each caught with their own message; flat noisy series (heavy
tails, a slow first execute, one jump of the allocator, a warm-up) are not. Execute time is judged against the
reference program timed after each step: the case's own growth is caught, the machine slowing both is not, and
a run without the reference is judged raw and says so."""

from __future__ import annotations

import numpy as np
import pytest

from harness import horizon

STEPS = 256


def noisy_times(rng: np.random.Generator, base: float = 600.0) -> list[int]:
    """Execute times as a loaded 2-core host gives them: a slow first execute, a warm-up, heavy-tailed noise
    (most steps within 20%, one in ten several times slower)."""
    times = base * (1 + 0.2 * rng.standard_normal(STEPS))
    spikes = rng.random(STEPS) < 0.1
    times[spikes] *= rng.uniform(2, 40, spikes.sum())
    times[0] = 25_000  # graph set-up
    times[1:8] *= 3  # warm-up
    return [int(max(t, 1)) for t in times]


def flat_rss() -> list[int]:
    """A peak RSS that settles after the first steps and then rises once by a few pages (an arena grows)."""
    rss = np.full(STEPS, 229_188)
    rss[0] = 221_000
    rss[170:] += 132
    return [int(kb) for kb in rss]


def test_a_registration_leaked_per_execute_is_caught_and_named():
    held = [1 + step for step in range(STEPS)]  # 1 at load, one more at every execute
    verdict = horizon.long_run_verdict([], [], held)
    assert not verdict.ok and verdict.signature == "registrations_grow"
    assert verdict.message() == (
        "QNN memory registrations held grow by 1 per execute from step 1, the 2nd execute "
        "(1 at step 0, 2 at step 1, 3 at step 2, 256 at step 255)"
    )


def test_registrations_constant_from_the_second_execute_pass_and_the_first_may_differ():
    verdict = horizon.long_run_verdict([], [], [3] + [5] * (STEPS - 1))
    assert verdict.ok, verdict.message()
    # one more registration late in the run, never released: a change, however small
    late = [3] + [5] * 200 + [6] * (STEPS - 201)
    changed = horizon.long_run_verdict([], [], late)
    assert not changed.ok and "change from step 1" in changed.message() and "6 at step 201" in changed.message()


def test_rss_growing_by_a_page_per_step_is_caught():
    rss = [229_188 + 4 * step for step in range(STEPS)]
    verdict = horizon.long_run_verdict([], rss, [])
    assert [v.series.name for v in verdict.growing] == ["peak RSS"] and verdict.signature == "peak_rss_grows"
    assert verdict.message().startswith("peak RSS grows by 4 KB per step over steps 128-255")


def test_execute_time_growing_with_the_step_count_is_caught_through_the_noise():
    rng = np.random.default_rng(7)
    times = [int(t * (1 + step / 100)) for step, t in enumerate(noisy_times(rng))]  # 2.3x to 3.5x over the half
    verdict = horizon.long_run_verdict(times, [], [])
    assert verdict.signature == "execute_time_grows", [v.message for v in verdict.verdicts]
    assert "execute time grows by" in verdict.message() and "over steps 128-255" in verdict.message()


def test_a_growing_error_is_caught_only_past_its_floor():
    errors = [0.001 * step for step in range(STEPS)]  # 0.128 across the second half
    assert horizon.long_run_verdict([], [], [], errors, error_floor=0.05).signature == "error_grows"
    assert horizon.long_run_verdict([], [], [], errors, error_floor=0.5).ok


@pytest.mark.parametrize("seed", range(20))
def test_flat_noisy_series_do_not_fail(seed):
    """A clean long run: noisy time, settled RSS with one arena jump, constant registrations; 20 seeds."""
    rng = np.random.default_rng(seed)
    verdict = horizon.long_run_verdict(noisy_times(rng), flat_rss(), [2] + [2] * (STEPS - 1))
    assert verdict.ok, verdict.message()
    assert all(v.judged for v in verdict.verdicts)


def test_a_short_or_unmeasured_series_is_not_judged_and_says_why():
    verdict = horizon.long_run_verdict([500] * 8, [], [])
    assert verdict.ok
    words = [v.message for v in verdict.verdicts]
    assert words == [
        "QNN memory registrations held not judged: not measured",
        "peak RSS not judged: not measured",
        "execute time not judged: 8 steps, fewer than 16",
    ]


def test_theil_sen_ignores_outliers_that_move_a_least_squares_line():
    values = np.arange(40, dtype=np.float64) * 2 + 10
    values[[5, 17, 33]] = 10_000
    slope, intercept = horizon.theil_sen(values)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(10.0)
    assert abs(np.polyfit(np.arange(40), values, 1)[0] - 2.0) > 3, "least squares would be moved"


def test_the_evidence_names_every_series_and_its_judged_steps():
    evidence = horizon.long_run_verdict([600] * 32, [100] * 32, [1] * 32).evidence()["horizon"]
    assert [(e["series"], e["steps"], e["grows"]) for e in evidence] == [
        ("QNN memory registrations held", [1, 31], False),
        ("peak RSS", [16, 31], False),
        ("execute time", [16, 31], False),
    ]


def loaded(rng: np.random.Generator, base: float, rising: float) -> list[int]:
    """Times of a program on a host whose load rises through the run's second half: each step slower by up to
    `rising` (a third: the readback run of drv_counter long that failed raw), with the host's own noise."""
    load = 1 + rising * np.clip((np.arange(STEPS) - STEPS / 2) / (STEPS / 2), 0, 1)
    return [int(t) for t in base * load * (1 + 0.08 * rng.standard_normal(STEPS)).clip(0.5)]


def test_a_case_growing_beside_a_flat_reference_is_caught_against_it():
    rng = np.random.default_rng(3)
    reference = loaded(rng, 200.0, 0.0)
    times = [int(t + 0.8 * step) for step, t in enumerate(loaded(rng, 260.0, 0.0))]  # +0.8 us/step of its own
    verdict = horizon.long_run_verdict(times, [], [], step_reference_us=reference)
    timing = verdict.verdicts[2]
    assert verdict.signature == "execute_time_grows" and timing.evidence()["judged_against"] == "reference"
    assert timing.message.startswith("execute time grows by 0.") and "against the reference program" in timing.message
    assert "the reference 2" in timing.message, "names the reference's level, in us, at the half's start and end"


@pytest.mark.parametrize("seed", range(10))
def test_a_case_and_its_reference_slowed_alike_by_the_machine_pass(seed):
    rng = np.random.default_rng(seed)
    times, reference = loaded(rng, 260.0, 0.35), loaded(rng, 200.0, 0.35)
    raw = horizon.long_run_verdict(times, [], [])
    assert raw.signature == "execute_time_grows", "the load this test emulates must fail the raw rule"
    verdict = horizon.long_run_verdict(times, [], [], step_reference_us=reference)
    assert verdict.ok, verdict.message()
    assert verdict.verdicts[2].message.startswith("execute time flat against the reference program over steps 128-255")


def test_without_a_reference_timed_at_every_step_execute_time_is_judged_raw_and_says_so():
    rng = np.random.default_rng(5)
    times = loaded(rng, 260.0, 0.35)
    for reference, why in (([], "no reference timing"), ([200] * 100, "reference timing for 100 of 256 steps")):
        verdict = horizon.long_run_verdict(times, [], [], step_reference_us=reference)
        timing = verdict.verdicts[2]
        assert timing.evidence()["judged_against"] == "raw" and timing.grows
        assert timing.message.startswith(f"execute time judged raw: {why}; execute time grows by")
    flat = horizon.long_run_verdict([260] * STEPS, [], []).verdicts[2]
    assert not flat.grows and flat.message.startswith("execute time judged raw: no reference timing; execute time flat")
