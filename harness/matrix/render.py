"""matrix.md and matrix.html from the side-by-side document, both with jinja2 templates.

HTML is autoescaped; in Markdown every value from a report (case ids, messages) goes through `md`,
which keeps it inside its table cell (pipes, newlines, backticks and angle brackets neutralised).
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2

from harness.matrix.layout import OUTPUTS
from harness.text import markdown_text
from harness.vocabulary import Verdict

TEMPLATES = Path(__file__).resolve().parent / "templates"
CROSS_MARKDOWN = "cross.md"  # beside cross.json (harness/matrix/cross.py)


def md(value: object) -> str:
    """One Markdown table cell's worth of text from any value (harness/text.py: the one escape)."""
    return markdown_text("" if value is None else value)


def _environment(autoescape: bool) -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters["md"] = md
    environment.globals["eager"] = _eager
    environment.filters["verdict"] = label
    return environment


def label(cell: dict | None) -> str:
    """A side-by-side cell's label: the verdict's own (Verdict.label), a column's `absent`, or `n/a` for no cell."""
    if cell is None:
        return "n/a"
    return verdict.label if (verdict := Verdict.of(cell["verdict"])) else str(cell["verdict"])


def _eager(row: dict) -> str:
    """A cross run's outputs against eager (kept beside the comparison that decides its outcome): where the
    runtime's own lowering is off eager too (a known defect), this says so."""
    try:
        mismatches, worst = int(row["eager_mismatches"]), max(map(float, row.get("eager_max_error_per_step") or [0.0]))
    except (KeyError, TypeError, ValueError):  # no eager comparison (a refusal), or a cross.json that is not ours
        return ""
    return f"{mismatches} off, max {worst:.3g}" if mismatches else f"within (max {worst:.3g})"


def _heading(column: dict) -> str:
    return f"{column['executorch']} / QAIRT {column['qairt']}"


def render_markdown(document: dict, cross: dict | None = None) -> str:
    return _environment(False).get_template("matrix.md.j2").render(document=document, heading=_heading, cross=cross)


def render_html(document: dict, cross: dict | None = None) -> str:
    return _environment(True).get_template("matrix.html.j2").render(document=document, heading=_heading, cross=cross)


def render_cross_markdown(cross: dict) -> str:
    """cross.md: the cross-version section of the matrix page on its own (harness/matrix/cross.py)."""
    return _environment(False).get_template("cross.md.j2").render(cross=cross)


def write(document: dict, folder: Path, cross: dict | None = None) -> list[Path]:
    """matrix.json, matrix.md and matrix.html in `folder` (with the cross-version section, and cross.md, when
    `cross`, the document of cross.json, is given)."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = (json.dumps(document, indent=1) + "\n", render_markdown(document, cross), render_html(document, cross))
    paths = []
    for name, text in zip(OUTPUTS, texts):
        (folder / name).write_text(text, encoding="utf-8")
        paths.append(folder / name)
    if cross is not None:  # cross.md beside cross.json, re-rendered with the page
        (folder / CROSS_MARKDOWN).write_text(render_cross_markdown(cross), encoding="utf-8")
        paths.append(folder / CROSS_MARKDOWN)
    return paths
