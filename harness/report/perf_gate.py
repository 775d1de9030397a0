"""The performance gate, beside the conformance gate (harness/report/gate.py): one body for the rule.

Where both runs timed their repeats beside the reference program (report.json timing `drift_reference`: the
health check's one-op program executed after each step in the same runner process), a case's figure is the
median over its repeats of its steady state over the reference's (each repeat's fastest step after the first,
over the reference's fastest execute): what slows both in one process (the host's load, the simulator's speed
of the hour) cancels. Its noise band is the full spread of those ratios, (largest - smallest) / smallest, the
larger of the two runs', and on an emulated device at least RATIO_DRIFT_PCT, the drift of the ratio between
clean runs measured here; the rest of the rule is as below, except that a ratio band beyond MAX_RATIO_BAND_PCT
(what a 25% regression needs) is "insufficient data". Otherwise:
A case's time is the fastest of its repeats' steady-state readings: each repeat's fastest step after the
first (report.json `repeats_min_us`; `--perf-repeats N` runs the plan N times, a fresh runner process each).
Warm-up and load on the host only ever add time, so the fastest step is the steadiest reading: the p50 of a
short plan's later steps is mostly warm-up (docs/PERFORMANCE.md). Against a baseline written before the
steady state was kept, both sides are read as their repeats' p50 step times (harness/record.py step_stats).
The noise band is the spread of those repeats, (slowest - fastest) / fastest (with three or more repeats up
to the median, so that one repeat slowed by the host's load does not widen it), the larger of the
baseline's and this run's (one repeat: no band), and on an emulated device at least SIMULATOR_DRIFT_PCT,
the drift between runs measured here that one run's repeats do not show.
The smallest change the gate can detect for the case is budget + band (`detectable_pct`, reported with each
figure). Against the baseline, growth = now / before - 1, and a case is
- PASS: growth within the budget (`--perf-budget`, default 10%), the noise measured (two repeats or more on
  both sides) and the band no wider than MAX_BAND_PCT;
- WARN: grew more than the budget, but by no more than budget + band: the noise could explain it; or
  "insufficient data": within budget + band, but the noise was not measured or its band is too wide to judge
  (a case whose noise hides a change never PASSes);
- FAIL: grew more than budget + band with the noise measured: a regression.
Before any of that, each side's repeats must be plausible measurements (plausibility): a p50 of 0 us or above
MAX_STEP_US, or a baseline more than IMPLAUSIBLE_SPEEDUP times this run's time, is a WARN naming it, never a
PASS (a baseline of zeros or of huge values would otherwise pass any slowdown).
Times are compared only between runs on the same kind of device (an emulated device's are simulator
times, never compared with a phone's). A FAIL fails the run only with `--perf-gate`. The lowering's
structural facts have a gate of their own (structure_gate.py).

Also here: the delegation speed-up of a card x dtype x SoC (skip-mode p50 over delegated p50), and, on
phones only, the finding candidate of a delegated case slower than its skip-mode twin by more than the
budget (the run's `--perf-budget`, which report.json keeps as its environment's `perf_budget_pct`, so a page
rendered again from report.json applies the budget the run was judged with). The module reads report documents and records as data; it imports nothing of the other gate.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from harness.device import kinds
from harness.record import CheckRecord, step_stats

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
# What a case's time is read from: each repeat's fastest step after the first (the steady state, where both
# runs have it), else each repeat's p50 step (reports written before the steady state was kept)
STEADY, P50, RATIO = "repeats_min_us", "repeats_p50_us", "drift_reference"
WORDS = {STEADY: "fastest step", P50: "p50 step", RATIO: "fastest step / reference"}
DEFAULT_BUDGET_PCT = 10.0
MIN_REPEATS = 2  # repeats per run, on both sides, before a growth can be told from the noise
# The simulator's drift between runs, which one run's repeats do not show: clean reruns of the same code
# moved a case's steady state by -15% to +134% at load 20 here (docs/PERFORMANCE.md, the gate's sensitivity), so on an
# emulated device the band is at least this. A phone's drift is the rack's to measure (none assumed).
SIMULATOR_DRIFT_PCT = 150.0
# The least band of a ratio to the reference program (RATIO) on an emulated device: none is needed here. In 65
# clean comparisons at load 14-22 (docs/PERFORMANCE.md, the interleaved reference) the ratio moved by -11% to
# +14% and each run's own spread of its ratios covered it (growth - band at most -1.3 points; a FAIL needs +10).
RATIO_DRIFT_PCT = 0.0
# A ratio's band beyond this cannot see a 25% regression (the default budget 10% + 15%): such a case is a WARN
# "insufficient data", never a PASS. The ratio is what is meant to see 25%; the raw times keep MAX_BAND_PCT.
MAX_RATIO_BAND_PCT = 15.0
MAX_BAND_PCT = 50.0  # a noise band wider than this cannot judge a change of the budget's size: never a PASS
MAX_STEP_US = 600_000_000  # a p50 step of more than 10 minutes is no measurement (a device run times out first)
IMPLAUSIBLE_SPEEDUP = 4.0  # a baseline this many times slower than now is suspect, not a 4x speed-up to pass
DELEGATED, SKIPPED = "delegate_mutbuf", "skip_mutbuf"

Key = tuple[str, str]  # soc, case_id


def repeats_of(timing: dict[str, Any] | None, statistic: str = P50) -> list[int]:
    """Each repeat's p50 step time of a case's timing (a report written before repeats: its one run's), or
    with statistic STEADY each repeat's fastest step after the first ([] in a report written before it)."""
    if not isinstance(timing, dict):
        return []
    repeats = timing.get(statistic)
    if statistic == STEADY:
        return (
            [int(value) for value in repeats if isinstance(value, int) and value >= 0]
            if isinstance(repeats, list)
            else []
        )
    if isinstance(repeats, list) and repeats:
        return [int(value) for value in repeats if isinstance(value, int) and value >= 0]
    steps = timing.get("steps_us")
    p50 = step_stats([int(v) for v in steps if isinstance(v, int)])["p50_us"] if isinstance(steps, list) else None
    return [p50] if p50 is not None else []


def spread(repeats: list[int]) -> float:
    """The noise band of a case's repeats, as a fraction of the fastest (0 for fewer than two): up to the
    slowest of two, up to the median of three or more (one repeat far slower than the rest is the host's
    load, not the program's noise: the band of [172, 180, 32700] is 5%, not 18906%)."""
    if len(repeats) < 2 or min(repeats) <= 0:
        return 0.0
    ordered = sorted(repeats)
    reach = ordered[-1] if len(ordered) == 2 else ordered[(len(ordered) - 1) // 2]
    return (reach - ordered[0]) / ordered[0]


@dataclass(frozen=True)
class PerfVerdict:
    soc: str
    case_id: str
    verdict: str  # PASS, WARN or FAIL
    before_us: int
    after_us: int
    growth_pct: float
    band_pct: float
    budget_pct: float
    repeats: int = 1  # the fewer of the two runs' repeats: below 2 the noise was not measured
    reason: str = ""  # why a WARN is not a PASS or a FAIL ("": the growth and the band say it)
    statistic: str = P50
    ratios: tuple[float, float] | None = None  # RATIO: the case's time over the reference's, before and now

    @property
    def detectable_pct(self) -> float:
        """The smallest growth this case could FAIL on: budget + noise band."""
        return self.budget_pct + self.band_pct

    @property
    def noise_measured(self) -> bool:
        return self.repeats >= MIN_REPEATS

    def entry(self) -> dict[str, Any]:
        """As gate.json names it."""
        return {
            "verdict": self.verdict,
            "soc": self.soc,
            "case_id": self.case_id,
            "before_p50_us": self.before_us,
            "after_p50_us": self.after_us,
            "statistic": self.statistic,
            "growth_pct": round(self.growth_pct, 1),
            "noise_band_pct": round(self.band_pct, 1),
            "budget_pct": self.budget_pct,
            "detectable_pct": round(self.detectable_pct, 1),
            "repeats": self.repeats,
            "reason": self.reason,
            **(
                {"before_ratio": round(self.ratios[0], 4), "after_ratio": round(self.ratios[1], 4)}
                if self.ratios
                else {}
            ),
        }

    def line(self) -> str:
        figures = (
            f"{self.ratios[0]:.3g} -> {self.ratios[1]:.3g} ({self.before_us} -> {self.after_us} us)"
            if self.ratios
            else f"{self.before_us} -> {self.after_us} us"
        )
        return (
            f"performance {self.verdict}: {self.soc} {self.case_id} {WORDS[self.statistic]} {figures} "
            f"({self.growth_pct:+.1f}%; budget {self.budget_pct:g}% + "
            + (
                f"noise band {self.band_pct:.1f}%: detectable {self.detectable_pct:.0f}%)"
                if self.noise_measured
                else "noise not measured: pass --perf-repeats 3 on both runs)"
            )
            + (f": {self.reason}" if self.reason else "")
        )


def implausible(repeats: list[int], side: str) -> str:
    """Why a side's repeats cannot be a measurement ("": they can): a p50 of 0 us, or beyond MAX_STEP_US."""
    if min(repeats) <= 0:
        return f"implausible {side}: a p50 step of {min(repeats)} us"
    if max(repeats) > MAX_STEP_US:
        return f"implausible {side}: a p50 step of {max(repeats)} us (over {MAX_STEP_US // 1_000_000} s)"
    return ""


def implausible_speedup(before: list[int], after: list[int]) -> str:
    """Why a baseline this much slower than now is suspect ("": it is not), never a speed-up to pass."""
    if min(before) > IMPLAUSIBLE_SPEEDUP * min(after):
        return f"implausible baseline: {min(before) / min(after):.0f}x this run's time; promote a fresh one"
    return ""


def plausible(before: list[int], after: list[int]) -> bool:
    """Both sides' times are measurements and the baseline is no suspect speed-up (judge's first rules)."""
    return not (
        implausible(before, "baseline") or implausible(after, "measurement") or implausible_speedup(before, after)
    )


@dataclass(frozen=True)
class Judgement:
    verdict: str
    growth_pct: float
    band_pct: float
    reason: str = ""


def judge(before: list[int], after: list[int], budget_pct: float, drift_pct: float = 0.0) -> Judgement:
    """The rule (the module's docstring) on a case's repeats in the baseline and now (both non-empty);
    drift_pct: the least band the device kind's drift between runs calls for."""
    band = max(spread(before) * 100, spread(after) * 100, drift_pct)
    reason = implausible(before, "baseline") or implausible(after, "measurement")
    if reason:
        return Judgement(WARN, 0.0, band, reason)
    growth = (min(after) / min(before) - 1) * 100
    if reason := implausible_speedup(before, after):
        return Judgement(WARN, growth, band, reason)
    return settle(growth, band, budget_pct, min(len(before), len(after)) >= MIN_REPEATS)


def settle(
    growth: float, band: float, budget_pct: float, measured: bool, max_band_pct: float = MAX_BAND_PCT
) -> Judgement:
    """The verdict of a plausible growth against budget + band (the module's docstring), either statistic;
    a band beyond max_band_pct is "insufficient data", never a PASS."""
    if measured and growth > budget_pct + band:
        return Judgement(FAIL, growth, band)
    if not measured:
        return Judgement(WARN, growth, band, "insufficient data")
    if band > max_band_pct:
        return Judgement(
            WARN, growth, band, f"insufficient data: a noise band of {band:.0f}% cannot tell a {budget_pct:g}% change"
        )
    if growth > budget_pct:
        return Judgement(WARN, growth, band)
    return Judgement(PASS, growth, band)


def ratios_of(timing: dict[str, Any] | None) -> list[float]:
    """Each repeat's steady state over the reference program's (timing `drift_reference`; [] without it, or
    with a reference reading of 0 us, which is no measurement)."""
    found = (timing or {}).get(RATIO) if isinstance(timing, dict) else None
    if not isinstance(found, dict):
        return []
    cases, references = found.get("case_min_us"), found.get("min_us")
    if not isinstance(cases, list) or not isinstance(references, list) or len(cases) != len(references):
        return []
    pairs = [(c, r) for c, r in zip(cases, references) if isinstance(c, int) and isinstance(r, int)]
    return [c / r for c, r in pairs] if pairs and all(r > 0 for _, r in pairs) else []


def ratio_spread(ratios: list[float]) -> float:
    """The noise band of a case's ratios, as a fraction of the smallest (0 for fewer than two): the full
    spread (a reading slowed by the load is slowed on both sides of the ratio, so none is left out)."""
    return (max(ratios) - min(ratios)) / min(ratios) if len(ratios) >= 2 and min(ratios) > 0 else 0.0


def ratio_judgement(before: list[float], after: list[float], budget_pct: float, drift_pct: float) -> Judgement:
    """The rule on the case's ratios to the reference in the baseline and now (both non-empty): growth of the
    median ratio, band the wider spread of the two (at least drift_pct)."""
    band = max(ratio_spread(before) * 100, ratio_spread(after) * 100, drift_pct)
    growth = (statistics.median(after) / statistics.median(before) - 1) * 100
    return settle(growth, band, budget_pct, min(len(before), len(after)) >= MIN_REPEATS, MAX_RATIO_BAND_PCT)


def baseline_timings(documents: list[dict]) -> dict[Key, dict]:
    """Each case's timing in the baseline's report documents (cases that did not run have none)."""
    return {
        (document["soc"], case["case_id"]): case["timing"]
        for document in documents
        for case in document["cases"]
        if isinstance(case.get("timing"), dict)
    }


def compare(baseline: dict[Key, dict], records: list[CheckRecord], budget_pct: float) -> tuple[PerfVerdict, ...]:
    """A verdict per case timed in both runs on the same kind of device, in case order."""
    now = {(r.soc, r.case_id): r.timing for r in records if isinstance(r.timing, dict)}
    verdicts = []
    for key in sorted(baseline.keys() & now.keys()):
        before_timing, after_timing = baseline[key], now[key]
        if before_timing.get("device_kind") != after_timing.get("device_kind"):
            continue  # a simulator's time and a phone's are not the same quantity
        steady = bool(repeats_of(before_timing, STEADY) and repeats_of(after_timing, STEADY))
        statistic = STEADY if steady else P50
        before, after = repeats_of(before_timing, statistic), repeats_of(after_timing, statistic)
        if not before or not after:
            continue
        simulated = kinds.simulated(after_timing.get("device_kind"))
        ratios, repeats, figures = (ratios_of(before_timing), ratios_of(after_timing)), 0, None
        if ratios[0] and ratios[1] and plausible(before, after):  # the ratio to the reference decides
            judged = ratio_judgement(*ratios, budget_pct, RATIO_DRIFT_PCT if simulated else 0.0)
            statistic, figures = RATIO, (statistics.median(ratios[0]), statistics.median(ratios[1]))
            repeats = min(len(ratios[0]), len(ratios[1]))
        else:
            judged = judge(before, after, budget_pct, SIMULATOR_DRIFT_PCT if simulated else 0.0)
            repeats = min(len(before), len(after))
        verdicts.append(
            PerfVerdict(
                key[0],
                key[1],
                judged.verdict,
                min(before),
                min(after),
                judged.growth_pct,
                judged.band_pct,
                budget_pct,
                repeats,
                judged.reason,
                statistic,
                figures,
            )
        )
    return tuple(verdicts)


@dataclass(frozen=True)
class Speedup:
    card: str
    dtype: str
    soc: str
    device_kind: str
    delegated_us: int
    skipped_us: int

    @property
    def ratio(self) -> float:
        """Skip-mode p50 over delegated p50: above 1, delegating the buffer made the steps faster."""
        return self.skipped_us / self.delegated_us if self.delegated_us > 0 else 0.0

    @property
    def simulator(self) -> bool:
        return kinds.simulated(self.device_kind)


def speedups(document: dict) -> list[Speedup]:
    """Per card x dtype x SoC with both modes timed on the same kind of device: the delegation speed-up."""
    times: dict[tuple[str, str, str], dict[str, tuple[int, str]]] = {}
    for case in document["cases"]:
        repeats = repeats_of(case.get("timing"))
        if repeats and case["mode"] in (DELEGATED, SKIPPED):
            kind = str(case["timing"].get("device_kind") or "")
            times.setdefault((case["card"], case["dtype"], case["soc"]), {})[case["mode"]] = (min(repeats), kind)
    rows = []
    for (card, dtype, soc), modes in sorted(times.items()):
        if DELEGATED in modes and SKIPPED in modes and modes[DELEGATED][1] == modes[SKIPPED][1]:
            rows.append(Speedup(card, dtype, soc, modes[DELEGATED][1], modes[DELEGATED][0], modes[SKIPPED][0]))
    return rows


def budget_of(document: dict) -> float:
    """The budget a report's run was judged with: its environment's `perf_budget_pct` (a report written
    before it was recorded, or one whose value is not a finite percentage: the default)."""
    value = (document.get("environment") or {}).get("perf_budget_pct")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return DEFAULT_BUDGET_PCT


def finding_candidates(document: dict, budget_pct: float | None = None) -> list[str]:
    """On phones only: a delegated case slower than its skip-mode twin by more than the budget, one line each
    (an emulated device's simulator says nothing about the NPU's speed, so never there). budget_pct: None
    takes the run's own (budget_of)."""
    if budget_pct is None:
        budget_pct = budget_of(document)
    return [
        f"{row.card} {row.dtype} {row.soc}: delegated p50 step {row.delegated_us} us is slower than skip-mode "
        f"{row.skipped_us} us by {(row.delegated_us / row.skipped_us - 1) * 100:.0f}% (budget {budget_pct:g}%): "
        "delegating the buffer should not cost time; a finding candidate"
        for row in speedups(document)
        if not row.simulator and row.skipped_us > 0 and row.delegated_us > row.skipped_us * (1 + budget_pct / 100)
    ]


PROFILE_TOP = 5  # events per case in summary.md and report.html (report.json keeps them all, up to its bound)


@dataclass(frozen=True)
class ProfileRow:
    case_id: str
    event: str
    unit: str
    values: tuple[float, ...]  # per step, plan order (a step the profile lacks: absent)

    @property
    def total(self) -> float:
        return sum(self.values)


def profile_top(document: dict, count: int = PROFILE_TOP) -> list[ProfileRow]:
    """Per profiled case (--profile-level), its `count` costliest backend events of its largest unit (the QNN
    per-op events' cycles, where the profile has them; values of different units are never ranked together),
    each with its value per step. Cases in report order, events by their total over the steps, largest first."""
    rows = []
    for case in document["cases"]:
        profile = (case.get("timing") or {}).get("profile")
        if not isinstance(profile, dict) or not profile.get("events"):
            continue
        per_event: dict[tuple[str, str], list[float]] = {}
        for entry in profile["events"]:
            per_event.setdefault((entry["event"], entry["unit"]), []).append(entry["value"])
        units: dict[str, int] = {}
        for _, unit in per_event:
            units[unit] = units.get(unit, 0) + 1
        unit = max(units, key=lambda name: (units[name], name == "cycles"))
        ranked = sorted(
            (
                ProfileRow(case["case_id"], event, u, tuple(values))
                for (event, u), values in per_event.items()
                if u == unit
            ),
            key=lambda row: -row.total,
        )
        rows += ranked[:count]
    return rows
