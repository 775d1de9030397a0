"""Comparison with a baseline run: what a nightly gate fails on.

Checks are matched by (soc, case_id, check). The gate fails on
- a regression: a check that passed in the baseline and now fails (failed, xfailed or xpassed);
- a new failure: a check that fails now, is not in the baseline and is not a known failure;
- a fixed known failure: a known failure that passes now (xpassed), or a check the baseline expected to
  fail that now passes: the known-failures manifest must change;
- a missing check: in the baseline, absent from this run (renamed, not collected, a collection error),
  or measured in the baseline and not measured now, unless missing checks are allowed (--allow-missing).
  A narrowed run (its selection: -k, -m, --soc, --dtype, or a shard) did not select every case, so a
  baseline check of a case the run has no record of at all is outside its selection: counted, not missing;
  a check missing from a case the run did run is still missing;
- an infrastructure error (listed apart: the device or the lab failed, so the check was not verified;
  a gate that passed on unverified checks could be fooled by a rack whose devices all fail).
A new failure is also a check that fails now where the baseline had it skipped, not measured, an
infrastructure error or a known failure (a different failure than the one expected).
A run compared with itself is ok, unless a known failure passes in it (that alone fails the gate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.record import CheckRecord
from harness.report.document import checks_of
from harness.report.intake import ReportDataError, read_report
from harness.report.perf_gate import FAIL, PerfVerdict
from harness.report.structure_gate import StructureVerdict
from harness.vocabulary import Verdict

Key = tuple[str, str, str]  # soc, case_id, check
ABSENT = "absent"
BASELINE_KEYS = ("night", "run_id", "executorch")
LISTED_MISSING = 20  # missing checks gate.json lists; the rest are counted
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


@dataclass(frozen=True)
class Selection:
    """What narrowed a run's cases, so the gate does not call what it left out missing. --soc and --dtype
    name what they leave out; -k, -m and a shard do not (the baseline has no test names to match), so for
    them a baseline case the run has no record of at all is taken as left out, while a check missing from
    a case the run did run is still missing."""

    socs: frozenset[str] = frozenset()  # --soc (empty: every SoC)
    dtypes: frozenset[str] = frozenset()  # --dtype (empty: every dtype)
    partial: str = ""  # -k / -m / shard as said, "" without

    @property
    def text(self) -> str:
        said = [self.partial] if self.partial else []
        said += [f"--soc {','.join(sorted(self.socs))}"] if self.socs else []
        said += [f"--dtype {','.join(sorted(self.dtypes))}"] if self.dtypes else []
        return " ".join(said)

    def outside(self, key: Key, outcome: Outcome, ran: set[tuple[str, str]]) -> bool:
        soc, case_id, _ = key
        if (self.socs and soc not in self.socs) or (self.dtypes and outcome.dtype and outcome.dtype not in self.dtypes):
            return True
        return bool(self.partial) and (soc, case_id) not in ran

    def environment(self) -> dict[str, str]:
        """As report.json's environment says it (scalars), for a merge to gate by."""
        keys = {"selection": self.text, "selection_partial": self.partial}
        keys |= {"selection_socs": ",".join(sorted(self.socs)), "selection_dtypes": ",".join(sorted(self.dtypes))}
        return {key: value for key, value in keys.items() if value}


def selection_of(environments: list[dict]) -> Selection:
    """The selection of a run made of these reports (a merge's parts): the union of their SoCs and dtypes
    (a part without the filter: every one), their -k/-m; shards merged whole left nothing out."""

    def union(key: str) -> frozenset[str]:
        values = [str(env.get(key) or "") for env in environments]
        return frozenset() if not all(values) else frozenset(v for value in values for v in value.split(","))

    partial = " | ".join(sorted({str(env.get("selection_partial") or "") for env in environments} - {""}))
    return Selection(union("selection_socs"), union("selection_dtypes"), partial)


class BaselineError(ValueError):
    """A baseline or report path that cannot be read as reports."""


class MalformedReport(BaselineError):
    """A report file that is not a valid report.json (harness/report/intake.py): bad input, exit code 4."""


@dataclass(frozen=True)
class Outcome:
    verdict: str  # a Verdict's value: report.json's schema and the records allow no other
    known_failure: str = ""
    message: str = ""
    dtype: str = ""  # the case's (a selection by --dtype leaves the baseline's other dtypes out)

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
    excluded: int = 0  # baseline checks outside a narrowed run's selection (neither missing nor listed)
    selection: str = ""  # the narrowed run's selection, "" for the whole matrix
    baseline: dict[str, str] = field(default_factory=dict)  # which run it was gated against (night, run id, executorch)
    # The structural gate's verdicts (harness/report/structure_gate.py); a FAIL fails the gate as a timing one
    structure: tuple[StructureVerdict, ...] = ()

    @property
    def perf_failures(self) -> tuple[PerfVerdict, ...]:
        return tuple(v for v in self.performance if v.verdict == FAIL)

    @property
    def structure_failures(self) -> tuple[StructureVerdict, ...]:
        return tuple(v for v in self.structure if v.verdict == FAIL)

    @property
    def ok(self) -> bool:
        return not (
            ((self.perf_failures or self.structure_failures) and self.perf_fails_gate)
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
            self.excluded,
            self.selection,
            self.baseline,
            tuple(v for v in self.structure if v.soc == soc),
        )

    def baseline_line(self) -> str:
        """e.g. `baseline: night 000004-2026-12-05-2026..., run 2026..., executorch 1.5.1`; "" when unknown."""
        said = [f"{key.replace('_', ' ')} {self.baseline[key]}" for key in BASELINE_KEYS if self.baseline.get(key)]
        return "baseline: " + ", ".join(said) if said else ""

    def scope_line(self) -> str:
        """What the gate compared: the selection's exclusions, and the fix for missing checks of a narrowed run."""
        line = ""
        if self.excluded:
            line = f"{self.excluded} baseline check(s) outside this run's selection ({self.selection}): not compared"
        if self.missing and not self.allow_missing:
            line += ("; " if line else "") + (
                f"{len(self.missing)} check(s) of the baseline are missing: if this run left them out on purpose, "
                "gate it with --allow-missing"
            )
        return line

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
        """One line per check the gate names, saying what to do where there is something to do; first the
        scope line (what the selection left out, the fix for missing checks), which a cut list still shows."""
        lines = [scope] if (scope := self.scope_line()) else []
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
            for verdict in (*self.perf_failures, *self.structure_failures)
        ]
        return lines


def of_records(records: list[CheckRecord]) -> dict[Key, Outcome]:
    """This run's outcomes, straight from its records (gating runs before, or without, the report files)."""
    return {(r.soc, r.case_id, r.check): Outcome(r.verdict, r.known_failure, r.message, r.dtype) for r in records}


def of_document(document: dict) -> dict[Key, Outcome]:
    """A written report's outcomes, in the same shape as of_records so either side can be a baseline."""
    return {
        (document["soc"], case["case_id"], name): Outcome(
            check["verdict"], check["known_failure"], check["message"], case["dtype"]
        )
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


def compare(
    before: dict[Key, Outcome],
    after: dict[Key, Outcome],
    allow_missing: bool = False,
    selection: Selection | None = None,
) -> GateResult:
    """selection: what narrowed this run (None: the whole matrix); the baseline's checks it left out are
    counted, not compared."""
    selection = selection or Selection()
    ran = {(soc, case_id) for soc, case_id, _ in after}
    outside = {key for key in before.keys() - after.keys() if selection.outside(key, before[key], ran)}
    before = {key: outcome for key, outcome in before.items() if key not in outside}
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
    return GateResult(
        regressions, fixed, new, missing, allow_missing, infrastructure, excluded=len(outside), selection=selection.text
    )


def gate(
    records: list[CheckRecord],
    baseline: Path | dict[Key, Outcome],
    allow_missing: bool = False,
    selection: Selection | None = None,
) -> GateResult:
    """This run's records against a baseline: a report.json, a folder of them, or outcomes loaded before."""
    before = baseline if isinstance(baseline, dict) else load(baseline)
    return compare(before, of_records(records), allow_missing, selection)


def summary(result: GateResult) -> dict:
    """gate.json: the verdict, the baseline, what the selection left out, every check the gate names, but
    at most LISTED_MISSING missing ones (counted): a small run gated against the whole matrix stays small."""
    entries = result.entries()
    missing = [entry for entry in entries if entry["kind"].startswith("missing")]
    listed = [entry for entry in entries if not entry["kind"].startswith("missing")] + missing[:LISTED_MISSING]
    return {
        "ok": result.ok,
        "baseline": result.baseline,
        "selection": result.selection,
        "excluded": result.excluded,
        "missing": len(missing),
        "missing_not_listed": max(0, len(missing) - LISTED_MISSING),
        "checks": listed,
        "performance": [v.entry() for v in result.performance],
        "structure": [v.entry() for v in result.structure],
    }
