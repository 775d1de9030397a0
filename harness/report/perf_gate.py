"""The performance gate, beside the conformance gate (harness/report/gate.py): one body for the rule.

A case's time is the fastest of its repeats' p50 step times (steps after the first: harness/record.py
step_stats; `--perf-repeats N` runs the plan N times, a fresh runner process each). Load on the host only
ever adds time, so the fastest repeat is the steadiest reading. The noise band is the spread of those
repeats, (slowest - fastest) / fastest, the larger of the baseline's and this run's (one repeat: no band).
Against the baseline, growth = now / before - 1, and a case is
- PASS: growth within the budget (`--perf-budget`, default 10%);
- WARN: grew more than the budget, but by no more than budget + band: the noise could explain it;
- FAIL: grew more than budget + band: a regression.
Without at least two repeats on both sides the noise is not measured, so a case is never a FAIL: at most a
WARN that says so (a single run's p50 moves by tens of percent on a loaded host: docs/PERFORMANCE.md).
Times are compared only between runs on the same kind of device (an emulated device's are simulator
times, never compared with a phone's). A FAIL fails the run only with `--perf-gate`.

Also here: the delegation speed-up of a card x dtype x SoC (skip-mode p50 over delegated p50), and, on
phones only, the finding candidate of a delegated case slower than its skip-mode twin by more than the
budget (the run's `--perf-budget`, which report.json keeps as its environment's `perf_budget_pct`, so a page
rendered again from report.json applies the budget the run was judged with). The module reads report documents and records as data; it imports nothing of the other gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.device import kinds
from harness.record import CheckRecord, step_stats

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
DEFAULT_BUDGET_PCT = 10.0
MIN_REPEATS = 2  # repeats per run, on both sides, before a growth can be told from the noise
DELEGATED, SKIPPED = "delegate_mutbuf", "skip_mutbuf"

Key = tuple[str, str]  # soc, case_id


def repeats_of(timing: dict[str, Any] | None) -> list[int]:
    """Each repeat's p50 step time of a case's timing (a report written before repeats: its one run's)."""
    if not isinstance(timing, dict):
        return []
    repeats = timing.get("repeats_p50_us")
    if isinstance(repeats, list) and repeats:
        return [int(value) for value in repeats if isinstance(value, int) and value >= 0]
    steps = timing.get("steps_us")
    p50 = step_stats([int(v) for v in steps if isinstance(v, int)])["p50_us"] if isinstance(steps, list) else None
    return [p50] if p50 is not None else []


def spread(repeats: list[int]) -> float:
    """The noise band of a case's repeats, as a fraction of the fastest (0 for fewer than two)."""
    if len(repeats) < 2 or min(repeats) <= 0:
        return 0.0
    return (max(repeats) - min(repeats)) / min(repeats)


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
            "growth_pct": round(self.growth_pct, 1),
            "noise_band_pct": round(self.band_pct, 1),
            "budget_pct": self.budget_pct,
            "repeats": self.repeats,
        }

    def line(self) -> str:
        return (
            f"performance {self.verdict}: {self.soc} {self.case_id} p50 step {self.before_us} -> {self.after_us} us "
            f"({self.growth_pct:+.1f}%; budget {self.budget_pct:g}% + "
            + (
                f"noise band {self.band_pct:.1f}%)"
                if self.noise_measured
                else "noise not measured: pass --perf-repeats 3 on both runs)"
            )
        )


def judge(before: list[int], after: list[int], budget_pct: float) -> tuple[str, float, float]:
    """The rule: (verdict, growth %, band %) of a case's repeats in the baseline and now (both non-empty)."""
    band = max(spread(before), spread(after)) * 100
    growth = (min(after) / min(before) - 1) * 100 if min(before) > 0 else 0.0
    if growth <= budget_pct:
        return PASS, growth, band
    measured = min(len(before), len(after)) >= MIN_REPEATS
    return (FAIL if measured and growth > budget_pct + band else WARN), growth, band


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
        before, after = repeats_of(before_timing), repeats_of(after_timing)
        if not before or not after:
            continue
        verdict, growth, band = judge(before, after, budget_pct)
        verdicts.append(
            PerfVerdict(
                key[0], key[1], verdict, min(before), min(after), growth, band, budget_pct, min(len(before), len(after))
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
