"""The house rules that a reader relies on: no import cycle among the suite's modules, the plugin stays
wiring, and the repository documents itself (nothing tracked points outside it)."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT

PACKAGES = ("harness", "fixtures", "suites")
PLUGIN_MAX_LINES = 150


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
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, stack + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle():
    graph = _import_graph()
    assert len(graph) > 50, "the walk found the project's modules"
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_report_package_does_not_import_torch():
    graph = _import_graph()
    reached, frontier = set(), {m for m in graph if m.startswith("harness.report")}
    while frontier:
        reached |= frontier
        frontier = {dep for m in frontier for dep in graph[m]} - reached
    heavy = [m for m in reached if m in ("harness.pipeline.card", "harness.numerics", "harness.checks", "harness.case_store", "harness.outcome")]
    assert heavy == [], f"harness.report reaches {heavy}"


def test_plugin_is_wiring_only():
    lines = len((REPO_ROOT / "harness" / "plugin.py").read_text().splitlines())
    assert lines <= PLUGIN_MAX_LINES, f"harness/plugin.py has {lines} lines: move logic into the module that owns it"


def test_no_tracked_file_points_outside_the_repository():
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to read")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    outside = "../" + "shared"  # spelled in two pieces so this file does not match itself
    offenders = [name for name in tracked.decode().split("\0") if name and (REPO_ROOT / name).is_file()
                 and outside in (REPO_ROOT / name).read_text(errors="replace")]
    assert offenders == [], f"these files point at {outside}, which users of the suite do not have: {offenders}"
