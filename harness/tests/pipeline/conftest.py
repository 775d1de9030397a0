"""The pipeline tests' emulated device: one SM8650 device of a fleet and its workspace, shared by the tests that
run a real lowering on a device (multi-method and driven cards)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.device import kinds
from harness.device.adb import AdbClient
from harness.device.device import Device
from harness.device.execute import Workspace, prepare_workspace
from harness.device.payload import RUNNER_COMMANDS, SUITE_RUNNER_NAME
from harness.emulator.launcher import EmulatorFleet
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk


@pytest.fixture(scope="module")
def fleet(toolchain, tmp_path_factory) -> Iterator[EmulatorFleet]:
    device_env = {**kinds.EmulatedKind.heap_environment(toolchain.child_env()), "QNNSUITE_PYTHON": sys.executable}
    with EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("fleet"), device_env=device_env) as started:
        yield started


@pytest.fixture(scope="module")
def device_and_workspace(fleet) -> tuple[Device, Workspace]:
    device = Device(fleet.devices[0].serial, AdbClient(server=fleet.server))
    payload = device.workspace("payload")
    files = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(QnnSdk(Path("/nonexistent"), WHEEL_ORIGIN)))
    prepare_workspace(device, payload, files)
    runners = tuple(item.remote_name for item in files if item.remote_name in RUNNER_COMMANDS)
    assert SUITE_RUNNER_NAME in runners, kinds.emulated_suite_runner()[1]
    return device, Workspace(device.workspace("cases"), payload, runners=runners)
