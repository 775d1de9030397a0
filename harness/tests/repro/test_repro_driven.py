"""A driven case's bundle drives the card as the suite did (harness/pipeline/drivers.py): repro.py takes the
driver's methods and reloads from case.json's driver and step count, not the card's own plan, and says in one
line when the card's drive no longer makes the recorded steps. Pure: no lowering, no device (a driven bundle
judged end to end on the simulator is timed in the closing note of the change that added this)."""

from __future__ import annotations

import pytest

from fixtures import drivers as driven_cards  # noqa: F401  (registers the cards)
from harness.pipeline import card as cards, drivers
from harness.repro import bundle, standalone
from harness.vocabulary import Case, Mode

RELOADED = "fixtures.drivers:drv_reloaded_counter"


def _case(driver: str) -> Case:
    return Case(cards.find(RELOADED), "fp16", Mode.DELEGATE, "SM8650", driver=driver)


def test_a_driven_bundle_runs_the_driver_s_plan_with_its_reloads():
    case = _case("reset")
    plan = drivers.of_case(case)
    recorded = {"steps": len(plan.chunks), "case_id": case.id}
    assert standalone.plan_methods(recorded, case) == plan.methods
    assert standalone.driven_plan(recorded, case).reloads == plan.reloads and plan.reloads
    assert bundle._plan(case, len(plan.chunks)) == plan.methods
    undriven = Case(case.card, "fp16", Mode.DELEGATE, "SM8650")
    assert standalone.driven_plan(recorded, undriven) is None
    assert standalone.plan_methods(recorded, undriven) == case.card.step_methods(len(plan.chunks))


def test_a_drive_that_no_longer_makes_the_recorded_steps_is_one_line():
    case = _case("reset")
    with pytest.raises(standalone.ReproError, match="now makes .* steps where the run made 7"):
        standalone.driven_plan({"steps": 7, "case_id": case.id}, case)
