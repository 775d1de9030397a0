"""Comparison with a baseline run: what a nightly gate fails on.

Checks are matched by (soc, case_id, check). The gate fails on
- a regression: a check that passed in the baseline and now fails (failed, xfailed or xpassed);
- a new failure: a check that fails now, is not in the baseline and is not a known failure;
- a fixed known failure: a known failure that passes now (xpassed), or a check the baseline expected to
  fail that now passes: the known-failures manifest must change;
- a missing check: in the baseline, absent from this run (renamed, not collected, a collection error),
  or measured in the baseline and not measured now, unless missing checks are allowed (a narrowed run);
- an infrastructure error (listed apart: the device or the lab failed, so the check was not verified;
  a gate that passed on unverified checks could be fooled by a rack whose devices all fail).
A new failure is also a check that fails now where the baseline had it skipped, not measured, an
infrastructure error or a known failure (a different failure than the one expected).
A run compared with itself is ok, unless a known failure passes in it (that alone fails the gate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.record import CheckRecord
from harness.report.document import checks_of
from harness.report.intake import ReportDataError, read_report
from harness.report.perf_gate import FAIL, PerfVerdict
from harness.vocabulary import Verdict

Key = tuple[str, str, str]  # soc, case_id, check
ABSENT = "absent"
MESSAGE_CHARS = 160
ELLIPSIS = "…"


def clip(text: str, limit: int = MESSAGE_CHARS) -> str:
    """text cut to at most about limit characters at a space, with an ellipsis where it was cut: a reason is
    read by a person, and half a word (`QnnManager::Alloc`) reads as a different name. A first word longer
    than limit is kept whole."""
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    if cut <= 0:
        cut = text.find(" ", limit)
        if cut < 0:
            return text
    return text[:cut].rstrip(" ,;:") + " " + ELLIPSIS


class BaselineError(ValueError):
    """A baseline or report path that cannot be read as reports."""


class MalformedReport(BaselineError):
    """A report file that is not a valid report.json (harness/report/intake.py): bad input, exit code 4."""


@dataclass(frozen=True)
class Outcome:
    verdict: str  # a Verdict's value: report.json's schema and the records allow no other
    known_failure: str = ""
    message: str = ""

    @property
    def meaning(self) -> Verdict:
        return Verdict(self.verdict)

    @property
    def expected_to_fail(self) -> bool:
        return not self.meaning.passes and (self.verdict == Verdict.XFAILED or bool(self.known_failure))


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
    new_failures: tuple[Change, ...] = ()
    missing: tuple[Change, ...] = ()
    allow_missing: bool = False
    infrastructure: tuple[Change, ...] = ()
    # The performance gate's verdicts (harness/report/perf_gate.py); a FAIL fails the gate only when asked
    performance: tuple[PerfVerdict, ...] = ()
    perf_fails_gate: bool = False

    @property
    def perf_failures(self) -> tuple[PerfVerdict, ...]:
        return tuple(v for v in self.performance if v.verdict == FAIL)

    @property
    def ok(self) -> bool:
        return not (
            (self.perf_failures and self.perf_fails_gate)
            or self.regressions
            or self.fixed_known_failures
            or self.new_failures
            or self.infrastructure
            or (self.missing and not self.allow_missing)
        )

    def for_soc(self, soc: str) -> GateResult:
        def mine(changes: tuple[Change, ...]) -> tuple[Change, ...]:
            return tuple(c for c in changes if c.key[0] == soc)

        return GateResult(
            mine(self.regressions),
            mine(self.fixed_known_failures),
            mine(self.new_failures),
            mine(self.missing),
            self.allow_missing,
            mine(self.infrastructure),
            tuple(v for v in self.performance if v.soc == soc),
            self.perf_fails_gate,
        )

    def entries(self) -> list[dict[str, str]]:
        """Every check the gate names: {"kind", "soc", "case_id", "check", "before", "after", "why"}."""
        kinds = (
            ("regression", self.regressions),
            ("new failure", self.new_failures),
            ("known failure now passes", self.fixed_known_failures),
            ("missing" + (" (allowed)" if self.allow_missing else ""), self.missing),
            ("infrastructure error", self.infrastructure),
        )
        entries = []
        for kind, changes in kinds:
            for change in changes:
                soc, case_id, check = change.key
                if kind == "known failure now passes":
                    why = (
                        change.after.known_failure
                        if change.after and change.after.known_failure
                        else change.before.known_failure
                        if change.before
                        else ""
                    )
                elif kind.startswith("missing") and change.after is not None:
                    why = f"measured in the baseline, not measured now: {change.after.message}"
                elif kind.startswith("missing"):
                    why = "in the baseline, not in this run (renamed, not collected or a collection error?)"
                else:
                    why = change.after.message if change.after else ""
                entries.append(
                    {
                        "kind": kind,
                        "soc": soc,
                        "case_id": case_id,
                        "check": check,
                        "before": change.before.verdict if change.before else ABSENT,
                        "after": change.after.verdict if change.after else ABSENT,
                        "why": clip(why),
                    }
                )
        return entries

    def lines(self) -> list[str]:
        """One line per check the gate names, saying what to do where there is something to do."""
        lines = []
        for entry in self.entries():
            change = f"{entry['soc']} {entry['case_id']} {entry['check']} {entry['before']} -> {entry['after']}"
            if entry["kind"] == "known failure now passes":
                lines.append(
                    f"known failure now passes (update the known-failures manifest): {change}"
                    + (f" [{entry['why']}]" if entry["why"] else "")
                )
            else:
                lines.append(f"{entry['kind']}: {change}" + (f": {entry['why']}" if entry["why"] else ""))
        # A performance FAIL is something to do; WARNs are counted on the gate's line and listed in the files.
        lines += [
            verdict.line() + ("" if self.perf_fails_gate else " (reported; --perf-gate fails on it)")
            for verdict in self.perf_failures
        ]
        return lines


def of_records(records: list[CheckRecord]) -> dict[Key, Outcome]:
    """This run's outcomes, straight from its records (gating runs before, or without, the report files)."""
    return {(r.soc, r.case_id, r.check): Outcome(r.verdict, r.known_failure, r.message) for r in records}


def of_document(document: dict) -> dict[Key, Outcome]:
    """A written report's outcomes, in the same shape as of_records so either side can be a baseline."""
    return {
        (document["soc"], case["case_id"], name): Outcome(check["verdict"], check["known_failure"], check["message"])
        for case, name, check in checks_of(document)
    }


def read_documents(path: Path) -> list[tuple[Path, dict]]:
    """(file, document) of a report.json, or of every report.json under a folder (a run, or one SoC of
    it); one SoC per folder, so a folder holding two runs is refused rather than silently mixed. Each file is
    validated first (harness/report/intake.py): a file that is not a valid report.json is MalformedReport."""
    if not path.exists():
        raise BaselineError(f"{path} does not exist: pass a report.json or a run folder such as reports/latest")
    files = [path] if path.is_file() else sorted(path.rglob("report.json"))
    if not files:
        raise BaselineError(f"no report.json under {path}: pass a report.json or a run folder such as reports/latest")
    documents: list[tuple[Path, dict]] = []
    origin: dict[str, Path] = {}
    for file in files:
        try:
            document = read_report(file)
        except ReportDataError as error:
            raise MalformedReport(str(error)) from None
        soc = document["soc"]
        if soc in origin:
            raise BaselineError(f"{path} holds two reports for {soc} ({origin[soc]} and {file}): pass one run folder")
        origin[soc] = file
        documents.append((file, document))
    return documents


def load(path: Path) -> dict[Key, Outcome]:
    """Outcomes of a report.json, or of every report.json under a folder (a run, or one SoC of it)."""
    outcomes: dict[Key, Outcome] = {}
    for _, document in read_documents(path):
        outcomes.update(of_document(document))
    return outcomes


def changes(before: dict[Key, Outcome], after: dict[Key, Outcome]) -> list[Change]:
    """Checks whose verdict differs, including checks present on one side only."""
    keys = sorted(before.keys() | after.keys())
    return [
        Change(key, before.get(key), after.get(key))
        for key in keys
        if (before[key].verdict if key in before else ABSENT) != (after[key].verdict if key in after else ABSENT)
    ]


def compare(before: dict[Key, Outcome], after: dict[Key, Outcome], allow_missing: bool = False) -> GateResult:
    common = [Change(key, before[key], after[key]) for key in sorted(before.keys() & after.keys())]
    added = [Change(key, None, after[key]) for key in sorted(after.keys() - before.keys())]
    # A check that passed in the baseline and is now an expected failure (a bundled verdict) still regressed:
    # somebody added a manifest entry for something that used to work, which the gate must show.
    regressions = tuple(c for c in common if c.before.verdict == Verdict.PASSED and c.after.meaning.bundled)
    fixed = tuple(
        c
        for c in common + added
        if c.after.verdict == Verdict.XPASSED
        or (c.before is not None and c.before.expected_to_fail and c.after.meaning.passes)
    )
    new = tuple(
        c
        for c in added + common
        if c.after.verdict == Verdict.FAILED
        and (c.before is None or c.before.verdict not in (Verdict.PASSED, Verdict.FAILED))
    )
    unmeasured = tuple(c for c in common if c.after.verdict == Verdict.NOT_MEASURED and c.before.meaning.measured)
    missing = tuple(Change(key, before[key], None) for key in sorted(before.keys() - after.keys())) + unmeasured
    infrastructure = tuple(c for c in common + added if c.after.verdict == Verdict.INFRA_ERROR)
    return GateResult(regressions, fixed, new, missing, allow_missing, infrastructure)


def gate(records: list[CheckRecord], baseline: Path | dict[Key, Outcome], allow_missing: bool = False) -> GateResult:
    """This run's records against a baseline: a report.json, a folder of them, or outcomes loaded before."""
    return compare(baseline if isinstance(baseline, dict) else load(baseline), of_records(records), allow_missing)
