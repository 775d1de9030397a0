"""summary.md of one SoC's report: the few lines a person or a CI comment needs, nothing more."""
from __future__ import annotations

from harness.report.document import known_failures, problems, stage_times
from harness.report.gate import GateResult
from harness.vocabulary import VERDICTS

SLOWEST_STAGES = 6
CASES_PER_REASON = 6


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _totals(summary: dict) -> str:
    return ", ".join(f"{summary[v]} {v}" for v in VERDICTS if summary[v] or v in ("passed", "failed"))


def render(document: dict, gate: GateResult | None = None) -> str:
    """Short on purpose: the HTML has the matrix and the evidence, this is what fits in a CI comment.
    gate: this SoC's gate result, when the run was gated against a baseline."""
    environment, summary = document["environment"], document["summary"]
    facts = [f"{key} {environment[key]}" for key in ("executorch", "torch", "qnn_build_id", "device_model", "device_serial")
             if environment.get(key)]
    lines = [f"# {document['soc']}: run {document['run_id']}", "",
             f"**{_totals(summary)}** ({summary['total']} checks)", "", " · ".join(facts), ""]
    if gate is not None:
        entries = gate.entries()
        lines += [f"## Gate: {'passed' if gate.ok else 'FAILED'} ({len(entries)} check(s) named)", ""]
        if entries:
            lines += ["| why the gate names it | case | check | baseline -> now | detail |", "| --- | --- | --- | --- | --- |"]
            lines += [f"| {e['kind']} | {e['case_id']} | {e['check']} | {e['before']} -> {e['after']} | {_cell(e['why'])} |"
                      for e in entries]
        lines.append("")
    failing = problems(document)
    lines += [f"## Failures ({len(failing)})", ""]
    if failing:
        lines += ["| verdict | case | check | message |", "| --- | --- | --- | --- |"]
        lines += [f"| {check['verdict']} | {case['case_id']} | {name} | {_cell(check['message'] or check['known_failure'])} |"
                  for case, name, check in failing]
    else:
        lines.append("None.")
    groups = known_failures(document)
    lines += ["", f"## Known failures ({sum(len(g) for g in groups.values())})", ""]
    for reason, members in groups.items():
        named = ", ".join(f"{case['case_id']} {name}" for case, name, _ in members[:CASES_PER_REASON])
        more = f" and {len(members) - CASES_PER_REASON} more" if len(members) > CASES_PER_REASON else ""
        lines.append(f"- {_cell(reason)}: {len(members)} check(s): {named}{more}")
    if not groups:
        lines.append("None.")
    times = stage_times(document)[:SLOWEST_STAGES]
    lines += ["", "## Slowest stages", ""]
    if times:
        lines += ["| stage | total s | slowest case | its s |", "| --- | ---: | --- | ---: |"]
        lines += [f"| {t.stage} | {t.total_s:.1f} | {t.slowest_case} | {t.slowest_s:.1f} |" for t in times]
    else:
        lines.append("No timings recorded.")
    return "\n".join(lines) + "\n"
