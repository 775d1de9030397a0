"""A check's record: what one check of one case found, with its final verdict.

Decided once, on the worker that ran the check (harness/verdicts.py: known failures applied, xfail and xpass
included), and carried to the controller on pytest's own test report (as junitxml carries its properties); the reporter
(harness/reporter.py) collects them there. Plain data only: it crosses xdist's channel as a dict.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from harness.vocabulary import Verdict

# The name of the (name, value) pair in pytest's report.user_properties that carries a record's dict: pytest's own
# channel for a test's data to its reporters (junitxml reads it), which xdist forwards from its workers.
RECORD_PROPERTY = "qnnsuite_record"
# A manifest entry's reference (and so its description) names its finding as docs/FINDINGS.md#F<n>.
_FINDING = re.compile(r"FINDINGS\.md#(F[0-9]+)\b")


@dataclass(frozen=True)
class CheckRecord:
    nodeid: str
    check: str
    case_id: str
    card: str
    tags: tuple[str, ...]
    dtype: str
    mode: str
    soc: str
    verdict: Verdict  # serialized as its value, e.g. "xfailed"
    message: str = ""  # the check's one line (or the known failure's, or why it was skipped)
    known_failure: str = ""  # the manifest entry that expected a failure here, described
    evidence: dict[str, Any] = field(default_factory=dict)
    device_serial: str | None = None
    delegates: int | None = None
    retries: int = 0
    cached_lowering: bool = False
    work: dict[str, int] = field(default_factory=dict)  # the case's exports, quantizations, lowerings in this run
    timings_s: dict[str, float] = field(default_factory=dict)
    # The case's device run timing: {runner, steps_us, first_step_us, peak_rss_kb, p50_us, p90_us,
    # repeats_p50_us} (None: not run); p50/p90 from step_stats, repeats_p50_us one per --perf-repeats run
    timing: dict[str, Any] | None = None
    # The case's structural performance facts (harness/outcome.py CaseOutcome.structure; None: none recorded)
    structure: dict[str, Any] | None = None
    duration_s: float = 0.0
    check_s: float | None = None
    repro: str = ""  # the case's reproduction bundle, relative to its SoC's report folder (harness/repro/layout.py)
    signature: str = ""  # the failure's signature (a CheckFailure's, or the entry's that expected a pass); "" else
    finding: str = ""  # the docs/FINDINGS.md anchor (e.g. F1) of the known failure that explains it; "" else

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))  # a verdict's string reads as its meaning

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped (evidence may hold numpy scalars or paths: they become numbers or strings)."""
        return json.loads(json.dumps(asdict(self), default=_plain))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckRecord:
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        values["tags"] = tuple(values.get("tags") or ())
        if "verdict" in values:  # without one, the record is torn: TypeError below
            values["verdict"] = Verdict(values["verdict"])  # ValueError on a verdict no run writes
        return cls(**values)


def record_property(record: CheckRecord) -> tuple[str, dict[str, Any]]:
    """The user_properties pair that carries a record to the controller's reporter."""
    return (RECORD_PROPERTY, record.to_dict())


def carried_record(user_properties: Any) -> dict[str, Any] | None:
    """The record's dict a report's user_properties carry (None: the report is of no judged check). A pair
    may arrive as a list: xdist sends it over its channel."""
    for pair in user_properties or ():
        if isinstance(pair, (tuple, list)) and len(pair) == 2 and pair[0] == RECORD_PROPERTY:
            return pair[1]
    return None


def percentile(values: list[int], fraction: float) -> int | None:
    """The nearest-rank percentile (a measured value, never an interpolated one); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def step_stats(steps_us: list[int]) -> dict[str, int | None]:
    """p50 and p90 execute time of a run's steps after the first: the first includes load and graph set-up,
    which the later ones do not (a one-step run has none: both None). The one reading of a run's step times,
    for the record (harness/outcome.py), the reports and the performance gate (harness/report/perf_gate.py)."""
    later = [int(micros) for micros in steps_us[1:]]
    return {"p50_us": percentile(later, 0.5), "p90_us": percentile(later, 0.9)}


def finding_in(text: str) -> str:
    """The finding (F<n>) a manifest entry's reference or description names, or "": the one reading of it,
    for records (harness/verdicts.py) and for reports written before records carried it (harness/report/)."""
    match = _FINDING.search(text or "")
    return match.group(1) if match else ""


def _plain(value: object) -> object:
    item = getattr(value, "item", None)  # numpy scalars
    return item() if callable(item) else str(value)
