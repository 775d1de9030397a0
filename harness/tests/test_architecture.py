"""The house rules that a reader relies on: no import cycle among the suite's modules, no import up the
layers (docs/ARCHITECTURE.md, "Layers"), the plugin stays wiring, and the repository documents itself
(nothing tracked points outside it)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

PACKAGES = ("harness", "fixtures", "suites")
PLUGIN_MAX_LINES = 150  # in ruff format's layout, which spells a long condition one operand a line
# The packages harness/<pkg>/, lowest first: a module of one imports only its own package's modules, the
# packages before it and the shared modules below. A new package gets its place here.
LAYERS = (
    "harness.qnn",
    "harness.runner",
    "harness.process",
    "harness.device",
    "harness.pipeline",
    "harness.checks",
    "harness.emulator",
    "harness.repro",
    "harness.report",
    "harness.matrix",
)
# Top-level modules the packages may import: the nouns, records and readings the whole house shares. A shared
# module imports only shared modules and packages, and through it no package reaches its own or a higher one.
# Every other top-level module (plugin, session, fixtures, case_store, health, verdicts, reporter, ...)
# wires packages together; no package and no shared module imports one of them.
SHARED = (
    "harness.paths",
    "harness.files",
    "harness.vocabulary",
    "harness.versions",
    "harness.user_state",
    "harness.check_registry",
    "harness.record",
    "harness.known_failures",
    "harness.numerics",
    "harness.horizon",
    "harness.outcome",
    "harness.text",
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in its body), tests left out."""
    files = [p for top in PACKAGES for p in (REPO_ROOT / top).rglob("*.py") if "tests" not in p.parts]
    modules = {_module(p): p for p in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and modules[target].name != "__init__.py":
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, stack + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def _layer(module: str) -> str | None:
    """The package of LAYERS a module belongs to (None: a top-level module, or outside harness)."""
    return next((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), None)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    reached, frontier = set(), {start}
    while frontier:
        reached |= frontier
        frontier = {dep for m in frontier for dep in graph.get(m, ())} - reached
    return reached - {start}


def _arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up the layers, as 'importer -> imported (why)'."""
    found = []
    for module in sorted(graph):
        layer, shared = _layer(module), module in SHARED
        if layer is None and not shared:
            continue  # the top floor imports what it wires
        below = LAYERS[: LAYERS.index(layer)] if layer else LAYERS
        for imported in sorted(graph[module]):
            target = _layer(imported)
            if imported in SHARED and layer is not None:
                higher = sorted({_layer(m) for m in _reach(graph, imported)} - {None, *below})
                if higher:
                    found.append(f"{module} -> {imported} (which reaches {', '.join(higher)}, not below {layer})")
            elif target is None and imported.startswith("harness.") and imported not in SHARED:
                found.append(f"{module} -> {imported} (a top-level module that is not shared)")
            elif layer is not None and target is not None and target != layer and target not in below:
                found.append(f"{module} -> {imported} ({target} is not below {layer})")
    return found


def test_no_import_runs_up_the_layers():
    graph = _import_graph()
    packages = {
        f"harness.{p.name}"
        for p in (REPO_ROOT / "harness").iterdir()
        if (p / "__init__.py").is_file() and p.name != "tests"
    }
    assert packages == set(LAYERS), f"place every package in LAYERS: {sorted(packages ^ set(LAYERS))}"
    assert set(SHARED) <= set(graph), f"SHARED names modules that do not exist: {sorted(set(SHARED) - set(graph))}"
    assert _arrows_up(graph) == [], "imports up the layers:\n" + "\n".join(_arrows_up(graph))


def test_the_layer_rule_catches_an_arrow_up_and_passes_the_house_as_it_should_be():
    house = {
        "harness.qnn.sdk": {"harness.paths"},
        "harness.device.pool": {"harness.qnn.sdk", "harness.user_state"},
        "harness.pipeline.lower": {"harness.vocabulary", "harness.numerics"},
        "harness.numerics": set(),
        "harness.outcome": {"harness.device.pool", "harness.pipeline.lower"},
        "harness.repro.bundle": {"harness.outcome"},
        "harness.session": {"harness.health"},
        "harness.health": {"harness.case_store", "harness.device.pool"},
        "harness.case_store": {"harness.outcome"},
        "harness.paths": set(),
        "harness.vocabulary": set(),
        "harness.user_state": set(),
    }
    assert _arrows_up(house) == []
    assert _arrows_up({**house, "harness.device.health": {"harness.case_store"}}) == [
        "harness.device.health -> harness.case_store (a top-level module that is not shared)"
    ]
    assert _arrows_up({**house, "harness.qnn.sdk": {"harness.device.pool"}}) == [
        "harness.qnn.sdk -> harness.device.pool (harness.device is not below harness.qnn)"
    ]
    assert _arrows_up({**house, "harness.numerics": {"harness.pipeline.lower"}}) == [
        "harness.pipeline.lower -> harness.numerics (which reaches harness.pipeline, not below harness.pipeline)"
    ]
    assert _arrows_up({**house, "harness.device.pool": {"harness.outcome"}}) == [
        "harness.device.pool -> harness.outcome (which reaches harness.device, harness.pipeline, not below harness.device)"
    ]
    assert _arrows_up({**house, "harness.outcome": {"harness.case_store"}}) == [
        "harness.outcome -> harness.case_store (a top-level module that is not shared)"
    ]


def test_no_import_cycle():
    graph = _import_graph()
    assert len(graph) > 50, "the walk found the project's modules"
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_report_package_does_not_import_torch():
    graph = _import_graph()
    # The package (merge, diff, history, the gate run without torch), not the controller's harness.reporter.
    reached, frontier = set(), {m for m in graph if m == "harness.report" or m.startswith("harness.report.")}
    while frontier:
        reached |= frontier
        frontier = {dep for m in frontier for dep in graph[m]} - reached
    heavy = [
        m
        for m in reached
        if m in ("harness.pipeline.card", "harness.numerics", "harness.case_store", "harness.outcome")
        or m == "harness.checks"
        or m.startswith("harness.checks.")
    ]
    assert heavy == [], f"harness.report reaches {heavy}"


def test_no_issue_labels_in_code():
    """Code says why, not which ticket asked for it: no `(issue NN)` label in a module, card file or manifest."""
    labelled = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for top in PACKAGES
        for path in sorted((REPO_ROOT / top).rglob("*"))
        if path.suffix in (".py", ".c", ".cpp", ".toml", ".j2")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bissue [0-9]", line)
    ]
    assert labelled == [], f"drop the issue labels (say why instead): {labelled}"


def test_plugin_is_wiring_only():
    lines = len((REPO_ROOT / "harness" / "plugin.py").read_text().splitlines())
    assert lines <= PLUGIN_MAX_LINES, f"harness/plugin.py has {lines} lines: move logic into the module that owns it"


def test_no_tracked_file_points_outside_the_repository():
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to read")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    outside = "../" + "shared"  # spelled in two pieces so this file does not match itself
    offenders = [
        name
        for name in tracked.decode().split("\0")
        if name and (REPO_ROOT / name).is_file() and outside in (REPO_ROOT / name).read_text(errors="replace")
    ]
    assert offenders == [], f"these files point at {outside}, which users of the suite do not have: {offenders}"


# harness/report/ in three parts, lowest first: the report itself (document, intake, the gates), its rendering,
# the nightly tools. A module of one imports only modules of its own part and of the parts before it (the
# package's __init__ and its command line, __main__, stand over all three).
REPORT_PARTS = ("harness.report", "harness.report.render", "harness.report.nightly")
REPORT_TOP = ("harness.report", "harness.report.__main__")


def _report_part(module: str) -> str:
    return next(p for p in reversed(REPORT_PARTS) if module == p or module.startswith(p + "."))


def _report_arrows_up(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module in sorted(m for m in graph if _layer(m) == "harness.report" and m not in REPORT_TOP):
        part = REPORT_PARTS.index(_report_part(module))
        for imported in sorted(i for i in graph[module] if _layer(i) == "harness.report"):
            if REPORT_PARTS.index(_report_part(imported)) > part:
                found.append(f"{module} -> {imported} ({_report_part(imported)} is above {_report_part(module)})")
    return found


def test_the_report_parts_import_downward_only():
    assert _report_arrows_up(_import_graph()) == []
    house = {"harness.report.gate": {"harness.report.document"}, "harness.report.render.page": {"harness.report.gate"}}
    assert _report_arrows_up(house) == []
    assert _report_arrows_up({**house, "harness.report.gate": {"harness.report.render.page"}}) == [
        "harness.report.gate -> harness.report.render.page (harness.report.render is above harness.report)"
    ]
