"""Session fixtures of the suite: the toolchain, the device pool and the shared case results.

Layered like pytest-embedded's services: suites ask for `run_check` (or `case_store`) and never see adb,
executorch or the emulator behind it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from harness import known_failures, verdicts
from harness.case_store import CaseStore
from harness.check_registry import CheckSpec, worded_by_the_suite
from harness.context import RunContext
from harness.device import kinds
from harness.device.pool import DevicePool
from harness.files import say
from harness.options import RunOptions
from harness.providers import restore_server
from harness.qnn.toolchain import Toolchain, ToolchainError, prepare
from harness.repro.bundle import BundleWriter
from harness.stash import CASE_ORDER, CONTEXT, OPTIONS
from harness.vocabulary import Case


@pytest.fixture(scope="session")
def qnnsuite_options(pytestconfig) -> RunOptions:
    return pytestconfig.stash[OPTIONS]


@pytest.fixture(scope="session")
def run_context(pytestconfig) -> RunContext:
    context = pytestconfig.stash.get(CONTEXT, None)
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
    given = kinds.payload_inputs(
        toolchain.sdk,
        qnnsuite_options.runner,
        qnnsuite_options.backend_lib,
        qnnsuite_options.android_ndk,
        qnnsuite_options.executorch_android_build,
    )  # built and checked by the controller already
    pool = DevicePool(
        list(run_context.devices),
        run_context.run_id,
        worker_id_name,
        sdk=toolchain.sdk,
        runner=given.runner,
        backend_lib=given.backend_lib,
        trace_interposer=given.trace_interposer,
        android_runner=given.android_runner,
        quarantined=dict(run_context.quarantined),
        restore_server=restore_server,  # a dropped adb server: the provider brings it and its devices back
    )
    yield pool
    for line in pool.close(keep=qnnsuite_options.keep_workspace):
        say(line)  # a teardown line that cannot be shown must not become an error charged to a test


def reference_runners(items: list[pytest.Item]) -> dict[str, str]:
    """Case id -> the runner a collected check of that case compares its run with (CheckSpec.reference_runner):
    the case store makes that run before the case's checks judge it."""
    found = {}
    for item in items:
        spec = getattr(getattr(item, "function", None), "check_spec", None)
        case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
        if spec is not None and spec.reference_runner and isinstance(case, Case):
            found[case.id] = spec.reference_runner
    return found


@pytest.fixture(scope="session")
def case_store(
    request, pytestconfig, run_context, qnnsuite_options, toolchain, device_pool, worker_id_name
) -> Iterator[CaseStore]:
    references = reference_runners(request.session.items)
    store = CaseStore(
        toolchain,
        None if qnnsuite_options.compile_only else device_pool,
        run_context.work_dir,
        worker_id_name,
        qnnsuite_options.steps_for,
        qnnsuite_options.runner_timeout_s,
        qnnsuite_options.cache_dir,
        run_context.lowering_server,
        perf_repeats=qnnsuite_options.perf_repeats,
        profile_level=qnnsuite_options.profile_level,
        reference_runner=lambda case: references.get(case.id),
        horizon=qnnsuite_options.horizon,
    )
    order = pytestconfig.stash.get(CASE_ORDER, None)  # known in a run without xdist workers
    if order:
        store.lower_ahead(order)
    yield store
    store.close()


@pytest.fixture(scope="session")
def repro_bundles(run_context, qnnsuite_options, toolchain) -> Iterator[BundleWriter]:
    """Reproduction bundles go beside the run's reports (reports/<run>/<SOC>/repro/), written by the worker;
    the last case's archive is made when the worker's session ends, before the controller writes the reports."""
    writer = BundleWriter(
        qnnsuite_options.report_dir.resolve() / run_context.run_id, toolchain, qnnsuite_options.repro_all
    )
    yield writer
    writer.archive()


@pytest.fixture
def run_check(request, case_store, qnnsuite_options, repro_bundles):
    """Run one registered check on the case's shared outcome: harness/verdicts.py decides its verdict and
    record, the case's reproduction bundle is asked for once the verdict is known, and the judgement goes on
    the item for the report hook."""

    def run(spec: CheckSpec, case: Case) -> None:
        __tracebackhide__ = worded_by_the_suite
        if case.skip_reason:  # its SoC cannot run its dtype (pipeline/cases.py): never lowered, never run
            pytest.skip(case.skip_reason)
        if spec.needs_device and qnnsuite_options.compile_only:
            pytest.skip("--compile-only: no device runs")
        outcome = case_store.executed(case) if spec.needs_device else case_store.lowered(case)
        item = request.node
        judgement = verdicts.judge(
            spec,
            case,
            outcome,
            item.stash.get(verdicts.EXPECTED, []),
            item.nodeid,
            words=lambda error: str(item.repr_failure(pytest.ExceptionInfo.from_exception(error))),
            manifest=item.stash.get(verdicts.HINTS, known_failures.MANIFEST),
        )
        record = repro_bundles.add(
            judgement.record, outcome=outcome, signature=judgement.signature, known=judgement.known
        )
        item.stash[verdicts.JUDGEMENT] = dataclasses.replace(judgement, record=record)
        raised = judgement.exception()
        if raised is not None:  # its report is worded by verdicts.settle() (a harness bug keeps pytest's words)
            raise raised

    return run
