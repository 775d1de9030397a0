"""Inline SVG of a state check's max abs error per step (log scale), small enough for a table popover,
with the error the tolerance allows at each step as a dashed line (steps recorded before steps carried
their tolerance have none: no line).

Drawn by hand so the HTML stays self-contained: no chart library, no script, no network. The page inserts
it as markup, so every value from the report that reaches it is escaped here (a step label, a tooltip).
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 280, 96
LEFT, RIGHT, TOP, BOTTOM = 40, 10, 8, 20
MAX_GRID_LINES = 5


def _number(value: object) -> float:
    """Report numbers may be "Infinity"/"-Infinity"/"NaN" strings; float() reads those too."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _decade(exponent: int) -> str:
    return "1" if exponent == 0 else f"1e{exponent}"


def error_chart(steps: list[dict]) -> str:
    """SVG markup: one point per step, red where the step had mismatches; non-finite errors sit on the top edge."""
    if not steps:
        return ""
    errors = [_number(s.get("max_abs_error")) for s in steps]
    allowed = [_number(s.get("tolerance")) for s in steps]
    positive = [e for e in errors + allowed if math.isfinite(e) and e > 0]
    low_exp = math.floor(math.log10(min(positive))) - 1 if positive else -6
    high_exp = math.ceil(math.log10(max(positive))) if positive else 0
    high_exp = max(high_exp, low_exp + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(index: int) -> float:
        return LEFT + (plot_w / 2 if len(steps) == 1 else plot_w * index / (len(steps) - 1))

    def y_of(error: float) -> float:
        if not math.isfinite(error):
            return TOP
        exponent = math.log10(error) if error > 0 else low_exp
        return TOP + plot_h * (high_exp - exponent) / (high_exp - low_exp)

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="max abs error per step">'
    ]
    stride = max(1, math.ceil((high_exp - low_exp) / (MAX_GRID_LINES - 1)))
    for exponent in range(high_exp, low_exp - 1, -stride):
        y = y_of(10.0**exponent)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_decade(exponent)}</text>'
        )
    line = [(x_of(i), y_of(a)) for i, a in enumerate(allowed) if math.isfinite(a) and a > 0]
    if line:
        if len(line) == 1:  # one step: a level line across the plot
            line = [(LEFT, line[0][1]), (WIDTH - RIGHT, line[0][1])]
        parts.append(
            '<polyline class="tolerance" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in line) + '">'
            "<title>tolerance: the error allowed at each step's worst element</title></polyline>"
            f'<text class="tolerance-label" x="{WIDTH - RIGHT}" y="{max(TOP + 8, line[-1][1] - 3):.1f}" '
            'text-anchor="end">tolerance</text>'
        )
    points = [(x_of(i), y_of(e)) for i, e in enumerate(errors)]
    parts.append('<polyline class="line" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    for step, error, limit, (x, y) in zip(steps, errors, allowed, points):
        bad = _number(step.get("mismatches")) > 0 or not math.isfinite(error)
        tip = (
            f"step {step.get('step')}: max abs error {error:.3g}, SQNR {_number(step.get('sqnr_db')):.1f} dB, "
            f"{step.get('mismatches')} mismatch(es)" + (f", tolerance {limit:.3g}" if math.isfinite(limit) else "")
        )
        parts.append(
            f'<circle class="{"bad" if bad else "ok"}" cx="{x:.1f}" cy="{y:.1f}" r="3">'
            f"<title>{escape(tip)}</title></circle>"
        )
    baseline = HEIGHT - 5
    first, last = (escape(str(step.get("step"))) for step in (steps[0], steps[-1]))
    parts.append(
        f'<text class="axis" x="{LEFT}" y="{baseline}">step {first}</text>'
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{baseline}" text-anchor="end">step {last}</text>'
        f'<text class="axis" x="{LEFT + plot_w / 2:.1f}" y="{baseline}" text-anchor="middle">max abs error</text>'
        "</svg>"
    )
    return "".join(parts)


def step_time_chart(series: dict[str, list[int]]) -> str:
    """SVG markup: execute time per step (linear, from 0) of each named series (a card's buffer modes),
    one line each, a legend and a tooltip per point; every name from the report is escaped here."""
    series = {name: [int(v) for v in values] for name, values in series.items() if values}
    if not series:
        return ""
    longest = max(len(values) for values in series.values())
    top = max(max(values) for values in series.values()) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(index: int) -> float:
        return LEFT + (plot_w / 2 if longest == 1 else plot_w * index / (longest - 1))

    def y_of(micros: int) -> float:
        return TOP + plot_h * (1 - micros / top)

    parts = [
        f'<svg class="chart steps" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="execute time per step">'
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = y_of(round(top * fraction))
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{top * fraction / 1000:.3g}</text>'
        )
    for number, (name, values) in enumerate(series.items()):
        points = [(x_of(i), y_of(v)) for i, v in enumerate(values)]
        parts.append(
            f'<polyline class="series series-{number % 4}" points="'
            + " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            + f'"><title>{escape(name)}</title></polyline>'
        )
        for index, ((x, y), micros) in enumerate(zip(points, values)):
            parts.append(
                f'<circle class="series-{number % 4}" cx="{x:.1f}" cy="{y:.1f}" r="2.5">'
                f"<title>{escape(f'{name} step {index}: {micros} us')}</title></circle>"
            )
        parts.append(
            f'<text class="legend series-{number % 4}" x="{WIDTH - RIGHT}" y="{TOP + 10 + 11 * number}" '
            f'text-anchor="end">{escape(name)}</text>'
        )
    baseline = HEIGHT - 5
    parts.append(
        f'<text class="axis" x="{LEFT}" y="{baseline}">step 0</text>'
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{baseline}" text-anchor="end">step {longest - 1}</text>'
        f'<text class="axis" x="{LEFT + plot_w / 2:.1f}" y="{baseline}" text-anchor="middle">execute ms</text>'
        "</svg>"
    )
    return "".join(parts)
