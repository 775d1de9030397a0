"""Judging a long run: does a step's cost grow with the step count?

A stateful program run for many steps (a long horizon: a decode loop of hundreds of tokens) must cost the same
at step 200 as at step 20: the same execute time, no more memory, no more QNN memory registrations. Users' long
runs fail exactly there (registrations duplicated per graph: executorch #13421, #13410, LiteRT #8818; the 2nd..Nth
execute unlike the first: LiteRT #3921), and a run judged once or at its end cannot see it. This module reads the
per-step series a device run measured (harness/outcome.py DeviceOutputs: step_times_us, step_rss_kb,
step_registrations; optionally a per-step error) and says, per series, whether it grows:

- The first execute may differ (it sets up graphs, registers the program's buffers); the 2nd..Nth must not.
- QNN memory registrations held (registered minus deregistered) must be exactly constant from the 2nd execute:
  they are counts, so any change is a change, with no noise to allow for.
- Execute time, peak RSS and error are measured with noise (a loaded host, a simulator's scheduling), so a
  series grows when the robust slope over the second half of the run (Theil-Sen: the median of the slopes
  between every two of its steps, which a few outliers or one jump cannot move) predicts a rise across that
  half larger than both
  - NOISE_FACTOR times the uncertainty the series' own spread gives that rise: sigma x sqrt(12 / n) for n
    steps (a fitted line's rise across its n points, for noise of standard deviation sigma), sigma being
    1.4826 x the median absolute residual around the line (a standard deviation that outliers do not inflate);
  - the series' floor (its Series: a fraction of its level, and an absolute amount): for execute time 25% of
    the step time (the size of regression the performance gate is built to see), so a loaded host's drift
    within a run is not growth; for peak RSS 0.2% of it and at least 256 KB.
  The second half, because warm-up (caches, the allocator growing its arenas, the simulator's first slow
  executes: 30 ms for 5 steps, then 0.2 ms, measured on counter_add) settles in the first.
- Execute time is judged against the reference program where the run timed one after each step (the health
  check's one-op program in a Module of its own, in the same process: DeviceRun.reference_us): the series
  judged is step time / reference time, floored at 25% of that ratio's level (and 50 us in the reference's
  terms). What slows the whole machine during the run (a host's load rising, a phone's thermal throttling)
  slows both alike and leaves the ratio flat; a program whose own cost grows raises it. Measured in
  bench/horizon_sensitivity.py on a loaded host (docs/DRIVERS.md): the raw rule failed 1 of 20 clean
  2048-step runs and 35 of 40 clean runs under a load ramp of +35%, the ratio rule none, catching the same
  injected growth. A run
  without the reference (a runner that cannot time one, a reference that did not lower) is judged raw, and
  its message says so.

Theil-Sen is written here with numpy (a few lines) rather than taken from scipy.stats.theilslopes: scipy is
not a requirement of the suite (it reaches the venv only through another package's dependencies, and a swapped
executorch may not bring it), and this module stays numpy-only so a reproduction bundle can carry it.

Pure: numpy only, no device or pipeline import. The horizon check turns a HorizonVerdict that is not ok into a
CheckFailure (its message(), evidence() and signature).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

# How many times the uncertainty the series' own spread gives a predicted rise it must exceed to be growth.
NOISE_FACTOR = 3.0
# Fewer steps than this in a series: too short to tell growth from warm-up (not judged, and said so).
MIN_STEPS = 16
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


@dataclass(frozen=True)
class Series:
    """How one measured series is named, counted and floored: a rise across the judged half smaller than
    max(relative_floor x its level, absolute_floor) is not growth, however steady (a page of RSS, a µs)."""

    name: str  # as a message names it
    unit: str
    signature: str  # the failure's kind, as the known-failures manifest matches it
    relative_floor: float
    absolute_floor: float


EXECUTE_TIME = Series("execute time", "us", "execute_time_grows", 0.25, 50.0)
PEAK_RSS = Series("peak RSS", "KB", "peak_rss_grows", 0.002, 256.0)
REGISTRATIONS = Series("QNN memory registrations held", "", "registrations_grow", 0.0, 0.0)
ERROR = Series(
    "error", "", "error_grows", 0.0, 0.0
)  # the floor: the caller's tolerance (long_run_verdict's error_floor)
# Execute time over the reference program's, step by step: EXECUTE_TIME's relative floor; its absolute floor is
# EXECUTE_TIME's in the reference's terms (execute_time_verdict).
EXECUTE_RATIO = replace(EXECUTE_TIME, name="execute time per reference execute", unit="", absolute_floor=0.0)


@dataclass(frozen=True)
class SeriesVerdict:
    """One series' judgement: whether it grows, over which steps, by how much per step, and why."""

    series: Series
    judged: bool  # False: too short or not measured (message says which)
    grows: bool
    first_step: int  # the steps judged (counted from 0, as the runner numbers them)
    last_step: int
    slope: float  # per step (0.0 when not judged)
    message: str
    basis: str = ""  # execute time only: "reference" (judged as its ratio to the reference's) or "raw"

    def evidence(self) -> dict:
        return {
            "series": self.series.name,
            "judged": self.judged,
            "grows": self.grows,
            "steps": [self.first_step, self.last_step],
            "slope_per_step": round(self.slope, 6),
            "message": self.message,
            **({"judged_against": self.basis} if self.basis else {}),
        }


@dataclass(frozen=True)
class HorizonVerdict:
    verdicts: tuple[SeriesVerdict, ...]

    @property
    def growing(self) -> tuple[SeriesVerdict, ...]:
        return tuple(verdict for verdict in self.verdicts if verdict.grows)

    @property
    def ok(self) -> bool:
        return not self.growing

    def message(self) -> str:
        """One line: every growing series' message (empty when none grows)."""
        return "; ".join(verdict.message for verdict in self.growing)

    @property
    def signature(self) -> str:
        """The first growing series' signature (registrations, then RSS, time, error), "" when none grows."""
        return self.growing[0].series.signature if self.growing else ""

    def evidence(self) -> dict:
        return {"horizon": [verdict.evidence() for verdict in self.verdicts]}


def theil_sen(values: np.ndarray) -> tuple[float, float]:
    """The robust line through values at x = 0..n-1: (slope, intercept), the median of the slopes between
    every two points and the median of what is left. O(n^2) pairs: a few thousand for a long run's half."""
    x = np.arange(len(values), dtype=np.float64)
    first, second = np.triu_indices(len(values), k=1)
    slope = float(np.median((values[second] - values[first]) / (x[second] - x[first])))
    return slope, float(np.median(values - slope * x))


def _not_judged(series: Series, count: int, why: str) -> SeriesVerdict:
    return SeriesVerdict(series, False, False, 0, max(count - 1, 0), 0.0, f"{series.name} not judged: {why}")


def _amount(value: float, unit: str) -> str:
    return (f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}").rstrip()


def registrations_verdict(counts: list[int]) -> SeriesVerdict:
    """Held registrations must be the same at every execute from the 2nd (index 1) on."""
    series = REGISTRATIONS
    if len(counts) < 2:
        return _not_judged(series, len(counts), "fewer than two steps" if counts else "not measured")
    later = np.asarray(counts[1:], dtype=np.float64)
    last = len(counts) - 1
    if np.all(later == later[0]):
        return SeriesVerdict(series, True, False, 1, last, 0.0, f"{series.name}: {counts[1]} at every step from 1")
    changed = 1 + int(np.argmax(later != later[0]))
    slope, _ = theil_sen(later)
    how = f"grow by {slope:.3g} per execute" if slope > 0 else "change"
    shown = ", ".join(f"{counts[step]} at step {step}" for step in sorted({0, 1, changed, last}))
    message = f"{series.name} {how} from step 1, the 2nd execute ({shown})"
    return SeriesVerdict(series, True, True, 1, last, slope, message)


@dataclass(frozen=True)
class _Fit:
    """The Theil-Sen line over a series' second half and the rise it may take (growth_verdict's rule)."""

    start: int  # the half's first step
    slope: float
    intercept: float  # the line at step start
    rise: float  # the line's rise across the half
    spread: float  # sigma of the residuals around the line
    allowed: float

    @property
    def grows(self) -> bool:
        return self.rise > self.allowed


def _fit(series: Series, values: list[float], floor: float | None) -> _Fit:
    """The rule of every noisy series (the module's docstring), over values' second half; floor: instead of
    the series' absolute floor."""
    start = len(values) // 2
    half = np.asarray(values[start:], dtype=np.float64)
    slope, intercept = theil_sen(half)
    spread = MAD_TO_SIGMA * float(np.median(np.abs(half - (intercept + slope * np.arange(len(half))))))
    allowed = max(
        NOISE_FACTOR * spread * np.sqrt(12 / len(half)),
        series.relative_floor * abs(float(np.median(half))),
        series.absolute_floor if floor is None else floor,
    )
    return _Fit(start, slope, intercept, slope * (len(half) - 1), spread, float(allowed))


def growth_verdict(series: Series, values: list[float], floor: float | None = None) -> SeriesVerdict:
    """A noisy series grows when its Theil-Sen line over the second half rises across that half by more than
    NOISE_FACTOR x the uncertainty its spread around the line gives that rise (sigma x sqrt(12 / n)) and more
    than its floor (floor: instead of the series' own; see the module's docstring)."""
    if len(values) < MIN_STEPS:
        why = f"{len(values)} steps, fewer than {MIN_STEPS}" if values else "not measured"
        return _not_judged(series, len(values), why)
    fit = _fit(series, values, floor)
    start, last, unit = fit.start, len(values) - 1, series.unit
    fitted = (
        f"{_amount(fit.intercept, unit)} at step {start} -> {_amount(fit.intercept + fit.rise, unit)} at step {last}"
    )
    if fit.grows:
        message = (
            f"{series.name} grows by {_amount(fit.slope, unit)} per step over steps {start}-{last} ({fitted} on the "
            f"Theil-Sen line; spread ±{_amount(fit.spread, unit)}, growth allowed {_amount(fit.allowed, unit)})"
        )
        return SeriesVerdict(series, True, True, start, last, fit.slope, message)
    message = f"{series.name} flat over steps {start}-{last} ({fitted}; allowed {_amount(fit.allowed, unit)})"
    return SeriesVerdict(series, True, False, start, last, fit.slope, message)


def _no_reference(step_times_us: list[float], reference_us: list[float]) -> str | None:
    """Why a run's execute time cannot be judged against its reference (None: it can): the reference must be
    timed after every step the case was (a runner that stopped timing it midway leaves nothing to pair)."""
    if not reference_us:
        return "no reference timing"
    if len(reference_us) != len(step_times_us):
        return f"reference timing for {len(reference_us)} of {len(step_times_us)} steps"
    if min(reference_us) <= 0:
        return "a reference execute timed at 0 us"
    return None


def _line_ends(values: list[float]) -> str:
    """The Theil-Sen line's ends over values, in us ("260 us -> 362 us")."""
    slope, intercept = theil_sen(np.asarray(values, dtype=np.float64))
    return f"{_amount(intercept, 'us')} -> {_amount(intercept + slope * (len(values) - 1), 'us')}"


def execute_time_verdict(step_times_us: list[float], reference_us: list[float]) -> SeriesVerdict:
    """Execute time judged as its ratio to the reference program's, step by step (the module's docstring: what
    slows the machine slows both), by growth_verdict's rule; its message in the case's us beside the
    reference's, so that a reader sees whether the reference slowed alike. Without a reference timed at every
    step: judged raw, and the message says so."""
    if len(step_times_us) < MIN_STEPS:  # not judged either way (growth_verdict says why)
        return growth_verdict(EXECUTE_TIME, step_times_us)
    missing = _no_reference(step_times_us, reference_us)
    if missing is not None:
        raw = growth_verdict(EXECUTE_TIME, step_times_us)
        return replace(raw, message=f"execute time judged raw: {missing}; {raw.message}", basis="raw")
    ratio = [step / reference for step, reference in zip(step_times_us, reference_us)]
    start, last = len(ratio) // 2, len(ratio) - 1
    reference_level = float(np.median(reference_us[start:]))
    fit = _fit(EXECUTE_RATIO, ratio, EXECUTE_TIME.absolute_floor / reference_level)
    slope_us = fit.slope * reference_level  # the ratio's growth in the case's us, at the reference's level
    measured = (
        f"the case {_line_ends(step_times_us[start:])}, the reference {_line_ends(reference_us[start:])} on "
        f"Theil-Sen lines; the ratio {fit.intercept:.3g} -> {fit.intercept + fit.rise:.3g}"
    )
    if fit.grows:
        message = (
            f"execute time grows by {_amount(slope_us, 'us')} per step against the reference program over steps "
            f"{start}-{last} ({measured}, spread ±{fit.spread:.3g}, growth allowed {fit.allowed:.3g})"
        )
    else:
        message = (
            f"execute time flat against the reference program over steps {start}-{last} ({measured}, "
            f"allowed {fit.allowed:.3g})"
        )
    return SeriesVerdict(EXECUTE_TIME, True, fit.grows, start, last, slope_us, message, "reference")


def long_run_verdict(
    step_times_us: list[int],
    step_rss_kb: list[int],
    step_registrations: list[int],
    step_errors: list[float] | None = None,
    error_floor: float = 0.0,
    step_reference_us: list[int] = (),
) -> HorizonVerdict:
    """Every measured series of one long run judged ([] for a series the run did not measure: not judged).
    step_errors: e.g. each step's worst absolute error against eager; error_floor: the rise it may take
    across the second half (the dtype's tolerance, as the caller decides); step_reference_us: the reference
    program's execute after each step (empty: execute time judged raw, and said so)."""
    verdicts = [
        registrations_verdict(list(step_registrations)),
        growth_verdict(PEAK_RSS, [float(kb) for kb in step_rss_kb]),
        execute_time_verdict([float(us) for us in step_times_us], [float(us) for us in step_reference_us]),
    ]
    if step_errors is not None:
        verdicts.append(growth_verdict(ERROR, [float(error) for error in step_errors], floor=error_floor))
    return HorizonVerdict(tuple(verdicts))
