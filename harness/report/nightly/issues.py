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

from harness.device import kinds
from harness.files import read_regular
from harness.report.document import checks_of, rank
from harness.report.gate import read_documents
from harness.text import code_fence, code_span, markdown_text
from harness.user_state import folder_problem
from harness.vocabulary import DTYPES, MODE_ORDER, QUANT_DTYPES, Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
FILED = re.compile(r"\[upstream: (https://github\.com/pytorch/[a-z]+/(?:issues|pull)/[0-9]{1,9})\]")  # describe()
FINDING_REFERENCE = re.compile(r"FINDINGS\.md#(F[0-9]+)\b")
MAX_JSON_BYTES = 16 * 1024 * 1024  # a bundle's case.json is tens of KB
MAX_SOURCE_BYTES = 1024 * 1024  # a card module
CARD_FILE = re.compile(r"^card/[A-Za-z0-9_]{1,100}\.py$")
SOURCE_PATH = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+\.(?:py|cpp|cc|h|hpp)$")
VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+){1,3}")
# docs/FINDINGS.md's sections: the only finding names a finding's files take as they are
FINDING_ID = re.compile(r"^F[0-9]{1,6}$")
FILE_STEM = re.compile(r"^(?:F[0-9]{1,6}|new-[a-z0-9_]{1,60}(?:-[a-z0-9_]{1,60})?(?:-[0-9]{1,4})?)$")
TORCH_DTYPE = re.compile(r"^torch\.(?:u?int(?:8|16|32|64)|float(?:16|32|64)|bfloat16|bool)$")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
MAX_PLAN_STEPS = 1000
# What shows a finding in its script, by the failing check's signature (harness/checks/); any other
# signature is a state or initial-state failure: the outputs against eager.
DEFECT_KINDS = {
    "lowering_failed": "error",
    "not_run": "error",
    "buffer_annotated": "annotation",
    "buffer_outside_delegate": "outside",
    "no_mutbuf_pair": "outside",
    "buffer_not_outside": "inside",
    "partition_count": "partitions",
    "buffer_encoding_mismatch": "encoding",
}
DEFECT_WORDS = {
    "numbers": "the failing mode's outputs leave the tolerance against eager at some step",
    "error": "lowering, loading or running the failing mode raises",
    "annotation": "the quantizer annotates a mutated buffer as an op's input",
    "outside": "a mutated buffer stays outside the delegate although skip_mutable_buffer=False",
    "inside": "a mutated buffer is taken into the delegate although skip_mutable_buffer=True",
    "partitions": "a method lowers to another number of delegates than the card expects",
    "encoding": "the methods quantize their reads of one shared buffer with different encodings",
}
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
        return read_regular(path, limit)
    except (OSError, ValueError):
        return None


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


def _assigned(target: ast.expr) -> set[str]:
    """The names an assignment target binds (not `A[i] = ...` or `a.b = ...`, which bind none)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _assigned(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for element in target.elts for name in _assigned(element)}
    return set()


def _bound(statement: ast.stmt) -> set[str]:
    if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in statement.names}
    if isinstance(statement, ast.Assign):  # `A = ...` and `A, B = ...` (nested and starred too)
        return {name for target in statement.targets for name in _assigned(target)}
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


def _argument(text: object) -> str | None:
    """One recorded argument as the script's code: a torch dtype as it is, anything else parsed as a Python
    literal and printed again by repr (never copied as text); None when it is neither."""
    if not isinstance(text, str) or len(text) > 1000:
        return None
    if TORCH_DTYPE.match(text):
        return text
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _arguments(recorded: object) -> tuple[str, str] | None:
    """A card's recorded call arguments (harness/repro/bundle.py card_record) as the script's (args, kwargs)
    expressions; None when unusable."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("args"), list):
        return None
    kwargs = recorded.get("kwargs") if isinstance(recorded.get("kwargs"), dict) else None
    if kwargs is None or len(recorded["args"]) + len(kwargs) > 20:
        return None
    args = [_argument(text) for text in recorded["args"]]
    values = {str(key): _argument(text) for key, text in kwargs.items() if IDENTIFIER.match(str(key))}
    if None in args or None in values.values() or len(values) != len(kwargs):
        return None
    return (
        "(" + "".join(f"{arg}, " for arg in args) + ")",
        "{" + ", ".join(f"{key!r}: {value}" for key, value in values.items()) + "}",
    )


def _plan(case: dict) -> tuple[list[str], list[str]] | None:
    """(methods, the method of each step) of a multi-method card, ([], []) of a single-method one; None when
    the bundle's record of them is unusable."""
    methods = (case.get("card") or {}).get("methods") or []
    plan = case.get("plan") or []
    if not methods:
        return [], []
    if not isinstance(methods, list) or not isinstance(plan, list) or not 0 < len(plan) <= MAX_PLAN_STEPS:
        return None
    if not all(isinstance(m, str) and IDENTIFIER.match(m) and m != "forward" for m in methods):
        return None
    if not all(step in methods for step in plan) or len(plan) != case.get("steps"):
        return None
    return [str(m) for m in methods], [str(step) for step in plan]


def _tolerance(case: dict) -> dict[str, float] | None:
    recorded = case.get("tolerance")
    if not isinstance(recorded, dict):
        return None
    try:
        values = {key: float(recorded[key]) for key in ("atol", "rtol", "range_fraction")}
    except (KeyError, TypeError, ValueError):
        return None
    return values if all(math.isfinite(v) and v >= 0 for v in values.values()) else None


def defect_kind(signature: str) -> str:
    """What shows a finding in its script (DEFECT_WORDS), from the failing check's signature."""
    return DEFECT_KINDS.get(signature, "numbers")


# A lowering failure as a check records it: "lowering failed: RuntimeError: Tried to erase Node getitem ...".
LOWERING_ERROR = re.compile(r"lowering failed: ([A-Za-z_][A-Za-z0-9_.]*): (.+)")
RECORDED_ERROR_WORDS = 4  # enough to tell the defect's error from an SDK or library that does not come up


def recorded_error(message: str) -> tuple[str, list[str]] | None:
    """The type and first words (digits as #) of the lowering error a failing check recorded, which a finding's
    script must see again before it says the defect shows; None when the check recorded no lowering error (a
    device run's error has other words on the host, so the script then takes any error of the failing mode)."""
    found = LOWERING_ERROR.match(message.strip())
    if found is None:
        return None
    return found.group(1), re.sub(r"[0-9]+", "#", found.group(2)).split()[:RECORDED_ERROR_WORDS]


def minimal_script(
    title: str, finding: str, case: dict, module_source: str, failing: Member | None = None
) -> str | None:
    """The runnable script of a finding (None when the bundle's card cannot be cut out on its own: its model
    needs the suite, its arguments are not literals, it asks for QNN shared buffers, which only a device's
    runtime allocates, or its case is driven, whose steps and reloads come from the suite's drivers: its
    bundle's repro.py drives it). failing: the failing check the script shows (its signature and buffer mode)."""
    if case.get("driver"):
        return None
    card = case.get("card") or {}
    model_name = _defined_name(str(card.get("build_source") or ""))
    steps_name = _defined_name(str(card.get("steps_source") or ""))
    code = card_code(module_source, model_name or "", steps_name or "") if model_name and steps_name else None
    model_arguments = _arguments(card.get("build_arguments", {"args": [], "kwargs": {}}))
    steps_arguments = _arguments(card.get("steps_arguments", {"args": [], "kwargs": {}}))
    plan, tolerance = _plan(case), _tolerance(case)
    if None in (code, model_arguments, steps_arguments, plan, tolerance) or card.get("shared_buffer"):
        return None
    signature = str((failing.check.get("signature") if failing else "") or "")
    kind = defect_kind(signature)
    failing_skip = (failing.case["mode"] if failing else case.get("mode")) == "skip_mutbuf"
    methods, steps_plan = plan
    expected = card.get("expected_partitions") if isinstance(card.get("expected_partitions"), int) else 1
    settings = {
        "soc": str(case.get("soc")),
        "dtype": str(case.get("dtype")),
        "steps": case["steps"] if isinstance(case.get("steps"), int) and 0 < case["steps"] <= MAX_PLAN_STEPS else 4,
        "buffers": [str(b) for b in card.get("mutated_buffers") or []],
        "quant": QUANT_DTYPES.get(str(case.get("dtype")), ""),
        "methods": methods,
        "plan": steps_plan,
        "share": bool(case.get("share_mutable_buffers")),
        "online_prepare": bool(card.get("online_prepare")),
        "failing_skip": failing_skip,
        "defect": kind,
        "tolerance": tolerance,
        "expected_delegates": max(1, expected // max(1, len(methods))),
        "recorded_error": recorded_error(str((failing.check.get("message") if failing else "") or "")),
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
        multi_method=bool(methods),
        failing_skip=failing_skip,
        defect_words=DEFECT_WORDS[kind],
        settings={
            **{key: repr(value) for key, value in settings.items()},
            "model_args": model_arguments[0],
            "model_kwargs": model_arguments[1],
            "steps_args": steps_arguments[0],
            "steps_kwargs": steps_arguments[1],
        },
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


def file_stem(finding: str, representative: Member, taken: set[str]) -> str:
    """The name of a finding's files: its id when it is a FINDINGS.md section (F<n>), else new-<check>[-<signature>]
    from the failing check's own words reduced to [a-z0-9_] (never a report's text as it is: a planted report
    must not name a file, say sitecustomize.py); a suffix when two findings would share a name."""
    if FINDING_ID.match(finding):
        stem = finding
    else:
        check = re.sub(r"[^a-z0-9_]", "", representative.check_name.lower())[:60] or "check"
        signature = re.sub(r"[^a-z0-9_]", "", str(representative.check.get("signature") or "").lower())[:60]
        stem = f"new-{check}" + (f"-{signature}" if signature else "")
    unique, number = stem, 1
    while unique in taken:
        number += 1
        unique = f"{stem}-{number}"
    if not FILE_STEM.match(unique):
        raise IssuesError(f"finding {finding!r} gives no safe file name: report it as a bug of the suite")
    taken.add(unique)
    return unique


def _finalize(value: object) -> object:
    return value if isinstance(value, Markup) or value is None else markdown_text(value)


def plain_title(text: str) -> str:
    """A title as plain text, as GitHub's title field takes it (no Markdown escapes): one printable line, at
    most 150 characters, without what would make HTML or a link of it in the issue's heading."""
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return re.sub(r"[<>]", "", line).replace("](", "] (")[:150]


def _title(finding: str, representative: Member) -> str:
    from harness.known_failures import finding_titles  # needs `packaging` (see render)

    check = representative.check
    title = finding_titles().get(finding) or (
        check["known_failure"].split(": ", 1)[-1].split(" (docs/")[0]
        if check["known_failure"]
        else f"{representative.check_name} fails: {check['message']}"
    )
    return plain_title(title)


def _bundles(members: list[Member]) -> tuple[list[tuple[str, str]], int]:
    """(SoC, bundle) of the members' bundles present in the folder, and how many the reports name that are not
    (a night promoted with --no-bundles keeps the reports' links, not the bundles)."""
    named = {(m.document["soc"], m.check["repro"], m.folder) for m in members if m.check.get("repro")}
    present = sorted(
        {
            (soc, repro)
            for soc, repro, folder in named
            if not (folder / repro).is_symlink() and (folder / repro).is_dir()
        }
    )
    return present, len({(soc, repro) for soc, repro, _ in named}) - len(present)


def _emulated_kind(name: object) -> bool:
    """A bundle's recorded device kind is an emulated one (an unknown or missing kind is not)."""
    kind = kinds.named(name)
    return kind is not None and kind.emulated


def _setup(environment: dict, case: dict) -> dict:
    """Where the run was, for the issue text: the simulator or a phone, the suite's bridges, the QNN versions
    (the library's API, the one executorch says it was tested against, where its build pins QAIRT)."""
    recorded = case.get("environment") if isinstance(case.get("environment"), dict) else {}
    version = VERSION.match(str(environment.get("executorch") or ""))
    return {
        "simulator": environment.get("emulated") is True or _emulated_kind(recorded.get("device_kind")),
        "device_bridge": environment.get("bridge") == "on" or recorded.get("device_config_bridge") is True,
        "compose_bridge": environment.get("compose_bridge") == "on",
        "qnn_api": str(environment.get("qnn_api") or "not recorded"),
        "executorch_qnn_api": str(environment.get("executorch_qnn_api") or "not recorded"),
        "pin": Markup(
            "https://github.com/pytorch/executorch/blob/"
            + (f"v{version.group(0)}" if version else "main")
            + "/backends/qualcomm/scripts/qnn_config.sh"
        ),
    }


def render(finding: str, members: list[Member], script_name: str) -> tuple[str, str | None]:
    """(issue.md, the script or None) of one finding."""
    representative = _representative(members)
    case, module_source = _bundle(representative)
    if case.get("driver"):  # a case on its card's own steps, which a script can carry, shows it too where any
        undriven = [member for member in members if not _bundle(member)[0].get("driver")]
        if undriven:
            representative = _representative(undriven)
            case, module_source = _bundle(representative)
    environment = representative.document["environment"]
    check = representative.check
    title = _title(finding, representative)
    script = minimal_script(title, finding, case, module_source, representative) if case else None
    upstream = _upstream(representative, case)
    members = sorted(members, key=lambda m: (m.document["soc"], m.case["case_id"], m.check_name))
    bundles, missing_bundles = _bundles(members)
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
        title=Markup(title),
        representative=representative,
        control=_control(representative),
        members=members,
        cases=sorted({(m.document["soc"], m.case["case_id"]) for m in members}),
        modes=sorted({m.case["mode"] for m in members}),
        dtypes=sorted({m.case["dtype"] for m in members}, key=lambda d: rank(DTYPES, d)),
        env=environment,
        setup=_setup(environment, case),
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
        defect_words=DEFECT_WORDS[defect_kind(str(check.get("signature") or ""))],
        upstream=upstream,
        links=_links(upstream, environment),
        bundles=bundles,
        missing_bundles=missing_bundles,
        filed=[Markup(url) for url in sorted({u for m in members for u in FILED.findall(m.check["known_failure"])})],
        code=lambda value: Markup(code_span(value)),
    )
    return text, script


def _output_folder(out: Path) -> int:
    """A descriptor of the output folder, made 0700 if missing; refused unless it is a real folder of this
    user's that nobody else may write (a link, or another account's folder, would let that account choose
    where the scripts land). Every file is then written relative to it, so no link on the way is followed."""
    try:
        out.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise IssuesError(
            f"cannot create the issues folder {out} ({error.strerror}): pass another with --out"
        ) from None
    try:
        descriptor = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        problem = "is a symlink" if out.is_symlink() else "is not a folder"
    else:
        problem = folder_problem(os.fstat(descriptor), stat.S_IWGRP | stat.S_IWOTH, "writable by others")
        if not problem:
            return descriptor
        os.close(descriptor)
    raise IssuesError(
        f"the issues folder {out} {problem}: someone else could choose what is written there; "
        f"remove it or pass a folder of your own with --out"
    )


def _write_in(folder: int, name: str, text: str) -> None:
    """name (a file name checked by the caller) written in the folder's descriptor via a new temporary file
    (O_EXCL, no link followed) renamed over it: a planted link is replaced, never written through."""
    temporary = f".{name}.tmp{os.getpid()}"
    descriptor = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
    )
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(text.encode("utf-8", "backslashreplace"))
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        os.unlink(temporary, dir_fd=folder)
        raise


def write(run: Path, out: Path | None = None) -> list[Path]:
    """<out>/<finding>.md (and .py) for every finding of the run; out defaults to RUN/issues. Returns the .md files."""
    findings = group(run)
    out = out or run / "issues"
    folder = _output_folder(out)
    written, taken = [], set()
    try:
        for finding, members in sorted(findings.items()):
            stem = file_stem(finding, _representative(members), taken)
            text, script = render(finding, members, f"{stem}.py")
            _write_in(folder, f"{stem}.md", text)
            if script is not None:
                _write_in(folder, f"{stem}.py", script)
            written.append(out / f"{stem}.md")
    finally:
        os.close(folder)
    return written


def missing_bundles(run: Path) -> int:
    """How many bundles the run's failing checks name that its folder does not hold."""
    return sum(_bundles(members)[1] for members in group(run).values())
