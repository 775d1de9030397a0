"""summary.md of one SoC's report: what fits in a CI comment, what is new first.

A GitHub comment holds 65,536 characters and a nightly posts one per SoC, or both SoCs in one: so every
list here is bounded by what kinds of things happened, not by how many checks they hit. Known failures
are one line per finding with its count and link, failures one line per check and signature, the gate's
table and the infrastructure errors at most a screenful (the rest: gate.json and report.html), bundles a
count and a link. The HTML has every check.
"""

from __future__ import annotations

from harness.device import kinds
from harness.device.device import devices_display
from harness.report.document import (
    by_finding,
    checks_of,
    problems,
    signature_of,
    stage_times,
    with_verdict,
)
from harness.report.gate import GateResult, clip
from harness.report.perf_gate import (
    FAIL,
    PASS,
    PROFILE_TOP,
    WARN,
    finding_candidates,
    profile_top,
    speedups,
)
from harness.report.structure_gate import counts as structure_counts
from harness.repro.layout import REPRO_DIR, BundleSize
from harness.text import markdown_text
from harness.vocabulary import Verdict

SLOWEST_STAGES = 6
EXAMPLES = 3  # cases named on a grouped line
LISTED = 30  # rows of the gate's table, and infrastructure errors, before "and N more"
FINDINGS = "docs/FINDINGS.md"  # where a finding's anchor is, when the caller gives no link to it


def _totals(summary: dict) -> str:
    return ", ".join(f"{summary[v]} {v.spoken}" for v in Verdict if summary[v] or v.always_counted)


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB"


def _examples(members: list[tuple[dict, str, dict]]) -> str:
    cases = list(dict.fromkeys(case["case_id"] for case, _, _ in members))
    named = ", ".join(markdown_text(case_id) for case_id in cases[:EXAMPLES])
    return named + (f" and {len(cases) - EXAMPLES} more case(s)" if len(cases) > EXAMPLES else "")


def _more(total: int, shown: int, where: str) -> list[str]:
    return [f"- and {total - shown} more: {where}"] if total > shown else []


def _gate(gate: GateResult) -> list[str]:
    entries = gate.entries()
    lines = [f"## Gate: {'passed' if gate.ok else 'FAILED'} ({len(entries)} check(s) named)", ""]
    said = [markdown_text(line) for line in (gate.baseline_line(), gate.scope_line()) if line]
    lines += [*said, ""] if said else []
    if entries:
        lines += [
            "| why the gate names it | case | check | baseline -> now | detail |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {e['kind']} | {markdown_text(e['case_id'])} | {markdown_text(e['check'])} | {e['before']} -> {e['after']} "
            f"| {markdown_text(clip(e['why'], 100))} |"
            for e in entries[:LISTED]
        ]
        lines += _more(len(entries), LISTED, "gate.json beside report.json names every one")
    if gate.performance:
        counts = {name: sum(v.verdict == name for v in gate.performance) for name in (PASS, WARN, FAIL)}
        lines += [
            "",
            "### Performance gate: "
            + ", ".join(f"{n} {name}" for name, n in counts.items() if n)
            + ("" if gate.perf_fails_gate or not counts[FAIL] else " (reported only: --perf-gate fails on it)"),
            "",
        ]
        named = [v for v in gate.performance if v.verdict != PASS]
        lines += [f"- {markdown_text(v.line())}" for v in named[:LISTED]]
        lines += _more(len(named), LISTED, "gate.json beside report.json names every one")
    return [*lines, *_structure_gate(gate), ""]


def _structure_gate(gate: GateResult) -> list[str]:
    """The structural gate's heading and, per case with a changed fact, its line and a line per fact."""
    if not gate.structure:
        return []
    found = structure_counts(gate.structure)
    lines = [
        "",
        "### Structural gate: "
        + ", ".join(f"{n} {name}" for name, n in found.items() if n)
        + ("" if gate.perf_fails_gate or not found[FAIL] else " (reported only: --perf-gate fails on it)"),
        "",
    ]
    named = [v for v in gate.structure if v.changes]
    for verdict in named[:LISTED]:
        lines += [f"- {markdown_text(verdict.line())}", *(f"  - {markdown_text(f)}" for f in verdict.fact_lines())]
    return lines + _more(len(named), LISTED, "gate.json beside report.json names every one")


def _us(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else "–"


def _performance(document: dict) -> list[str]:
    """Per case p50/p90 step time (steps after the first), the first step apart, peak memory; the delegation
    speed-up per card x dtype; on phones, the finding candidates (harness/report/perf_gate.py)."""
    timed = [case for case in document["cases"] if isinstance(case.get("timing"), dict)]
    if not timed:
        return []
    simulator = any(kinds.simulated(case["timing"].get("device_kind")) for case in timed)
    lines = [
        "",
        "## Step times" + (" (HTP simulator times on the host: not phone performance)" if simulator else ""),
        "",
        "| case | device | first step us | p50 us | p90 us | repeats' p50 us | peak RSS KiB |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    for case in timed[:LISTED]:
        timing = case["timing"]
        kind = kinds.report_label(timing.get("device_kind"))
        lines.append(
            f"| {markdown_text(case['case_id'])} | {kind} | {_us(timing.get('first_step_us'))} "
            f"| {_us(timing.get('p50_us'))} | {_us(timing.get('p90_us'))} "
            f"| {' · '.join(_us(v) for v in timing.get('repeats_p50_us') or [])} | {_us(timing.get('peak_rss_kb'))} |"
        )
    lines += _more(len(timed), LISTED, "report.json and report.html have every case")
    rows = speedups(document)
    if rows:
        lines += [
            "",
            "| skip-mode p50 / delegated p50 (each its fastest repeat; a simulator's ratio is not a phone's) "
            "| device | ratio |",
            "| --- | --- | ---: |",
        ]
        lines += [
            f"| {markdown_text(f'{r.card} {r.dtype} {r.soc}')} | {kinds.report_label(r.device_kind)} | {r.ratio:.2f} |"
            for r in rows[:LISTED]
        ]
    candidates = finding_candidates(document)
    if candidates:
        lines += ["", "### Finding candidates (phones: delegation made it slower)", ""]
        lines += [f"- {markdown_text(line)}" for line in candidates[:LISTED]]
    if profiled := profile_top(document):
        lines += [
            "",
            f"### QNN profile (--profile-level; a run of its own): each case's {PROFILE_TOP} costliest events",
            "",
            "| case | event | unit | per step |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {markdown_text(row.case_id)} | {markdown_text(row.event)} | {markdown_text(row.unit)} "
            f"| {' · '.join(f'{value:,.0f}' for value in row.values)} |"
            for row in profiled[: LISTED * PROFILE_TOP]
        ]
        lines += _more(len(profiled), LISTED * PROFILE_TOP, "report.json's timing.profile has every event")
    return lines


def _failures(document: dict) -> list[str]:
    """Failures and known failures that now pass, one line per check, verdict and signature."""
    failing = problems(document)
    groups: dict[tuple[str, str, str], list[tuple[dict, str, dict]]] = {}
    for case, name, check in failing:
        groups.setdefault((check["verdict"], name, signature_of(check)), []).append((case, name, check))
    lines = [f"## Failures ({len(failing)})", ""]
    for (verdict, name, signature), members in groups.items():
        first = members[0][2]
        line = first["message"] if verdict == Verdict.FAILED else first["known_failure"]
        lines.append(
            f"- **{verdict}** {markdown_text(name)}"
            + (f" `{signature}`" if signature else "")
            + f": {len(members)} check(s) in {_examples(members)}; e.g. {markdown_text(clip(line, 160))}"
        )
    if not failing:
        lines.append("None.")
    return lines


def _infrastructure(document: dict) -> list[str]:
    infrastructure = with_verdict(document, Verdict.INFRA_ERROR)
    if not infrastructure:  # the device or the lab failed: no conformance verdict, rerun on a healthy device
        return []
    lines = ["", f"## Infrastructure errors ({len(infrastructure)}): not verified, rerun on a healthy device", ""]
    lines += [
        f"- {markdown_text(case['case_id'])} {markdown_text(name)}: {markdown_text(clip(check['message'], 160))}"
        for case, name, check in infrastructure[:LISTED]
    ]
    return lines + _more(len(infrastructure), LISTED, "report.html#infrastructure")


def _known(document: dict, findings_link: str) -> list[str]:
    findings = by_finding(document)
    lines = ["", f"## Known failures ({sum(len(f.members) for f in findings)}) by finding", ""]
    for finding in findings:
        head = f"[{finding.finding}]({findings_link}#{finding.finding})" if finding.finding else "no finding"
        passing = f", **{finding.xpassed} now pass**" if finding.xpassed else ""
        signatures = ", ".join(f"`{s}`" for s in finding.signatures)
        lines.append(
            f"- {head}: {len(finding.members)} check(s){passing} in "
            f"{len({case['case_id'] for case, _, _ in finding.members})} case(s)"
            + (f", {signatures}" if signatures else "")
            + f"; {markdown_text(clip(finding.reasons[0], 120))}"
        )
    if not findings:
        lines.append("None.")
    return lines


def _bundles(document: dict, sizes: list[BundleSize]) -> list[str]:
    """The bundles as one count, one link and one size line: each is linked from its cell in report.html."""
    bundled = {check["repro"] for _, _, check in checks_of(document) if check.get("repro")}
    lines = [f"## Reproduction bundles ({len(bundled)})", ""]
    if not bundled:
        return [*lines, "None."]
    lines.append(
        f"In [{REPRO_DIR}/]({REPRO_DIR}/), one folder and one .tar.gz per case; each failing cell of report.html "
        "links its own (`python repro.py` there)."
    )
    if sizes:
        lines += [
            "",
            f"Bundle size: {len(sizes)} bundle(s), {_kib(sum(s.bytes for s in sizes))} unpacked "
            f"({sum(s.files for s in sizes)} files), {_kib(sum(s.archive_bytes for s in sizes))} as .tar.gz; "
            f"largest {_kib(max(s.bytes for s in sizes))}.",
        ]
    return lines


def render(
    document: dict,
    gate: GateResult | None = None,
    bundles: list[BundleSize] | None = None,
    findings_link: str = FINDINGS,
) -> str:
    """gate: this SoC's gate result, when the run was gated against a baseline; bundles: the sizes of the
    reproduction bundles in the report's folder; findings_link: docs/FINDINGS.md as this file reaches it."""
    environment, summary = document["environment"], document["summary"]
    facts = [
        f"{key} {markdown_text(environment[key])}"
        for key in ("executorch", "torch", "qnn_build_id", "device_model")
        if environment.get(key)
    ]
    if environment.get("device_serial"):  # the short names; report.json keeps the addresses
        shown = devices_display(str(environment["device_serial"]), document["soc"], bool(environment.get("emulated")))
        facts.append(f"device_serial {markdown_text(shown)}")
    lines = [
        f"# {markdown_text(document['soc'])}: run {markdown_text(document['run_id'])}",
        "",
        f"**{_totals(summary)}** ({summary['total']} checks)",
        "",
        " · ".join(facts),
        "",
    ]
    if gate is not None:
        lines += _gate(gate)
    lines += _failures(document)
    lines += _infrastructure(document)
    unmeasured = with_verdict(document, Verdict.NOT_MEASURED)
    if unmeasured:
        reasons = sorted({check["message"] for _, _, check in unmeasured})
        lines += ["", f"## Not measured ({len(unmeasured)})", ""]
        lines += [f"- {markdown_text(clip(reason, 200))}" for reason in reasons[:LISTED]]
        lines += _more(len(reasons), LISTED, "report.html")
    lines += _known(document, findings_link)
    lines += ["", *_bundles(document, bundles or [])]
    lines += _performance(document)
    times = stage_times(document)[:SLOWEST_STAGES]
    lines += ["", "## Slowest stages", ""]
    if times:
        lines += ["| stage | total s | slowest case | its s |", "| --- | ---: | --- | ---: |"]
        lines += [
            f"| {markdown_text(t.stage)} | {t.total_s:.1f} | {markdown_text(t.slowest_case)} | {t.slowest_s:.1f} |"
            for t in times
        ]
    else:
        lines.append("No timings recorded.")
    return "\n".join(lines) + "\n"
