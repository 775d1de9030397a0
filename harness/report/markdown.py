"""summary.md of one SoC's report: the few lines a person or a CI comment needs, nothing more."""

from __future__ import annotations

from harness.report.document import checks_of, known_failures, problems, stage_times, with_verdict
from harness.report.gate import GateResult
from harness.repro.layout import ARCHIVE_SUFFIX, LINK, BundleSize
from harness.text import markdown_text
from harness.vocabulary import VERDICTS

SLOWEST_STAGES = 6
CASES_PER_REASON = 6


def _totals(summary: dict) -> str:
    return ", ".join(f"{summary[v]} {v}" for v in VERDICTS if summary[v] or v in ("passed", "failed"))


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB"


def _bundles(document: dict, sizes: list[BundleSize]) -> list[str]:
    """One line per reproduction bundle (its case and bundled checks) and a size line for the run."""
    members: dict[str, list[str]] = {}
    for _case, name, check in checks_of(document):
        if check.get("repro"):
            members.setdefault(check["repro"], []).append(f"{name} {check['verdict']}")
    lines = [f"## Reproduction bundles ({len(members)})", ""]
    by_folder = {f"repro/{size.folder}": size for size in sizes}
    for link, checks in members.items():
        size = by_folder.get(link)
        where = (
            f"`{link}/` (`{link}{ARCHIVE_SUFFIX}`{', ' + _kib(size.archive_bytes) if size else ''})"
            if LINK.fullmatch(link)
            else markdown_text(link)
        )  # a code span only for the shape a bundle's folder has
        lines.append(f"- {where}: {markdown_text(', '.join(checks))}; `python repro.py` there")
    if not members:
        lines.append("None.")
    if sizes:
        lines += [
            "",
            f"Bundle size: {len(sizes)} bundle(s), {_kib(sum(s.bytes for s in sizes))} unpacked "
            f"({sum(s.files for s in sizes)} files), {_kib(sum(s.archive_bytes for s in sizes))} as .tar.gz; "
            f"largest {_kib(max(s.bytes for s in sizes))}.",
        ]
    return lines


def render(document: dict, gate: GateResult | None = None, bundles: list[BundleSize] | None = None) -> str:
    """Short on purpose: the HTML has the matrix and the evidence, this is what fits in a CI comment.
    gate: this SoC's gate result, when the run was gated against a baseline; bundles: the sizes of the
    reproduction bundles in the report's folder."""
    environment, summary = document["environment"], document["summary"]
    facts = [
        f"{key} {markdown_text(environment[key])}"
        for key in ("executorch", "torch", "qnn_build_id", "device_model", "device_serial")
        if environment.get(key)
    ]
    lines = [
        f"# {markdown_text(document['soc'])}: run {markdown_text(document['run_id'])}",
        "",
        f"**{_totals(summary)}** ({summary['total']} checks)",
        "",
        " · ".join(facts),
        "",
    ]
    if gate is not None:
        entries = gate.entries()
        lines += [f"## Gate: {'passed' if gate.ok else 'FAILED'} ({len(entries)} check(s) named)", ""]
        if entries:
            lines += [
                "| why the gate names it | case | check | baseline -> now | detail |",
                "| --- | --- | --- | --- | --- |",
            ]
            lines += [
                f"| {e['kind']} | {markdown_text(e['case_id'])} | {markdown_text(e['check'])} | {e['before']} -> {e['after']} | {markdown_text(e['why'])} |"
                for e in entries
            ]
        lines.append("")
    failing = problems(document)
    lines += [f"## Failures ({len(failing)})", ""]
    if failing:
        lines += ["| verdict | case | check | message |", "| --- | --- | --- | --- |"]
        lines += [
            f"| {check['verdict']} | {markdown_text(case['case_id'])} | {markdown_text(name)} | {markdown_text(check['message'] or check['known_failure'])} |"
            for case, name, check in failing
        ]
    else:
        lines.append("None.")
    infrastructure = with_verdict(document, "infra_error")
    if infrastructure:  # the device or the lab failed: no conformance verdict, rerun on a healthy device
        lines += ["", f"## Infrastructure errors ({len(infrastructure)}): not verified, rerun on a healthy device", ""]
        lines += ["| case | check | message |", "| --- | --- | --- |"]
        lines += [
            f"| {markdown_text(case['case_id'])} | {markdown_text(name)} | {markdown_text(check['message'])} |"
            for case, name, check in infrastructure
        ]
    unmeasured = with_verdict(document, "not_measured")
    if unmeasured:
        reasons = sorted({check["message"] for _, _, check in unmeasured})
        lines += ["", f"## Not measured ({len(unmeasured)})", ""] + [f"- {markdown_text(reason)}" for reason in reasons]
    groups = known_failures(document)
    lines += ["", f"## Known failures ({sum(len(g) for g in groups.values())})", ""]
    for reason, members in groups.items():
        named = ", ".join(
            f"{markdown_text(case['case_id'])} {markdown_text(name)}" for case, name, _ in members[:CASES_PER_REASON]
        )
        more = f" and {len(members) - CASES_PER_REASON} more" if len(members) > CASES_PER_REASON else ""
        lines.append(f"- {markdown_text(reason)}: {len(members)} check(s): {named}{more}")
    if not groups:
        lines.append("None.")
    lines += ["", *_bundles(document, bundles or [])]
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
