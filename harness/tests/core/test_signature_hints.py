"""A failure on a card the manifest does not list, whose signature and rule match a known finding's, says so:
"matches F15's signature" leads its message (what the page and summary.md show) and the pytest report line,
and the verdict stays failed; a failure whose rule does not match (another mode, no constant read) gets no
hint, and a listed case that fails as expected is xfailed as before, without one.

No QNN here: a user's own prefill/decode and counter cards (the suite's modules under other names, so no
manifest entry names them), device outputs constructed from eager run another way, judged by the real
cross_method_state check through verdicts.judge with the real manifest (fixtures/known_failures.toml).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import harness.checks  # noqa: F401  (checks registers cross_method_state)
from fixtures import multi_method  # noqa: F401  (registers the cards)
from harness import check_registry, known_failures
from harness.check_registry import CheckFailure
from harness.device import kinds
from harness.device.execute import DeviceRun
from harness.outcome import CaseOutcome
from harness.pipeline import card as cards, eager
from harness.pipeline.facts import ExportFacts, LoweringFacts, ProgramFacts
from harness.pipeline.lower import LoweredArtifact
from harness.report import document as report_document
from harness.report.render import markdown
from harness.verdicts import judge
from harness.vocabulary import Case, Mode, Verdict

STEPS = 4
VERSIONS = known_failures.VersionsUnderTest("1.5.1", "2.51")
USERS_PREFILL_DECODE = dataclasses.replace(
    cards.find("fixtures.multi_method:mm_prefill_decode"), name="users_prefill_decode", module=__name__
)
USERS_COUNTER = dataclasses.replace(
    cards.find("fixtures.multi_method:mm_counter"), name="users_counter", module=__name__
)
WRITES = {
    "users_prefill_decode": {"prefill": ["kv_cache"], "decode": ["kv_cache"]},
    "users_counter": {"advance": ["count"], "read": []},
}
WRITES["mm_counter"] = WRITES["users_counter"]


def _judged(card, device: list[list[np.ndarray]], mode: Mode, tmp: Path):
    case = Case(card, "fp16", mode, "SM8650")
    buffers = sorted(card.mutated_buffers)
    facts = LoweringFacts(
        program=ProgramFacts("0" * 64, 1),
        methods=list(card.methods),
        export=ExportFacts(buffers, buffers, WRITES[card.name]),
    )
    (tmp / "model.pte").write_bytes(b"x")
    raw = [[np.ascontiguousarray(array).view(np.uint8).reshape(-1) for array in row] for row in device]
    steps = card.steps(STEPS)
    outcome = CaseOutcome(
        case,
        steps,
        LoweredArtifact(case, tmp, facts, "", 0.0),
        eager.run_steps(card, steps),
        device_kind="emulated",
        device=kinds.of("emulated"),
        run=DeviceRun(raw, [], None, ""),
    )
    test = f"test_cross_method_state[{case.id}]"
    return judge(
        check_registry.get("cross_method_state"),
        case,
        outcome,
        known_failures.matching(test, VERSIONS),
        f"suites/test_cross_method_state.py::{test}",
        words=str,
    )


def _per_method(card) -> list[list[np.ndarray]]:
    return [list(row) for row in eager.run_plan_isolated(card, card.steps(STEPS), fresh_each_step=False)]


def test_an_unlisted_card_with_f15s_signature_and_rule_says_so_and_stays_failed(tmp_path):
    judgement = _judged(USERS_PREFILL_DECODE, _per_method(USERS_PREFILL_DECODE), Mode.DELEGATE, tmp_path)
    record = judgement.record
    assert record.verdict is Verdict.FAILED and record.signature == "state_per_method" and not record.known_failure
    hint = "matches F15's signature (state_per_method, docs/FINDINGS.md#F15)"
    assert record.message.startswith(hint + ": "), record.message
    assert hint in judgement.report_line and record.evidence["matches_signature_of"] == hint
    document = report_document.build([record], {}, "run", "SM8650", [])
    failures = markdown._failures(document)  # summary.md's failures section, clipped at 160 characters a line
    assert any(markdown.markdown_text(hint) in line and "**failed**" in line for line in failures), failures


def test_no_hint_where_the_rule_does_not_match(tmp_path):
    """The same per-method device with the cache outside the delegate: F15's rule needs it delegated, and
    both methods write the cache, so no method read it as a constant (F16): a plain failure."""
    judgement = _judged(USERS_PREFILL_DECODE, _per_method(USERS_PREFILL_DECODE), Mode.SKIP, tmp_path)
    assert judgement.record.verdict is Verdict.FAILED and judgement.record.signature == "state_per_method"
    assert "matches" not in judgement.record.message and "matches_signature_of" not in judgement.record.evidence


def test_an_unlisted_reader_that_reads_a_constant_matches_f16(tmp_path):
    judgement = _judged(USERS_COUNTER, _per_method(USERS_COUNTER), Mode.SKIP, tmp_path)
    assert judgement.record.verdict is Verdict.FAILED
    assert judgement.record.message.startswith("matches F16's signature (state_per_method, docs/FINDINGS.md#F16): ")


def test_a_listed_case_failing_as_expected_is_xfailed_without_a_hint(tmp_path):
    card = cards.find("fixtures.multi_method:mm_counter")
    judgement = _judged(card, _per_method(card), Mode.SKIP, tmp_path)
    assert judgement.record.verdict is Verdict.XFAILED and "matches" not in judgement.record.message


def test_a_hint_names_a_finding_the_findings_have_and_a_signature_a_check_declares(tmp_path):
    hints = known_failures.hints()
    assert {hint.finding for hint in hints} >= {"F15", "F16", "F18"}
    bad = tmp_path / "manifest.toml"
    bad.write_text('[[signature_hint]]\nfinding = "F15"\ncheck = "cross_method_state"\nsignature = "made_up"\n')
    with pytest.raises(ValueError, match="signature 'made_up' is no check's"):
        known_failures.hints(bad)
    missing = tmp_path / "missing.toml"
    missing.write_text(
        '[[signature_hint]]\nfinding = "F999"\ncheck = "cross_method_state"\nsignature = "state_per_method"\n'
    )
    with pytest.raises(ValueError, match="docs/FINDINGS.md has no finding F999"):
        known_failures.hints(missing)
    other_check = CheckFailure("x", {}, "state_per_method")
    assert not known_failures.hint_for("state", "delegate_mutbuf", other_check), "a hint is its check's only"
