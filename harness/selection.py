"""Why a run's selection holds no check: the filter that emptied it, named in one line with its fix.

pytest says only "no tests ran" (exit 5) when -k, --soc, --dtype or --shard leave nothing; a newcomer then
cannot tell which of them did it. The filters are applied here again one at a time, in the order the run
applies them (the devices' SoCs, the dtypes, -k, the shard), over the same matrices the plugin parametrizes
(`check_registry` specs over `pipeline.cases`), and the first one after which nothing is left is named."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness import check_registry
from harness.pipeline import card as card_registry, cases
from harness.vocabulary import DTYPES, Case


def _keyword_matcher(expression: str) -> Callable[[str, Case], bool]:
    """-k as pytest evaluates it on a check's test: a name matches as a case-insensitive substring of the
    test's names (its function, its case id, its module and folder)."""
    from _pytest.mark.expression import Expression

    compiled = Expression.compile(expression.lstrip())

    def matches(check: str, case: Case) -> bool:
        names = (f"test_{check}", case.id, f"test_{check}.py", "suites", f"test_{check}[{case.id}]")
        return compiled.evaluate(lambda name, **_: any(name.lower() in known.lower() for known in names))

    return matches


def empty_selection_line(
    device_socs: Sequence[str],
    soc_filter: Sequence[str],
    dtypes: Sequence[str],
    keyword: str,
    sharded: str | None,
) -> str | None:
    """The one line that names the filter which left no check, or None when the selection is not empty
    before the shard (then pytest's own words, or the shard's, are the story)."""
    socs = [soc for soc in device_socs if not soc_filter or soc in soc_filter]
    if not socs:
        return (
            f"no check selected: --soc {','.join(soc_filter)} matches none of this run's devices "
            f"({', '.join(device_socs) or 'none'}): pass one of their SoCs, or a device of that SoC"
        )
    cards = card_registry.cards()

    def selected(dtype_choice: Sequence[str]) -> list[tuple[str, Case]]:
        return [
            (spec.name, case)
            for spec in check_registry.specs()
            for case in (spec.matrix or cases.matrix)(cards, tuple(dtype_choice), socs)
        ]

    checks = selected(dtypes)
    if not checks:
        return (
            f"no check selected: no card is made in --dtype {','.join(dtypes)} on {', '.join(socs)} "
            f"(dtypes: {', '.join(DTYPES)}): pass another --dtype"
        )
    if keyword and keyword.strip():
        matches = _keyword_matcher(keyword)
        if not any(matches(check, case) for check, case in checks):
            example = f"test_{checks[0][0]}[{checks[0][1].id}]"
            return (
                f"no check selected: -k {keyword!r} matches none of the {len(checks)} checks the other options "
                f"select (their names look like {example}; a -k name matches part of one): loosen -k"
            )
    if sharded:
        return f"no check selected: --shard {sharded} got none of the selection's checks: use fewer shards"
    return None
