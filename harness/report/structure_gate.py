"""The structural performance gate, beside the timing gate (perf_gate.py): a case's lowering facts that decide
its speed on a phone (harness/pipeline/structure.py), compared exactly with the baseline's.

Each fact has a budget (STRUCTURE_BUDGETS) and a verdict:
- counts (QNN ops by type per graph, QNN graphs per method, ops outside the delegate by op, QnnMem_register
  calls per graph execute from the device's execute trace): more than the baseline is a FAIL, fewer a WARN (a
  change the baseline does not know: promote a new one once it is understood), equal a PASS; a fact that only
  a traced device measures (the registrations) is judged only where both runs measured it;
- bytes (context binary per graph, .pte, planned arenas per method, bytes across the delegate boundary per
  execute): growth beyond the fact's budget is a FAIL, any other change a WARN, equal a PASS.
A case's verdict is its worst fact's; its line names every changed fact, e.g.
`structure FAIL: SM8650 counter_add-fp16-delegate_mutbuf-SM8650 forward: +2 Transpose, +1 Cast; forward context
binary +18.0% (49408 -> 58302 B)`. These facts are exact (the same lowering gives the same facts), so there is no
noise band: a changed fact is a changed program. Cases without facts on either side (lowered by a suite that
did not record them, or not lowered) get no verdict. A FAIL fails the run only with --perf-gate, as a timing
FAIL does. The module reads report documents and records as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.record import CheckRecord

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
COUNT, BYTES = "count", "bytes"
# Per kind of fact: how it is judged and its budget (bytes: growth in % allowed before a FAIL)
STRUCTURE_BUDGETS: dict[str, tuple[str, float]] = {
    "qnn_ops": (COUNT, 0.0),
    "qnn_graphs": (COUNT, 0.0),
    "ops_outside": (COUNT, 0.0),
    "mem_register_calls_per_execute": (COUNT, 0.0),
    "context_binary": (BYTES, 10.0),
    "pte": (BYTES, 10.0),
    "planned_memory": (BYTES, 0.0),
    "boundary_bytes": (BYTES, 0.0),
}
_RANK = {PASS: 0, WARN: 1, FAIL: 2}
# Facts a run has only where its device traced the executes: absent is "not measured", never 0.
MEASURED_BY_TRACE = frozenset({"mem_register_calls_per_execute"})

Key = tuple[str, str]  # soc, case_id
Fact = tuple[str, str, str]  # kind, scope (a graph or method, "" for the program), name ("" for a size)


def facts_of(structure: dict[str, Any] | None) -> dict[Fact, int]:
    """A case's structure (report.json `structure`) as flat facts; {} when it has none to compare."""
    if not isinstance(structure, dict) or not isinstance(structure.get("methods"), dict):
        return {}
    facts: dict[Fact, int] = {}
    if isinstance(structure.get("pte_bytes"), int):
        facts[("pte", "", "")] = structure["pte_bytes"]
    if isinstance(structure.get("mem_register_calls_per_execute"), int):
        facts[("mem_register_calls_per_execute", "", "")] = structure["mem_register_calls_per_execute"]
    for method, found in structure["methods"].items():
        graphs = found.get("graphs") or {}
        facts[("qnn_graphs", method, "")] = len(graphs)
        for graph, details in graphs.items():
            for op, count in (details.get("qnn_ops") or {}).items():
                facts[("qnn_ops", graph, op)] = int(count)
            facts[("context_binary", graph, "")] = int(details.get("context_binary_bytes") or 0)
            facts[("boundary_bytes", graph, "")] = int(details.get("boundary_bytes") or 0)
        for op, count in (found.get("ops_outside") or {}).items():
            facts[("ops_outside", method, op)] = int(count)
        facts[("planned_memory", method, "")] = sum(int(size) for size in found.get("planned_arena_bytes") or [])
    return facts


@dataclass(frozen=True)
class Change:
    fact: Fact
    before: int
    after: int
    verdict: str

    def words(self) -> str:
        """e.g. `+2 Transpose`, `context binary +18.0% (49408 -> 58302 B)`, `outside: +1 aten.mul.Tensor`."""
        kind, _, name = self.fact
        delta = self.after - self.before
        if kind == "qnn_ops":
            return f"{delta:+d} {name}"
        if kind == "ops_outside":
            return f"{delta:+d} {name} outside the delegate"
        if kind == "qnn_graphs":
            return f"{delta:+d} QNN graph(s) ({self.before} -> {self.after})"
        if kind == "mem_register_calls_per_execute":
            return f"QnnMem_register calls per execute {self.before} -> {self.after}"
        label = {
            "context_binary": "context binary",
            "pte": ".pte",
            "planned_memory": "planned memory",
            "boundary_bytes": "bytes across the delegate boundary per execute",
        }[kind]
        growth = f"{(self.after / self.before - 1) * 100:+.1f}% " if self.before else ""
        return f"{label} {growth}({self.before} -> {self.after} B)"


def fact_verdict(fact: Fact, before: int, after: int) -> str:
    """One fact's verdict against its budget (a fact on one side only counts as 0 on the other)."""
    kind, budget = STRUCTURE_BUDGETS[fact[0]]
    if after == before:
        return PASS
    if kind == COUNT:
        return FAIL if after > before else WARN
    grew_pct = (after / before - 1) * 100 if before > 0 else float("inf")
    return FAIL if grew_pct > budget else WARN


@dataclass(frozen=True)
class StructureVerdict:
    soc: str
    case_id: str
    verdict: str
    changes: tuple[Change, ...]

    def entry(self) -> dict[str, Any]:
        """As gate.json names it."""
        return {
            "verdict": self.verdict,
            "soc": self.soc,
            "case_id": self.case_id,
            "changes": [
                {
                    "fact": change.fact[0],
                    "scope": change.fact[1],
                    "name": change.fact[2],
                    "before": change.before,
                    "after": change.after,
                    "verdict": change.verdict,
                }
                for change in self.changes
            ],
            "what": self.what(),
        }

    def what(self) -> str:
        """The changed facts in words, grouped by scope: `forward: +2 Transpose, +1 Cast; .pte +3.1% (...)`."""
        scopes: dict[str, list[str]] = {}
        for change in self.changes:
            scopes.setdefault(change.fact[1], []).append(change.words())
        return "; ".join(
            f"{scope}: {', '.join(words)}" if scope else ", ".join(words) for scope, words in scopes.items()
        )

    def line(self) -> str:
        return f"structure {self.verdict}: {self.soc} {self.case_id} " + (self.what() or "unchanged")

    def fact_lines(self) -> list[str]:
        """One line per changed fact with its own verdict against its budget: `forward: +2 Transpose (FAIL)`."""
        return [
            f"{change.fact[1] + ': ' if change.fact[1] else ''}{change.words()} ({change.verdict})"
            for change in self.changes
        ]


def in_words(structure: dict[str, Any] | None) -> str:
    """A case's structure (report.json `structure`) as one line for the pages ("": none recorded), e.g.
    `forward: ElementWiseAdd 1, Reshape 1; context binary 49408 B; 64 B across; forward: planned 64 B; .pte 50688 B`."""
    if not isinstance(structure, dict) or not facts_of(structure):
        return ""
    parts = []
    for method, found in structure["methods"].items():
        for graph, details in (found.get("graphs") or {}).items():
            ops = ", ".join(f"{op} {count}" for op, count in sorted((details.get("qnn_ops") or {}).items()))
            parts.append(
                f"{graph}: {ops or 'no QNN op'}; context binary {details.get('context_binary_bytes')} B; "
                f"{details.get('boundary_bytes')} B across"
            )
        outside = ", ".join(f"{op} {count}" for op, count in sorted((found.get("ops_outside") or {}).items()))
        planned = sum(int(size) for size in found.get("planned_arena_bytes") or [])
        parts.append(f"{method}: {'outside the delegate ' + outside + '; ' if outside else ''}planned {planned} B")
    return "; ".join([*parts, f".pte {structure.get('pte_bytes')} B"])


def counts(verdicts: tuple[StructureVerdict, ...]) -> dict[str, int]:
    """How many cases got each verdict, PASS first (what the pages' gate headings say)."""
    return {name: sum(v.verdict == name for v in verdicts) for name in (PASS, WARN, FAIL)}


def judge(before: dict[Fact, int], after: dict[Fact, int]) -> tuple[str, tuple[Change, ...]]:
    """A case's verdict and its changed facts (in fact order), from its facts in the baseline and now."""
    changes = []
    order = list(STRUCTURE_BUDGETS)
    for fact in sorted(before.keys() | after.keys(), key=lambda f: (f[1], order.index(f[0]), f[2])):
        if fact[0] in MEASURED_BY_TRACE and not (fact in before and fact in after):
            continue
        old, new = before.get(fact, 0), after.get(fact, 0)
        verdict = fact_verdict(fact, old, new)
        if verdict != PASS or old != new:
            changes.append(Change(fact, old, new, verdict))
    worst = max((change.verdict for change in changes), key=_RANK.__getitem__, default=PASS)
    return worst, tuple(changes)


def baseline_structures(documents: list[dict]) -> dict[Key, dict]:
    """Each case's structure in the baseline's report documents (cases without one are left out)."""
    return {
        (document["soc"], case["case_id"]): case["structure"]
        for document in documents
        for case in document["cases"]
        if facts_of(case.get("structure"))
    }


def compare(baseline: dict[Key, dict], records: list[CheckRecord]) -> tuple[StructureVerdict, ...]:
    """A verdict per case whose structure both runs recorded, in case order."""
    now = {(r.soc, r.case_id): r.structure for r in records if facts_of(r.structure)}
    verdicts = []
    for key in sorted(baseline.keys() & now.keys()):
        verdict, changes = judge(facts_of(baseline[key]), facts_of(now[key]))
        verdicts.append(StructureVerdict(key[0], key[1], verdict, changes))
    return tuple(verdicts)
