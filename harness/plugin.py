"""pytest wiring of the suite: options, run set-up and tear-down, case parametrization.

Hooks stay small and delegate: options live in harness/options.py, fixtures in harness/fixtures.py,
the run's devices in harness/context.py. The controller process decides the run (devices, SoCs, run
id) once; xdist workers receive it through workerinput.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import context as run_context
from harness import options as run_options
from harness.device import discovery, pool
from harness.device.device import DeviceError
from harness import fork_server, known_failures, records
from harness.emulator.launcher import FleetError
from harness.checks import CheckFailure
from harness.pipeline import card, cases, lower_server
from harness.qnn.sdk import SdkError
from harness.qnn.toolchain import ToolchainError, prepare

pytest_plugins = ["harness.fixtures"]

OPTIONS = pytest.StashKey[run_options.RunOptions]()
CONTEXT = pytest.StashKey[run_context.RunContext]()
FLEET = pytest.StashKey[object]()
LOWERING_SERVER = pytest.StashKey[object]()
WORKERINPUT_KEY = "qnnsuite_context"
DEFAULT_CARD_MODULES = ("fixtures.zoo", "fixtures.llama")
CHECK_RECORD = pytest.StashKey[dict]()
KNOWN = pytest.StashKey[list]()
STARTED = pytest.StashKey[str]()
SUMMARY = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    run_options.add_options(parser)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _wants_devices(config: pytest.Config) -> bool:
    """Runs of the suites need devices, and so does any run given --device or --emulate; the
    harness's own tests (which start what they need) and `--help` do not."""
    if config.option.help:
        return False
    explicit = config.getoption("--device") or config.getoption("--emulate") or os.environ.get("ANDROID_SERIAL")
    suites = Path(__file__).resolve().parent.parent / "suites"
    return bool(explicit) or any(Path(str(arg).split("::")[0]).resolve().is_relative_to(suites) for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    options = run_options.parse(config)
    config.stash[OPTIONS] = options
    for module in (*DEFAULT_CARD_MODULES, *options.models):
        try:
            card.load_module(module)
        except ValueError as error:
            raise pytest.UsageError(f"--models: {error}") from error
    if _is_worker(config):
        if WORKERINPUT_KEY in config.workerinput:  # absent when the run needs no devices
            config.stash[CONTEXT] = run_context.RunContext.from_json(config.workerinput[WORKERINPUT_KEY])
        return
    if not _wants_devices(config):
        return
    if options.baseline is not None:
        from harness.report.gate import BaselineError, load

        try:
            load(options.baseline)  # a bad baseline is found now, not after an hour of running
        except BaselineError as error:
            raise pytest.UsageError(f"--baseline: {error}") from error
    config.stash[CONTEXT] = _start_run(config, options)


def _start_run(config: pytest.Config, options: run_options.RunOptions) -> run_context.RunContext:
    run_id = run_context.new_run_id()
    work_dir = Path(tempfile.mkdtemp(prefix=f"qnnsuite-{run_id}-"))
    try:
        toolchain = prepare(options.qnn_sdk)
        socket_path = work_dir / "lower.sock"
        config.stash[LOWERING_SERVER] = lower_server.spawn_server(socket_path, toolchain.child_env())
        serials = discovery.requested_serials(list(options.device_options))
        if serials:
            context = run_context.real_devices(options, serials, run_id, work_dir)
        else:
            fleet, context = run_context.emulated_devices(options, toolchain, run_id, work_dir)
            config.stash[FLEET] = fleet
        context = _with_lowering_server(context, config.stash[LOWERING_SERVER], socket_path)
        _publish(context, options)
        return context
    except (DeviceError, SdkError, ToolchainError, FleetError) as error:
        _stop_servers(config)
        shutil.rmtree(work_dir, ignore_errors=True)
        raise pytest.UsageError(str(error)) from error


def _with_lowering_server(context: run_context.RunContext, server: subprocess.Popen[bytes],
                          socket_path: Path) -> run_context.RunContext:
    """The context with its lowering server, once that accepts cases; without it (slower, same results) if
    it never came up."""
    try:
        fork_server.wait_until_serving(server, socket_path)
    except fork_server.ForkServerError as error:
        print(f"qnnsuite: {error}; lowering each case in a fresh Python instead (slower)", file=sys.stderr)
        return context
    return dataclasses.replace(context, lowering_server=socket_path,
                               started_pids=(*context.started_pids, server.pid))


def _stop_servers(config: pytest.Config) -> None:
    """Stop what the controller started: the emulated fleet and the lowering server."""
    fleet = config.stash.get(FLEET, None)
    if fleet is not None:
        fleet.stop()
    server = config.stash.get(LOWERING_SERVER, None)
    if server is not None:
        fork_server.stop_server(server)


def _publish(context: run_context.RunContext, options: run_options.RunOptions) -> None:
    """The run's devices and processes, beside its reports (what ran where; what to look for after)."""
    folder = options.report_dir / context.run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run-context.json").write_text(context.to_json())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Suites taking `case` get one test per card x dtype x mode x SoC, grouped per case so that
    under `--dist loadgroup` all checks of a case share one worker (and its one lowering and run)."""
    config = metafunc.config
    options, context = config.stash[OPTIONS], config.stash.get(CONTEXT, None)
    socs = context.socs(options.soc_filter) if context else []
    if "case" in metafunc.fixturenames:
        selected = [c for c in cases.matrix(card.cards(), options.dtypes, socs) if cases.wanted_by(metafunc.function, c)]
    elif "meta_llama_case" in metafunc.fixturenames:
        selected = cases.meta_llama_matrix(card.cards(), socs) if "fp16" in options.dtypes else []
    else:
        return
    name = "case" if "case" in metafunc.fixturenames else "meta_llama_case"
    metafunc.parametrize(name, [pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(c.id)) for c in selected])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        for item in items:
            item.stash[KNOWN] = known_failures.matching(item.name)
    except (ValueError, TypeError) as error:
        raise pytest.UsageError(f"{known_failures.MANIFEST}: {error}") from error


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Known failures become xfails by signature (strict); check and device failures read as one line."""
    report = yield
    failure = call.excinfo.value if call.excinfo is not None else None
    worded = call.when == "call" and _apply_known_failures(item, report, failure)
    if not worded and report.failed and isinstance(failure, CheckFailure):
        report.longrepr = f"{item.nodeid}: {failure} [signature: {failure.signature}]"
    elif not worded and report.failed and isinstance(failure, DeviceError):
        report.longrepr = f"{item.nodeid}: {failure}"
    if call.when == "call" or (call.when == "setup" and report.outcome != "passed"):
        records.write(item, report)
    return report


def _apply_known_failures(item: pytest.Item, report: pytest.TestReport, failure: BaseException | None) -> bool:
    """Strict xfail by signature; returns whether the report's text was set here."""
    expected = item.stash.get(KNOWN, [])
    if not expected:
        return False
    explaining = next((entry for entry in expected if failure is not None and entry.explains(failure)), None)
    if report.failed and explaining is not None:
        report.outcome, report.wasxfail = "skipped", explaining.describe()
        return True
    if report.passed and not all(entry.flaky for entry in expected):
        report.outcome = "failed"
        report.longrepr = f"[XPASS(strict)] {expected[0].describe()}: it passes now; update fixtures/known_failures.toml"
        return True
    if report.failed and isinstance(failure, CheckFailure):
        report.longrepr = (f"{item.nodeid}: {failure} [signature: {failure.signature}; the known failure expected here "
                           f"is {', '.join(entry.signature for entry in expected)}]")
        return True
    return False


def pytest_configure_node(node) -> None:  # xdist hook: hand the run to each worker
    context = node.config.stash.get(CONTEXT, None)
    if context is not None:
        node.workerinput[WORKERINPUT_KEY] = context.to_json()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[STARTED] = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller gathers every worker's records into per-SoC reports and gates on a baseline."""
    config = session.config
    context = config.stash.get(CONTEXT, None)
    if context is None or _is_worker(config):
        return
    from harness import environment, report

    gathered = records.read_all(context.work_dir)
    if not gathered:
        return
    options = config.stash[OPTIONS]
    toolchain = prepare(options.qnn_sdk)
    environments = environment.per_soc(context, toolchain, config.stash[STARTED], time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    folders = report.write_run(gathered, environments, options.report_dir, context.run_id)
    lines = [report.summary_line(gathered, soc, folders[soc] / "report.html") for soc in sorted(folders)]
    if options.baseline is not None:
        verdict = report.gate(gathered, options.baseline)
        lines += [f"gate against {options.baseline}: " + ("no regressions" if verdict.ok else "FAILED")]
        lines += [f"  {line}" for line in verdict.lines()]
        if not verdict.ok:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    config.stash[SUMMARY] = lines


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.section("QNN mutable-buffer conformance")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    context = config.stash.get(CONTEXT, None)
    cleaning = context is not None and not _is_worker(config) and not config.stash[OPTIONS].keep_workspace
    if cleaning:  # while the emulated devices still answer
        for line in pool.remove_run_folders(list(context.devices), context.adb_port, context.run_id):
            print(line, file=sys.stderr)
    _stop_servers(config)
    if cleaning:
        shutil.rmtree(context.work_dir, ignore_errors=True)
