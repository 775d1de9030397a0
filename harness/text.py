"""Text from a run (failure messages, card names, a runner's log) made inert for the formats reports use.

A failure message is executorch's or the runner's words, and a report file may come from elsewhere: in
Markdown (summary.md, a repro bundle's issue.md) `<img src=...>`, `[link](...)`, `@team`, a `|` or a
newline would render as an image, a link, a notification, a broken table. Every report renderer takes
its strings through here, so what is escaped, and how, is decided once. Imports nothing of the suite:
harness/repro/ uses it too.
"""

from __future__ import annotations

import re

# Shown as their escapes (`\x1b`, `\udc80`): control characters a runner log carries, and lone surrogates.
UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
# What starts markup in GitHub Markdown anywhere in a line: HTML and entities, links and images, code,
# emphasis and strikethrough, math, table cells, footnotes. CommonMark renders each backslash-escaped
# punctuation character as itself. `_` only at a word's edge (inside a word, as in delegate_mutbuf, GFM
# makes no emphasis of it), so names stay as they read in the raw file.
_MARKUP = re.compile(r"""([\\`*{}\[\]<>()#+!|~&$^@"]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))""")
# What starts a block only at the start of a line: a list item, a quote, a heading, a rule.
_LINE_START = re.compile(r"^(?:([-=])|(\d+)\.(?=\s|$))")  # an ordered list needs "1. "; a version 1.5.1 is none
# GitHub links @user, @org/team, #123 and bare URLs after Markdown is rendered, escaped or not: a
# zero-width space after the sign (and inside `://` and `www.`) keeps the text as it reads and links nothing.
_LINKED = re.compile(r"(\\[@#](?=\w)|:(?=//)|(?<![\w.])www(?=\.))", re.IGNORECASE)
ZERO_WIDTH_SPACE = "\u200b"


def printable(text: str) -> str:
    """text with control characters and lone surrogates as their escapes (`\\x1b`), everything else kept."""
    return UNPRINTABLE.sub(lambda match: match.group(0).encode("unicode_escape", "backslashreplace").decode(), text)


def markdown_text(text: object) -> str:
    """text as one line of inert Markdown: it renders as the characters it holds (also in a table cell),
    never as markup, a link, an image, a mention or more than one line."""
    flat = " ".join(printable(str(text)).replace("\r", "\n").split("\n")).strip()  # no indented code block
    escaped = _LINE_START.sub(
        lambda m: f"\\{m.group(1)}" if m.group(1) else f"{m.group(2)}\\.", _MARKUP.sub(r"\\\1", flat)
    )
    return _LINKED.sub(lambda m: m.group(0) + ZERO_WIDTH_SPACE, escaped)


def code_span(text: object) -> str:
    """text on one line as a Markdown code span, delimited by more backticks than any run inside it."""
    flat = " ".join(str(text).split())
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", flat)), default=0) + 1)
    return f"{ticks} {flat} {ticks}" if flat else "(none)"


def code_fence(text: str, language: str = "") -> str:
    """text as a fenced Markdown code block whose fence no line of text can close."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}\n"
