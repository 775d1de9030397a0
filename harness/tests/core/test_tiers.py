"""The fast tier cannot drift from what its markers say: every marker pytest.ini registers is a reason the tier
leaves a test out, the tier's command in docs/ARCHITECTURE.md is the one harness/tests/tiers.py spells, no test the
tier selects asks for a fixture that starts what a marker names, and starting emulated devices from a test that is
not marked `device` fails before anything starts."""

from __future__ import annotations

import configparser
import re

import pytest

from harness.emulator.launcher import EmulatorFleet
from harness.paths import REPO_ROOT
from harness.tests import tiers

EXCLUSION = re.compile(r"not ([a-z_]+)")


def _left_out(expression: str) -> set[str]:
    """The markers an expression of the form `not a and not b ...` leaves out (any other form is refused)."""
    assert re.fullmatch(r"not [a-z_]+( and not [a-z_]+)*", expression), expression
    return set(EXCLUSION.findall(expression))


def test_the_fast_tier_leaves_out_every_registered_marker():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(REPO_ROOT / "pytest.ini", encoding="utf-8")
    registered = {line.split(":")[0].strip() for line in ini["pytest"]["markers"].strip().splitlines()}
    assert _left_out(tiers.FAST_TIER) == registered | set(tiers.FIXTURE_MARKERS.values()), (
        "each marker in pytest.ini says why a test is slow: the fast tier leaves it out"
    )


def test_the_documented_command_is_the_fast_tier():
    architecture = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert f'-m "{tiers.FAST_TIER}"' in architecture


def test_no_test_the_fast_tier_selects_asks_for_a_fixture_that_starts_what_a_marker_names(request):
    left_out = _left_out(tiers.FAST_TIER)
    for item in request.session.items:
        markers = {mark.name for mark in item.iter_markers()}
        asked = set(getattr(item, "fixturenames", ())) & set(tiers.FIXTURE_MARKERS)
        assert {tiers.FIXTURE_MARKERS[name] for name in asked} <= markers, item.nodeid
        if not markers & left_out:
            assert not asked, f"{item.nodeid} is in the fast tier but asks for {sorted(asked)}"


def test_an_unmarked_test_cannot_start_emulated_devices(tmp_path):
    assert tiers.running_markers is not None and tiers.DEVICE not in tiers.running_markers
    fleet = EmulatorFleet(["SM8650"], tmp_path)
    with pytest.raises(AssertionError, match=r"mark it @pytest.mark.device"):
        fleet.start()
    assert fleet.started_pids == [] and not (tmp_path / "adb-home").exists(), "refused before anything started"
