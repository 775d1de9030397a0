"""Comparison with a baseline run: which checks got worse, and which known failures now pass.

Checks are matched by (soc, case_id, check). A regression is a check that passed in the baseline and
now fails (or passes although a known failure expected it to fail: xpassed). A fixed known failure is
a check the baseline expected to fail that now passes, so the known-failures manifest must change.
Both are changes, so a run compared with itself is always ok.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.record import CheckRecord
from harness.report.document import SCHEMA_VERSION, checks_of

Key = tuple[str, str, str]  # soc, case_id, check
# A check that passed in the baseline and is now an expected failure still regressed: somebody added
# a manifest entry for something that used to work, which the gate must show.
FAILING = ("failed", "xpassed", "xfailed")
PASSING = ("passed", "xpassed")
ABSENT = "absent"
MESSAGE_CHARS = 160


class BaselineError(ValueError):
    """A baseline or report path that cannot be read as reports."""


@dataclass(frozen=True)
class Outcome:
    verdict: str
    known_failure: str = ""
    message: str = ""

    @property
    def expected_to_fail(self) -> bool:
        return self.verdict not in PASSING and (self.verdict == "xfailed" or bool(self.known_failure))


@dataclass(frozen=True)
class Change:
    key: Key
    before: Outcome | None
    after: Outcome | None

    def line(self) -> str:
        soc, case_id, check = self.key
        before = self.before.verdict if self.before else ABSENT
        after = self.after.verdict if self.after else ABSENT
        return f"{soc} {case_id} {check} {before} -> {after}"


@dataclass(frozen=True)
class GateResult:
    regressions: tuple[Change, ...]
    fixed_known_failures: tuple[Change, ...]

    @property
    def ok(self) -> bool:
        return not self.regressions and not self.fixed_known_failures

    def lines(self) -> list[str]:
        """One line per regression and per fixed known failure, saying what to do about the latter."""
        lines = []
        for change in self.regressions:
            message = change.after.message[:MESSAGE_CHARS] if change.after else ""
            lines.append(f"regression: {change.line()}" + (f": {message}" if message else ""))
        for change in self.fixed_known_failures:
            reason = change.before.known_failure[:MESSAGE_CHARS] if change.before else ""
            lines.append(f"known failure now passes (update fixtures/known_failures.toml): {change.line()}"
                         + (f" [{reason}]" if reason else ""))
        return lines


def of_records(records: list[CheckRecord]) -> dict[Key, Outcome]:
    """This run's outcomes, straight from its records (gating runs before, or without, the report files)."""
    return {(r.soc, r.case_id, r.check): Outcome(r.verdict, r.known_failure, r.message) for r in records}


def of_document(document: dict) -> dict[Key, Outcome]:
    """A written report's outcomes, in the same shape as of_records so either side can be a baseline."""
    return {(document["soc"], case["case_id"], name): Outcome(check["verdict"], check["known_failure"], check["message"])
            for case, name, check in checks_of(document)}


def load(path: Path) -> dict[Key, Outcome]:
    """Outcomes of a report.json, or of every report.json under a folder (a run, or one SoC of it)."""
    if not path.exists():
        raise BaselineError(f"{path} does not exist: pass a report.json or a run folder such as reports/latest")
    files = [path] if path.is_file() else sorted(path.rglob("report.json"))
    if not files:
        raise BaselineError(f"no report.json under {path}: pass a report.json or a run folder such as reports/latest")
    outcomes: dict[Key, Outcome] = {}
    origin: dict[str, Path] = {}
    for file in files:
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BaselineError(f"{file} is not a readable report.json ({error})") from error
        if not isinstance(document, dict) or document.get("schema_version") != SCHEMA_VERSION:
            raise BaselineError(f"{file} is not a report.json of schema_version {SCHEMA_VERSION}")
        soc = document["soc"]
        if soc in origin:
            raise BaselineError(f"{path} holds two reports for {soc} ({origin[soc]} and {file}): pass one run folder")
        origin[soc] = file
        outcomes.update(of_document(document))
    return outcomes


def changes(before: dict[Key, Outcome], after: dict[Key, Outcome]) -> list[Change]:
    """Checks whose verdict differs, including checks present on one side only."""
    keys = sorted(before.keys() | after.keys())
    return [Change(key, before.get(key), after.get(key)) for key in keys
            if (before[key].verdict if key in before else ABSENT) != (after[key].verdict if key in after else ABSENT)]


def compare(before: dict[Key, Outcome], after: dict[Key, Outcome]) -> GateResult:
    """Only checks present on both sides count: a new or dropped case is a change, not a verdict on it."""
    common = [Change(key, before[key], after[key]) for key in sorted(before.keys() & after.keys())]
    regressions = tuple(c for c in common if c.before.verdict == "passed" and c.after.verdict in FAILING)
    fixed = tuple(c for c in common if c.before.expected_to_fail and c.after.verdict in PASSING)
    return GateResult(regressions, fixed)


def gate(records: list[CheckRecord], baseline: Path | dict[Key, Outcome]) -> GateResult:
    """This run's records against a baseline: a report.json, a folder of them, or outcomes loaded before."""
    return compare(baseline if isinstance(baseline, dict) else load(baseline), of_records(records))
