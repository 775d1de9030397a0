"""A card's export facts are computed once for all its dtypes, SoCs and buffer modes and its quantization once
per dtype, and its programs are the ones a case that exports and quantizes on its own makes; a warm run
starts no lowering server.

The run-level tests are child `pytest suites --compile-only` runs (real lowerings, emulated SM8650 and
SM8750) over one card in a quantized dtype and fp16: 2 dtypes x 2 SoCs x 2 modes, eight cases; their counts
come from the report.json work fields the harness records.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.case_store import CaseStore
from harness.pipeline import cache, card as cards, lower_job, prepared
from harness.pipeline.facts import ExportFacts, LoweringFacts, LoweringRequest, PreparedFacts
from harness.pipeline.lower import lower_case
from harness.pipeline.prepared import EXPORT_FACTS, FACTS
from harness.tests import broken_cards
from harness.tests.child_suite import run_suite
from harness.tests.device.test_reliability import SuiteRun
from harness.tests.pipeline.test_lower_server import _comparable, _without_signatures
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
PROGRAM = "forward.pt2"  # a single-method card's program in its prepared entry
CARD, DTYPE, SOCS, STEPS = "counter_add", "8a8w", ("SM8650", "SM8750"), 4
CASES = [
    Case(cards.find(f"fixtures.zoo:{CARD}"), DTYPE, mode, soc) for soc in SOCS for mode in (Mode.DELEGATE, Mode.SKIP)
]


def _work(run: SuiteRun) -> dict[str, int]:
    """The run's exports, quantizations and lowerings: the sum of its cases' work fields in report.json."""
    totals = {"export": 0, "quantize": 0, "lower": 0, "cases": 0}
    for soc in SOCS:
        for case in run.report(soc)["cases"]:
            totals["cases"] += 1
            for stage in ("export", "quantize", "lower"):
                totals[stage] += case["work"][stage]
    return totals


def _suite(tmp_path: Path, cache_dir: Path) -> SuiteRun:
    reports = tmp_path / "reports"
    arguments = (
        "-W",
        "ignore",
        "--emulate",
        ",".join(SOCS),
        "--dtype",
        DTYPE,
        "--dtype",
        "fp16",
        "-k",
        f"{CARD}-",
        "-n",
        "2",
        "--compile-only",
        "--cache-dir",
        str(cache_dir),
        "--report-dir",
        str(reports),
    )
    completed = run_suite(*arguments, env={**os.environ, "COLUMNS": "400"})
    assert completed.returncode in (0, 1), completed.stdout[-3000:] + completed.stderr[-3000:]
    return SuiteRun(completed, reports)


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[SuiteRun, Path]:
    root = tmp_path_factory.mktemp("cold")
    return _suite(root, root / "cache"), root / "cache"


def _facts(facts: LoweringFacts) -> LoweringFacts:
    """What the checks read: the facts less times, the program's hash and which case computed the stages."""
    return dataclasses.replace(_comparable(facts), exported=False, quantized=False)


@pytest.mark.child_suite
def test_a_cold_run_exports_a_card_once_and_quantizes_it_once_per_dtype(cold):
    run, _ = cold
    assert _work(run) == {"export": 1, "quantize": 1, "lower": 8, "cases": 8}, run.output[-2000:]
    assert run.context.lowering_server_pid is not None, "a cold run lowers through the lowering server"


@pytest.mark.child_suite
def test_shared_programs_are_the_per_case_ones(cold, toolchain, tmp_path):
    """Each of the run's four programs equals the one lowered by a case that exports and quantizes on its
    own (today's per-case path, shared_root None), bytes apart from the QNN context signature; so do
    the facts the checks read (export, annotation, folded buffer reads), apart from who computed them."""
    _, cache_dir = cold
    for case in CASES:
        shared = CaseStore(toolchain, None, tmp_path / "work", "gw0", lambda tags: STEPS, 60.0, cache_dir, None)
        served = shared.lowered(case).artifact
        assert served.cached and served.ok, served.failure
        alone = lower_case(case, toolchain, tmp_path / case.id, STEPS)
        assert alone.ok and alone.facts.exported and alone.facts.quantized, alone.failure
        assert _without_signatures(served.pte.read_bytes()) == _without_signatures(alone.pte.read_bytes()), case.id
        assert _facts(served.facts) == _facts(alone.facts), case.id
        assert served.facts.quantize is not None and served.facts.export is not None


@pytest.mark.child_suite
def test_a_damaged_prepared_program_is_made_again(cold, toolchain, tmp_path):
    """A truncated forward.pt2 is not lowered from: the lowering says so and quantizes again."""
    _, cache_dir = cold
    case = CASES[0]
    entry = cache_dir / "prepared" / cache.prepared_key(case, STEPS)
    copy = tmp_path / "prepared" / entry.name
    copy.mkdir(parents=True)
    for name in (FACTS, PROGRAM):
        (copy / name).write_bytes((entry / name).read_bytes())
    (copy / PROGRAM).write_bytes((entry / PROGRAM).read_bytes()[:1000])
    again = lower_case(case, toolchain, tmp_path / "lowered", STEPS, shared_root=copy.parent)
    assert again.ok and again.facts.quantized and again.facts.exported, again.failure
    assert f"prepared program {entry.name} is damaged ({PROGRAM} is not the program its facts describe)" in again.log
    healthy = lower_case(case, toolchain, tmp_path / "lowered-healthy", STEPS, shared_root=copy.parent)
    assert healthy.ok and not healthy.facts.quantized and not healthy.facts.exported, "the remade entry is used"


@pytest.mark.child_suite
def test_the_lowering_server_reads_a_program_once_for_its_lowerings(cold, tmp_path):
    """prepare_in_server, which the lowering server runs before it forks a lowering, reads the card and dtype's
    program; the child takes that module (its own copy, by fork) instead of reading the program again. An
    entry whose program is not the one its facts describe is not read."""
    _, cache_dir = cold
    case = CASES[0]
    entry = cache_dir / "prepared" / cache.prepared_key(case, STEPS)
    damaged = tmp_path / "damaged" / entry.name
    damaged.mkdir(parents=True)
    (damaged / FACTS).write_bytes((entry / FACTS).read_bytes())
    (damaged / PROGRAM).write_bytes((entry / PROGRAM).read_bytes()[:1000])
    sha256 = PreparedFacts.read(entry / FACTS).methods["forward"].sha256
    for where, read in ((damaged, False), (entry, True)):
        request = tmp_path / f"request-{read}.json"
        LoweringRequest(
            case.card.reference, case.dtype, case.mode, case.soc, STEPS, str(tmp_path / "out"), "", str(where)
        ).write(request)
        prepared._PRELOADED.clear()
        lower_job.prepare_in_server([str(request)])
        assert (sha256 in prepared._PRELOADED) == read, where
    module = prepared._PRELOADED[sha256]
    taken = prepared.quantized(entry, case.card, None, DTYPE, [], lambda stage: None)
    assert taken.module["forward"] is module and not taken.made and not prepared._PRELOADED, "taken once, by the child"


@pytest.mark.child_suite
def test_damaged_export_facts_are_computed_again(cold, toolchain, tmp_path):
    """An export.json that does not parse is not read: the lowering says so, exports again and rewrites it."""
    _, cache_dir = cold
    case = Case(CASES[0].card, "fp16", Mode.DELEGATE, "SM8650")
    entry = tmp_path / "prepared" / cache.exported_key(case, STEPS)
    entry.mkdir(parents=True)
    (entry / EXPORT_FACTS).write_text('{"schema_version": 1, "export": {"buffers_to')
    again = lower_case(case, toolchain, tmp_path / "lowered", STEPS, shared_root=entry.parent)
    assert again.ok and again.facts.exported and again.facts.export is not None, again.failure
    assert f"export facts {entry.name} are damaged" in again.log
    shared = cache_dir / "prepared" / cache.exported_key(case, STEPS) / EXPORT_FACTS
    assert (entry / EXPORT_FACTS).read_text() == shared.read_text(), "the rewritten entry is the cold run's"


def test_a_failed_quantization_keeps_the_export_facts_and_is_met_once(toolchain, tmp_path):
    """The export check reads the export facts even when quantizing fails (a quantizer defect must not also
    fail the export check), with shared entries and without; with them, the card and dtype's next case
    reads the failure from the entry, as recorded, instead of quantizing again."""
    case = Case(broken_cards.UNCALIBRATABLE, DTYPE, Mode.DELEGATE, "SM8650")
    for name, root in (("own", None), ("shared", tmp_path / "prepared")):
        failed = lower_case(case, toolchain, tmp_path / name, STEPS, shared_root=root)
        assert failed.facts.error is not None and failed.facts.quantized, (name, failed.log[-2000:])
        assert failed.facts.export == ExportFacts(["actual"], ["actual"]), name
    again = lower_case(
        dataclasses.replace(case, soc="SM8750"), toolchain, tmp_path / "again", STEPS, shared_root=tmp_path / "prepared"
    )
    assert not again.facts.quantized and "read_prepared" in again.facts.timings_s, again.log[-2000:]
    assert again.failure == failed.failure and again.facts.error == failed.facts.error
    assert again.facts.export == failed.facts.export


@pytest.mark.child_suite
def test_a_warm_run_starts_no_lowering_server(cold, tmp_path):
    run, cache_dir = cold
    warm = _suite(tmp_path, cache_dir)
    assert _work(warm) == {"export": 0, "quantize": 0, "lower": 0, "cases": 8}, warm.output[-2000:]
    assert warm.context.lowering_server_pid is None, "every case was cached: no lowering server"
