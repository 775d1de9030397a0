"""Structural performance facts from real lowerings (harness/pipeline/structure.py), gated exactly by
harness/report/structure_gate.py: counter_add fp16 lowered clean and five times again gates against itself
without a single change, and two lowering regressions injected into the same lowering (harness/tests/pipeline/
injected_lowering.py: a pass that adds a transpose pair, a partitioner that leaves the multiply on the CPU)
each fail the gate with a line naming the op and the graph. Three lowering processes, a few minutes here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.outcome import CaseOutcome
from harness.paths import REPO_ROOT
from harness.pipeline import card as cards
from harness.pipeline.facts import LoweringFacts, LoweringRequest
from harness.report.structure_gate import FAIL, PASS, StructureVerdict, facts_of, judge
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
CARD, SOC, STEPS = "fixtures.zoo:counter_add", "SM8650", 4
CLEAN_RUNS = 6  # a baseline and five clean reruns


def _lower(toolchain, root: Path, injection: str, runs: list[tuple[str, Mode]]) -> dict[str, dict]:
    """Each (name, mode) lowered in one process with the injection in force: name -> the case's structure as
    its record carries it (harness/outcome.py CaseOutcome.structure)."""
    requests = []
    for name, mode in runs:
        folder = root / name
        folder.mkdir(parents=True)
        LoweringRequest(CARD, "fp16", mode, SOC, STEPS, str(folder)).write(folder / "request.json")
        requests.append(folder / "request.json")
    completed = subprocess.run(
        [sys.executable, "-m", "harness.tests.pipeline.injected_lowering", injection, *map(str, requests)],
        cwd=REPO_ROOT,
        env=toolchain.child_env(base={**os.environ, "PYTHONPATH": str(REPO_ROOT)}),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert completed.returncode == 0, (completed.stdout + completed.stderr)[-3000:]
    found = {}
    for (name, mode), request in zip(runs, requests):
        facts = LoweringFacts.read(request.parent / "facts.json")
        assert facts.error is None, facts.error
        case = Case(cards.find(CARD), "fp16", mode, SOC)
        found[name] = CaseOutcome(case, [], SimpleNamespace(facts=facts), []).structure
    return found


@pytest.fixture(scope="module")
def structures(toolchain, tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("structure")
    clean = [(f"clean{run}", Mode.DELEGATE) for run in range(CLEAN_RUNS)] + [("clean_skip", Mode.SKIP)]
    return {
        **_lower(toolchain, root / "clean", "clean", clean),
        **_lower(toolchain, root / "transpose", "transpose_pair", [("transpose_pair", Mode.DELEGATE)]),
        **_lower(toolchain, root / "cpu", "mul_on_cpu", [("mul_on_cpu", Mode.SKIP)]),
    }


def _verdict(before: dict, after: dict) -> StructureVerdict:
    verdict, changes = judge(facts_of(before), facts_of(after))
    return StructureVerdict(SOC, "counter_add-fp16", verdict, changes)


def test_the_facts_name_the_qnn_ops_sizes_and_planned_memory(structures):
    structure = structures["clean0"]
    graph = structure["methods"]["forward"]["graphs"]["forward"]
    assert graph["qnn_ops"] == {"ElementWiseAdd": 1, "ElementWiseMultiply": 1, "Reshape": 1}
    assert graph["context_binary_bytes"] > 0 and structure["pte_bytes"] > graph["context_binary_bytes"]
    assert graph["boundary_bytes"] == 2 * 8 * 4, "x in, the doubled state out: the state itself stays inside"
    assert structure["methods"]["forward"]["ops_outside"] == {}
    assert sum(structure["methods"]["forward"]["planned_arena_bytes"]) > 0


def test_five_clean_lowerings_gate_against_each_other_without_a_change(structures):
    for run in range(1, CLEAN_RUNS):
        verdict = _verdict(structures["clean0"], structures[f"clean{run}"])
        assert (verdict.verdict, verdict.changes) == (PASS, ()), verdict.line()


def test_a_pass_that_adds_a_transpose_pair_fails_naming_the_op_and_the_graph(structures):
    verdict = _verdict(structures["clean0"], structures["transpose_pair"])
    assert verdict.verdict == FAIL
    assert verdict.line().startswith(f"structure FAIL: {SOC} counter_add-fp16 forward: +2 Transpose"), verdict.line()


def test_a_partitioner_that_leaves_the_multiply_on_the_cpu_fails_naming_it(structures):
    verdict = _verdict(structures["clean_skip"], structures["mul_on_cpu"])
    line = verdict.line()
    assert verdict.verdict == FAIL
    assert "forward: -1 ElementWiseMultiply" in line and "+1 aten.mul.Tensor outside the delegate" in line, line
