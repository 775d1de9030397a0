"""A small suite that only uses devices, run in a child pytest by test_devices.py.

Not collected by itself (its name does not match test_*.py). Environment knobs:
SCENARIO_SOCS (comma list), SCENARIO_CASES (per SoC), SCENARIO_HOLD_S (seconds each use holds the
device), SCENARIO_KILL ("SOC:INDEX": that case pulls its device's plug first), SCENARIO_OUT (file
that receives the run context as JSON).
"""

import os
import signal
import time
from pathlib import Path

import pytest

SOCS = os.environ.get("SCENARIO_SOCS", "SM8650,SM8750").split(",")
CASES = range(int(os.environ.get("SCENARIO_CASES", "4")))


@pytest.fixture(scope="session", autouse=True)
def publish_context(run_context):
    if os.environ.get("SCENARIO_OUT"):
        Path(os.environ["SCENARIO_OUT"]).write_text(run_context.to_json())


@pytest.mark.parametrize("index", CASES)
@pytest.mark.parametrize("soc", SOCS)
def test_use_device(soc, index, device_pool, run_context):
    if os.environ.get("SCENARIO_KILL") == f"{soc}:{index}":
        serial = next(spec.serial for spec in run_context.devices if spec.soc == soc)
        os.kill(run_context.emulated_pids[serial], signal.SIGKILL)
    with device_pool.acquire(soc, holder=f"{soc}:{index}") as (device, workspace):
        result = device.run(["echo", "used"], cwd=workspace.cases, timeout_s=30)
        time.sleep(float(os.environ.get("SCENARIO_HOLD_S", "0.2")))
    assert result.exit_code == 0 and "used" in result.output
