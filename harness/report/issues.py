"""`python -m harness.report issues RUN`: one upstream issue per finding, not one per bundle.

A run's reproduction bundles each carry an issue.md (harness/repro/issue.py), but a nightly run has
hundreds of bundles for a handful of defects, and an upstream maintainer wants one report per defect that
runs on its own. So the failing checks of a run are grouped by finding (docs/FINDINGS.md#F<n> from the
known-failures entry that expected them; a failure no entry expects is a finding of its own per check and
signature), and each finding gets <out>/<finding>.md and <out>/<finding>.py: a script with its imports and
constants (the card's model class and steps function with what they use from the card module, cut out of
the bundle's copy by `ast`, never imported or run here), the failing mode and the control mode (the same card
with skip_mutable_buffer=True), the numbers, the versions, the likely upstream place with links to the
upstream sources at the versions under test, and the bundles it covers.

Everything here is read as data: report.json through harness/report/intake.py, a bundle's case.json and card
module bounded and without following links, and every string that reaches the Markdown goes through
harness/text.py. Imports no torch (harness/tests/test_architecture.py).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import jinja2
from markupsafe import Markup

from harness.files import write_atomically
from harness.report.document import checks_of, rank
from harness.report.gate import read_documents
from harness.text import code_fence, code_span, markdown_text
from harness.vocabulary import DTYPES, MODE_ORDER, QUANT_DTYPES, Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
FILED = re.compile(r"\[upstream: (https://github\.com/pytorch/[a-z]+/(?:issues|pull)/[0-9]{1,9})\]")  # describe()
FINDING_REFERENCE = re.compile(r"FINDINGS\.md#(F[0-9]+)\b")
MAX_JSON_BYTES = 16 * 1024 * 1024  # a bundle's case.json is tens of KB
MAX_SOURCE_BYTES = 1024 * 1024  # a card module
CARD_FILE = re.compile(r"^card/[A-Za-z0-9_]{1,100}\.py$")
SOURCE_PATH = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+\.(?:py|cpp|cc|h|hpp)$")
VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){1,3}")
UPSTREAM_REPOSITORIES = {  # the project words the manifest's references use -> repository and source prefix
    "executorch": ("pytorch/executorch", ""),
    "torchao": ("pytorch/ao", "torchao/"),
}


class IssuesError(ValueError):
    """A run that has no reports to read; the message is one line."""


def finding_of(name: str, check: dict) -> str | None:
    """The finding a check counts towards, or None when it did not fail: F<n> where the record or its
    known-failures entry points into docs/FINDINGS.md; an entry's own words where it points nowhere; for a
    failure no entry expected, `new-<check>[-<signature>]` (one finding per check and signature)."""
    if not Verdict(check["verdict"]).fails:  # a check that failed, expected or not; xpassed is the manifest's to fix
        return None
    for text in (str(check.get("finding") or ""), check["known_failure"]):
        match = FINDING_REFERENCE.search(text) or re.fullmatch(r"(F[0-9]+)", text)
        if match:
            return match.group(1)
    if check["known_failure"]:
        return check["known_failure"]
    signature = re.sub(r"[^a-z0-9_]", "", str(check.get("signature") or "").lower())[:60]
    return f"new-{name}" + (f"-{signature}" if signature else "")


@dataclass(frozen=True)
class Member:
    """One failing check of the finding, in its SoC's report folder."""

    folder: Path
    document: dict
    case: dict
    check_name: str
    check: dict


def _read_data(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes, opened without following a link and bounded; None when it is not one."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return file.read(limit + 1)[:limit]


def _bundle(member: Member) -> tuple[dict, str]:
    """The case.json of the member's bundle and its card module's source (empty when absent or unusable)."""
    repro = member.check.get("repro") or ""  # the schema allows only repro/<name>
    folder = member.folder / repro
    if not repro or folder.is_symlink() or not folder.is_dir():
        return {}, ""
    data = _read_data(folder / "case.json", MAX_JSON_BYTES)
    try:
        case = json.loads(data) if data else {}
    except ValueError:
        return {}, ""
    if not isinstance(case, dict):
        return {}, ""
    card = case.get("card") if isinstance(case.get("card"), dict) else {}
    name = card.get("file")
    source = b""
    if isinstance(name, str) and CARD_FILE.match(name) and not (folder / "card").is_symlink():
        source = _read_data(folder / name, MAX_SOURCE_BYTES) or b""
    return case, source.decode("utf-8", "replace")


class _Names(ast.NodeVisitor):
    """Names a definition reads at run time (annotations are strings under `from __future__ import annotations`)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        self.names.add(node.id)

    def visit_arg(self, node: ast.arg) -> None:
        pass

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for part in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults, *node.body):
            if part is not None:
                self.visit(part)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)


def _bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
    if isinstance(statement, ast.Assign):
        return {target.id for target in statement.targets if isinstance(target, ast.Name)}
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return {statement.target.id}
    return set()


def _defined_name(source: str) -> str | None:
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    return next((s.name for s in body if isinstance(s, (ast.FunctionDef, ast.ClassDef))), None)


def card_code(module_source: str, model_name: str, steps_name: str) -> str | None:
    """The card module's statements the model and steps need (imports, constants, helpers), in the module's
    order, without what the suite's registry adds; None when the module does not define both names."""
    try:
        tree = ast.parse(module_source)
    except SyntaxError:
        return None
    statements = [s for s in tree.body if not isinstance(s, ast.Expr)]  # docstring, register(...) calls
    definers = {name: s for s in statements for name in _bound(s)}
    if model_name not in definers or steps_name not in definers:
        return None
    needed: list[ast.stmt] = []
    pending = [model_name, steps_name]
    while pending:
        statement = definers.get(pending.pop())
        if statement is None or any(statement is s for s in needed):
            continue
        needed.append(statement)
        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
            names = _Names()
            names.visit(statement)
            pending.extend(names.names)
    order = [s for s in statements if any(s is n for n in needed)]
    imports = [s for s in order if isinstance(s, (ast.Import, ast.ImportFrom))]
    if any(isinstance(s, ast.ImportFrom) and (s.module or "").startswith("harness") for s in imports):
        return None  # the model needs the suite itself: the bundle's repro.py is the way to run it
    parts = [ast.get_source_segment(module_source, s) or "" for s in order]
    return "\n\n\n".join(part for part in parts if part)


def minimal_script(title: str, finding: str, case: dict, module_source: str) -> str | None:
    """The runnable script of a finding (None when the bundle's card cannot be cut out on its own)."""
    card = case.get("card") or {}
    model_name = _defined_name(str(card.get("build_source") or ""))
    steps_name = _defined_name(str(card.get("steps_source") or ""))
    code = card_code(module_source, model_name or "", steps_name or "") if model_name and steps_name else None
    if code is None:
        return None
    buffers = [str(b) for b in card.get("mutated_buffers") or []]
    settings = {
        "soc": str(case.get("soc")),
        "dtype": str(case.get("dtype")),
        "steps": case["steps"] if isinstance(case.get("steps"), int) and 0 < case["steps"] <= 1000 else 4,
        "buffers": buffers,
        "quant": QUANT_DTYPES.get(str(case.get("dtype")), ""),
    }
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
    )
    return environment.get_template("finding_repro.py.j2").render(
        docstring=repr(f"{title} ({finding}): minimal reproduction.")[1:-1].replace('"""', '\\"\\"\\"'),
        card_code=code,
        model=model_name,
        steps_function=steps_name,
        settings={key: repr(value) for key, value in settings.items()},
    )


def _links(upstream: str, environment: dict) -> list[tuple[str, Markup]]:
    """(path, URL) of each source file the upstream text names, at the version under test (main if unknown)."""
    links, project = [], "executorch"
    for word in upstream.split():
        word = word.strip(",;()")
        if word in UPSTREAM_REPOSITORIES:
            project = word
        elif SOURCE_PATH.match(word):
            repository, prefix = UPSTREAM_REPOSITORIES[project]
            version = VERSION.match(str(environment.get(project) or ""))
            ref = f"v{version.group(0)}" if version else "main"
            url = f"https://github.com/{repository}/blob/{ref}/{prefix}{word}"  # every part matched a pattern above
            links.append((f"{project} {word}", Markup(url)))
    return list(dict.fromkeys(links))


def _upstream(member: Member, case: dict) -> str:
    """The likely upstream place: the bundle's record of it, else the manifest entry's words after the finding."""
    recorded = ((case.get("checks") or {}).get(member.check_name) or {}).get("upstream")
    if isinstance(recorded, str) and recorded:
        return recorded
    match = re.search(r"FINDINGS\.md#F[0-9]+;\s*([^)]*)\)", member.check["known_failure"])
    return match.group(1).strip() if match else ""


def _control(member: Member) -> dict:
    """The same card, dtype, SoC and check in the other buffer mode, and what it gave."""
    other = "skip_mutbuf" if member.case["mode"] != "skip_mutbuf" else "delegate_mutbuf"
    for case in member.document["cases"]:
        if (case["card"], case["dtype"], case["mode"]) == (member.case["card"], member.case["dtype"], other):
            check = case["checks"].get(member.check_name)
            return {"mode": other, "case_id": case["case_id"], "verdict": check["verdict"] if check else "absent"}
    return {"mode": other, "case_id": "", "verdict": "absent"}


def _representative(members: list[Member]) -> Member:
    """The simplest failing case: one with a bundle, fp16 before quantized, delegated buffers first."""
    return min(
        members,
        key=lambda m: (
            not m.check.get("repro"),
            rank(MODE_ORDER, m.case["mode"]),
            rank(DTYPES, m.case["dtype"]),
            m.case["case_id"],
            m.check_name,
        ),
    )


def group(run: Path) -> dict[str, list[Member]]:
    """The run's failing checks by finding."""
    findings: dict[str, list[Member]] = {}
    for file, document in read_documents(run):
        for case, name, check in checks_of(document):
            finding = finding_of(name, check)
            if finding is not None:
                findings.setdefault(finding, []).append(Member(file.parent, document, case, name, check))
    return findings


def _number(value: object, spec: str) -> str:
    """A report number as the table shows it (the strings Infinity and NaN as they are)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    return format(number, spec) if math.isfinite(number) else str(value)


def _by_card(members: list[Member]) -> list[dict]:
    """The failing cases, one line per card and mode: which dtypes, on which SoCs."""
    lines: dict[tuple[str, str], dict] = {}
    for m in members:
        line = lines.setdefault((m.case["card"], m.case["mode"]), {"dtypes": set(), "socs": set(), "checks": set()})
        line["dtypes"].add(m.case["dtype"])
        line["socs"].add(m.document["soc"])
        line["checks"].add(m.check_name)
    return [
        {
            "card": card,
            "mode": mode,
            "dtypes": sorted(line["dtypes"], key=lambda d: rank(DTYPES, d)),
            "socs": sorted(line["socs"]),
            "checks": sorted(line["checks"]),
        }
        for (card, mode), line in sorted(lines.items())
    ]


def _slug(finding: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", finding).strip("-.")[:80] or "finding"


def _finalize(value: object) -> object:
    return value if isinstance(value, Markup) or value is None else markdown_text(value)


def render(finding: str, members: list[Member], script_name: str) -> tuple[str, str | None]:
    """(issue.md, the script or None) of one finding."""
    # Here, not at the top: the manifest module needs `packaging`, which merge, diff, promote and history (and
    # the CI jobs that run only them, with jinja2, jsonschema and filelock) do without.
    from harness.known_failures import finding_titles

    representative = _representative(members)
    case, module_source = _bundle(representative)
    environment = representative.document["environment"]
    check = representative.check
    title = finding_titles().get(finding) or (
        check["known_failure"].split(": ", 1)[-1].split(" (docs/")[0]
        if check["known_failure"]
        else f"{representative.check_name} fails: {check['message']}"
    )
    title = " ".join(title.split())[:150]
    script = minimal_script(title, finding, case, module_source) if case else None
    upstream = _upstream(representative, case)
    members = sorted(members, key=lambda m: (m.document["soc"], m.case["case_id"], m.check_name))
    bundles = sorted({(m.document["soc"], m.check["repro"]) for m in members if m.check.get("repro")})
    numbers = case.get("numbers") if isinstance(case.get("numbers"), list) else []
    steps = (check.get("evidence") or {}).get("steps") or numbers
    template = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=False,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    ).get_template("finding_issue.md.j2")
    text = template.render(
        finding=finding,
        title=title,
        representative=representative,
        control=_control(representative),
        members=members,
        cases=sorted({(m.document["soc"], m.case["case_id"]) for m in members}),
        modes=sorted({m.case["mode"] for m in members}),
        dtypes=sorted({m.case["dtype"] for m in members}, key=lambda d: rank(DTYPES, d)),
        signatures=sorted({str(m.check.get("signature") or m.check["known_failure"][:60]) for m in members}),
        env=environment,
        steps=[
            {
                "step": s.get("step"),
                "max_abs_error": _number(s.get("max_abs_error"), ".6g"),
                "sqnr_db": _number(s.get("sqnr_db"), ".1f"),
                "mismatches": s.get("mismatches"),
            }
            for s in steps
            if isinstance(s, dict)
        ],
        by_card=_by_card(members),
        lowering_error=str((case.get("lowering") or {}).get("error") or "") if case else "",
        script=Markup(code_fence(script, "python")) if script else None,
        script_name=script_name,
        upstream=upstream,
        links=_links(upstream, environment),
        bundles=bundles,
        filed=[Markup(url) for url in sorted({u for m in members for u in FILED.findall(m.check["known_failure"])})],
        code=lambda value: Markup(code_span(value)),
    )
    return text, script


def write(run: Path, out: Path | None = None) -> list[Path]:
    """<out>/<finding>.md (and .py) for every finding of the run; out defaults to RUN/issues. Returns the .md files."""
    findings = group(run)
    out = out or run / "issues"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for finding, members in sorted(findings.items()):
        slug = _slug(finding)
        text, script = render(finding, members, f"{slug}.py")
        write_atomically(out / f"{slug}.md", text, errors="backslashreplace")
        if script is not None:
            write_atomically(out / f"{slug}.py", script)
        written.append(out / f"{slug}.md")
    return written
