"""docs/FINDINGS.md#F19 and its bridge (harness/qnn/system_bridge.c): without the bridge, loading an
online-prepared program kills the process (SIGSEGV: composeGraphs reads a by-value QnnInterface_t larger than
the wheel's headers make it); with it, the program loads and computes x + 1. The toolchain's probe turned the
bridge on for exactly this reason; if executorch or the libraries stop crashing, the probe leaves it off and the
first test says F19 is gone."""

from __future__ import annotations

import pytest

from harness.qnn import toolchain as toolchain_module

pytestmark = pytest.mark.qnn


def _probe(toolchain, compose: bool):
    return toolchain_module._run_compose_probe(toolchain.overlay_root, toolchain.probe.bridge_device_config, compose)


def test_the_bridge_is_on_because_the_load_crashes_without_it_F19(toolchain):
    outcome, said = _probe(toolchain, compose=False)
    if not toolchain.probe.bridge_compose_graphs:
        assert outcome is not None and outcome["ok"], f"bridge off, yet the probe program fails: {said}"
        pytest.fail(
            "the online-prepared probe program loads without the composeGraphs bridge here: F19 is gone for this "
            "executorch and these libraries; update docs/FINDINGS.md#F19",
            pytrace=False,
        )
    assert outcome is None and "SIGSEGV" in said, said


def test_with_the_bridge_the_program_loads_and_computes(toolchain):
    """The twin that must not crash: the same program through the bridge gives x + 1 = 2."""
    if not toolchain.probe.bridge_compose_graphs:
        pytest.skip(f"the composeGraphs bridge is off here ({toolchain.probe.compose_probe})")
    outcome, said = _probe(toolchain, compose=True)
    assert outcome is not None and outcome["ok"] and abs(outcome["value"] - 2.0) <= 1e-3, said
