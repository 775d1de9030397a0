"""What each harness test starts that the fast inner loop cannot afford, told from the fixtures it asks for.

The markers (pytest.ini says what each means) are given at collection from a test's fixtures, directly or through
another fixture, so a new test of the same kind is classified without anyone remembering a marker: asking for
`toolchain` (the host QNN toolchain) makes it `qnn`, asking for `fleet` (emulated devices behind their own adb
server) makes it `device`, asking for `runner_binary` (the suite's runner, compiled) makes it `build`. A test that starts such things in its own body carries the marker itself, and
starting emulated devices from a test not marked `device` fails at once (harness/tests/conftest.py), as a suite
run from a test not marked child_suite does (harness/tests/child_suite.py): the fast tier cannot start either by
mistake.
"""

from __future__ import annotations

import pytest

DEVICE = "device"
# A fixture's name -> the marker of every test that asks for it: what the fixture starts.
FIXTURE_MARKERS = {
    "toolchain": "qnn",  # the host QNN toolchain, for a real lowering or the HTP simulator
    "fleet": DEVICE,  # emulated devices and their adb server (every module spells its fleet so)
    "two_servers": DEVICE,  # two fleets, each its own adb server (emulator/test_adb_servers.py)
    "served": DEVICE,  # `python -m harness emulate` serving devices (emulator/test_phone_path.py)
    "runner_binary": "build",  # the suite's runner compiled on the host (harness/runner/build.py)
}
# What the fast tier leaves out (docs/ARCHITECTURE.md, "The fast inner loop", spells the same expression).
FAST_TIER = "not qnn and not device and not child_suite and not child_python and not build"
# Set before each test's fixtures (harness/tests/conftest.py): the running test's marker names; None outside one.
running_markers: frozenset[str] | None = None


def mark_by_fixtures(item: pytest.Item) -> None:
    """Give item the marker of every fixture in its closure that FIXTURE_MARKERS names."""
    wanted = {FIXTURE_MARKERS[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURE_MARKERS}
    for marker in sorted(wanted):
        if item.get_closest_marker(marker) is None:
            item.add_marker(marker)


def require_device_marker() -> None:
    """Refuse to start emulated devices from a test that is not marked `device` (outside a test: allowed)."""
    if running_markers is not None and DEVICE not in running_markers:
        raise AssertionError(
            f"this test starts emulated devices: ask for a `fleet` fixture or mark it @pytest.mark.{DEVICE}"
            " (the fast tier leaves it out)"
        )
