"""issue.md of a reproduction bundle: an upstream bug report ready to file, from the bundle's case.json.

Markdown is not escaped by a template engine, so values from the run (messages, names, sources) go into a
code span or a fence longer than any run of backticks inside it, and every other value the template prints
(the title, a failure's wording, a check's name and docstring) is escaped as Markdown text by the template's
finalize: no HTML, links, emphasis, headings or @mentions from a message (harness/text.py's
markdown_text, the one escape every report format uses). code() and fenced()
return Markup, which the finalize leaves as it is.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from harness import check_registry
from harness.device import kinds
from harness.known_failures import finding_titles
from harness.numerics import TOLERANCES
from harness.repro import layout
from harness.text import code_fence, code_span, markdown_text
from harness.vocabulary import Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
TRACEBACK_LINES = 12
MODE_WORDS = {
    "delegate_mutbuf": "buffers delegated (skip_mutable_buffer=False)",
    "skip_mutbuf": "buffers kept outside the delegate (skip_mutable_buffer=True)",
    "meta_llama": "executorch's Meta llama export path",
}


def _finalize(value: object) -> object:
    """Every `{{ }}` of the template: Markup (code spans, fences) as it is, anything else escaped."""
    return value if isinstance(value, Markup) or value is None else markdown_text(value)


def code(value: object) -> Markup:
    """An inline code span that holds value on one line, whatever backticks it contains."""
    return Markup(code_span(value))


def fenced(text: str, language: str = "") -> Markup:
    return Markup(code_fence(text, language))


def _finding_title(reference: str) -> str:
    anchor = reference.partition("#")[2]
    return finding_titles().get(anchor, "see docs/FINDINGS.md")


def _expectations() -> dict[str, str]:
    """What each check expects, in the words of its own docstring's first line."""
    return {
        spec.name: " ".join((spec.function.__doc__ or "it passes").split("\n\n")[0].split()).rstrip(".")
        for spec in check_registry.specs()
    }


# ModelCard's compiler-spec options (generate_qnn_executorch_compiler_spec keywords) a bundle's card records
SPEC_OPTIONS = ("online_prepare", "shared_buffer")


def _pipeline(case: dict) -> str:
    buffers = ", ".join(name.replace(".", "_") for name in case["card"]["mutated_buffers"])
    quantize = (
        ""
        if case["dtype"] == "fp16"
        else f"quantizes with `QnnQuantizer` ({case['dtype']}, `MinMaxObserver`, calibrated on the steps' inputs), "
    )
    if case["mode"] == "meta_llama":
        lower = "lowers as executorch's Meta llama export does (`to_edge`, the QNN capture passes, `QnnPartitioner`)"
    else:
        methods = case["card"].get("methods") or []
        lower = (
            f"lowers {'its methods ' + ', '.join(map(code, methods)) + ' together (a dict of modules and inputs) ' if methods else ''}"
            f"with `to_edge_transform_and_lower_to_qnn` for {case['soc']} "
            f"(`skip_mutable_buffer={case['skip_mutable_buffer']}`{', fp16' if case['dtype'] == 'fp16' else ''}"
            + "".join(f"; compiler spec `{option}=True`" for option in SPEC_OPTIONS if case["card"].get(option))
            + ")"
        )
    serialise = f"`InitializedMutableBufferPass([{buffers}])`"
    if case.get("plan"):  # a multi-method program: memory planning shares the mutable buffers or not
        serialise += f" and `MemoryPlanningPass(share_mutable_buffers={bool(case.get('share_mutable_buffers'))})`"
    if case["card"].get("shared_buffer"):  # graph I/O left to the application, as upstream's export_utils.py does
        serialise += " and `MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)`"
    return f"exports with `torch.export`, {quantize}{lower}, serialises with {serialise}"


def _traced(kind_name: object) -> bool:
    """Whether the kind that ran the case traces every execute (its numbers then come with addresses)."""
    kind = kinds.named(kind_name)
    return kind is not None and kind.has_execute_trace


def _device_words(env: dict) -> str:
    kind = kinds.named(env.get("device_kind"))
    if (kind is not None and kind.emulated) or not env.get("device_serial"):
        return (
            "the x86_64 HTP simulator (an emulated device of the suite, running the .pte with executorch's pybindings)"
        )
    return f"phone {code(env['device_serial'])}"


def _title(case: dict, failing: list[tuple[str, dict]]) -> str:
    """The known failure's reason (its first clause) or the first failing check's line, and where."""
    where = f"{case['card']['name']}, {case['dtype']}, {case['mode']}, {case['soc']}"
    if not failing:
        return f"{where}: passes (reference bundle)"
    check = failing[0][1]
    reason = (
        check["known_failure"].split(": ", 1)[-1].split(" (docs/")[0].split("; ")[0]
        if check["known_failure"]
        else check["message"]
    )
    reason = " ".join(reason.split())
    return f"{reason[:150]}{'...' if len(reason) > 150 else ''} ({where})"


def _groups(failing: list[tuple[str, dict]]) -> list[dict]:
    """Failing checks that say the same thing, together (a lowering failure fails every check alike)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for name, check in failing:
        groups.setdefault(
            (check["verdict"], check["signature"], check["message"] or check["known_failure"]), []
        ).append(name)
    return [
        {"verdict": verdict, "signature": signature, "message": message, "names": names}
        for (verdict, signature, message), names in groups.items()
    ]


@cache
def _template() -> jinja2.Template:
    """Compiled once per process: each bundled check renders its case's issue.md again."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=False,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template("issue.md.j2")


def render(case: dict) -> str:
    """The report for one bundle (case.json as a dict)."""
    failing = [(name, check) for name, check in case["checks"].items() if Verdict(check["verdict"]).bundled]
    causes = sorted({(check["finding"], check["upstream"]) for _, check in failing if check["upstream"]})
    tolerance = TOLERANCES.get(case["dtype"], {})
    folder = layout.folder_name(case["case_id"])
    traceback = case["lowering"].get("traceback", "").strip().splitlines()
    return _template().render(
        case=case,
        env=case["environment"],
        title=_title(case, failing),
        groups=_groups(failing),
        causes=causes,
        mode_words=MODE_WORDS.get(case["mode"], case["mode"]),
        device_words=_device_words(case["environment"]),
        buffers=Markup(", ".join(code(name) for name in case["card"]["mutated_buffers"])),
        plan=Markup(", ".join(f"step {step} {code(method)}" for step, method in enumerate(case.get("plan") or []))),
        pipeline=Markup(_pipeline(case)),
        expectations=_expectations(),
        archive=folder + layout.ARCHIVE_SUFFIX,
        tolerance=(
            f"|device - eager| <= {tolerance['atol']} + {tolerance['range_fraction']} x (eager's value range) "
            f"+ {tolerance['rtol']} x |eager|"
        )
        if tolerance
        else "see the suite",
        traceback_tail="\n".join(traceback[-TRACEBACK_LINES:]),
        has_trace=bool(case.get("numbers")) and _traced(case["environment"].get("device_kind")),
        code=code,
        fenced=fenced,
        finding_title=_finding_title,
    )
