"""Session fixtures of the suite: the toolchain, the device pool and the shared case results.

Layered like pytest-embedded's services: suites ask for `case_store` (or a check's outcome) and never
see adb, executorch or the emulator behind it.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

from harness.device.pool import DevicePool
from harness.qnn.toolchain import Toolchain, ToolchainError, prepare
from harness.results import CaseStore


def _plugin():
    from harness import plugin

    return plugin


@pytest.fixture(scope="session")
def qnnsuite_options(pytestconfig):
    return pytestconfig.stash[_plugin().OPTIONS]


@pytest.fixture(scope="session")
def run_context(pytestconfig):
    context = pytestconfig.stash.get(_plugin().CONTEXT, None)
    if context is None:
        pytest.fail("this test needs the run's devices: run it through `harness/run.sh suite`", pytrace=False)
    return context


@pytest.fixture(scope="session")
def toolchain(qnnsuite_options) -> Toolchain:
    try:
        return prepare(qnnsuite_options.qnn_sdk)
    except ToolchainError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="session")
def worker_id_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def device_pool(run_context, qnnsuite_options, toolchain, worker_id_name):
    pool = DevicePool(list(run_context.devices), run_context.adb_port, run_context.run_id, worker_id_name,
                      runner=qnnsuite_options.runner,
                      sdk_root=None if toolchain.sdk.origin == "onnxruntime-qnn wheel" else toolchain.sdk.root)
    yield pool
    for line in pool.close(keep=qnnsuite_options.keep_workspace):
        print(line, file=sys.stderr)


@pytest.fixture(scope="session")
def case_store(run_context, qnnsuite_options, toolchain, device_pool, worker_id_name) -> CaseStore:
    return CaseStore(toolchain, None if qnnsuite_options.compile_only else device_pool, run_context.work_dir,
                     worker_id_name, qnnsuite_options.steps_for, qnnsuite_options.runner_timeout_s,
                     qnnsuite_options.cache_dir, run_context.lowering_server)


DEVICE_CHECKS = {"check_address_sharing", "check_state", "check_initial_state"}


@pytest.fixture
def run_check(request, case_store, qnnsuite_options):
    """Run one check on the case's shared outcome; evidence goes to the report via the item's stash."""
    from harness import plugin
    from harness.checks import NotApplicable

    def run(check, case) -> None:
        on_device = check.__name__ in DEVICE_CHECKS
        if on_device and qnnsuite_options.compile_only:
            pytest.skip("--compile-only: no device runs")
        outcome = case_store.executed(case) if on_device else case_store.lowered(case)
        record = request.node.stash.setdefault(plugin.CHECK_RECORD, {})
        record.update(check=check.__name__.removeprefix("check_"), case=case, outcome=outcome)
        started = time.perf_counter()
        try:
            record["evidence"] = check(outcome)
        except NotApplicable as reason:
            pytest.skip(str(reason))
        except AssertionError as failure:
            line, _, detail = str(failure).partition("\n")
            record["evidence"] = {**getattr(failure, "evidence", {}), **({"detail": detail} if detail else {})}
            record["failure_line"] = line
            raise
        finally:
            record["check_s"] = round(time.perf_counter() - started, 4)  # the comparison alone

    return run
