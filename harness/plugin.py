"""pytest wiring of the suite: options, the run's start and stop, parametrization, verdicts, reporting.

Wiring only; each hook hands its work to the module that owns it: options (harness/options.py), the
run's toolchain, lowering server and devices (harness/session.py), which cases a check runs over (its
registration in harness/check_registry.py), verdicts by the known-failures manifest (harness/verdicts.py)
and the reports and gate (harness/reporter.py, on the controller only). The controller decides the run
once; xdist workers receive it through workerinput.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the built-in checks)
from harness import check_registry, options as run_options, shard, verdicts
from harness.context import RunContext
from harness.paths import REPO_ROOT
from harness.pipeline import card, cases
from harness.report.gate import BaselineError, load
from harness.reporter import ConformanceReporter
from harness.session import RunSession, RunStartError
from harness.stash import CASE_ORDER, CONTEXT, OPTIONS
from harness.vocabulary import DEFAULT_CARD_MODULES, Case

pytest_plugins = ["harness.fixtures"]

SESSION = pytest.StashKey[RunSession]()
REPORTER = pytest.StashKey[ConformanceReporter]()
WORKERINPUT_KEY = "qnnsuite_context"
REPORTER_NAME = "qnnsuite-reporter"


def pytest_addoption(parser: pytest.Parser) -> None:
    run_options.add_options(parser)


def _wants_devices(config: pytest.Config) -> bool:
    """Runs of the suites need devices, and so does any run given --device or --emulate; the
    harness's own tests (which start what they need) and `--help` do not."""
    if config.option.help:
        return False
    explicit = any(config.getoption(name) for name in ("--device", "--emulate", "--adb-server"))
    explicit = explicit or bool(os.environ.get("ANDROID_SERIAL"))
    suites = REPO_ROOT / "suites"
    return bool(explicit) or any(Path(str(arg).split("::")[0]).resolve().is_relative_to(suites) for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    options = config.stash[OPTIONS] = run_options.parse(config)
    cases.widen_long_driver(options.wide_horizon)
    for module in (*DEFAULT_CARD_MODULES, *options.models):
        try:
            card.load_module(module)
        except ValueError as error:
            raise pytest.UsageError(f"--models: {error}") from error
    if hasattr(config, "workerinput"):  # an xdist worker
        if WORKERINPUT_KEY in config.workerinput:  # absent when the run needs no devices
            config.stash[CONTEXT] = RunContext.from_json(config.workerinput[WORKERINPUT_KEY])
        return
    if not _wants_devices(config):
        return
    try:  # read now: a bad baseline is found before an hour of running, and before this run writes anything
        baseline = load(options.baseline) if options.baseline is not None else None
    except BaselineError as error:
        raise pytest.UsageError(f"--baseline: {error}") from error
    session = config.stash[SESSION] = RunSession(options)
    try:
        context = config.stash[CONTEXT] = session.start(health_check=not config.option.collectonly)
    except RunStartError as error:
        raise pytest.UsageError(str(error)) from error
    reporter = config.stash[REPORTER] = ConformanceReporter(options, context, baseline)
    config.pluginmanager.register(reporter, REPORTER_NAME)


def pytest_configure_node(node) -> None:  # xdist hook: hand the run to each worker
    context = node.config.stash.get(CONTEXT, None)
    if context is not None:
        node.workerinput[WORKERINPUT_KEY] = context.to_json()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A check's test gets one case per cell of the check's matrix, grouped per case so that under
    `--dist loadgroup` all checks of a case share one worker (and its one lowering and run)."""
    spec = getattr(metafunc.function, "check_spec", None)
    if spec is None or "case" not in metafunc.fixturenames:
        return
    selected = _cases_of(spec, metafunc.config)
    metafunc.parametrize("case", [pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(c.id)) for c in selected])


def _cases_of(spec: check_registry.CheckSpec, config: pytest.Config) -> list[Case]:
    options, context = config.stash[OPTIONS], config.stash.get(CONTEXT, None)
    socs = context.socs(options.soc_filter) if context else []
    return (spec.matrix or cases.matrix)(card.cards(), options.dtypes, socs)


def _start_lowering_for(config: pytest.Config, nodeids: list[str]) -> None:
    """The controller, once it knows the collected tests: the lowering server if a case misses the cache."""
    if (session := config.stash.get(SESSION, None)) is not None:
        candidates = [case for spec in check_registry.specs() for case in _cases_of(spec, config)]
        session.start_lowering_server_if_needed(cases.collected(nodeids, candidates))


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config  # without xdist; under it the workers collect (the hook below)
    if not hasattr(config, "workerinput") and not config.pluginmanager.has_plugin("dsession"):
        _start_lowering_for(config, [item.nodeid for item in session.items])
        config.stash[CASE_ORDER] = cases.in_run_order(session.items)  # the case store lowers the next ahead


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """xdist schedules no test before this returns; every worker collects the same ids (the first decides)."""
    _start_lowering_for(node.config, list(ids))


@pytest.hookimpl(trylast=True)  # after -k and -m, so a shard is a part of the selection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    options = config.stash[OPTIONS]
    if options.shard is not None:
        kept, deselected = shard.partition(items, options.shard)
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
    manifest = options.known_failures
    try:
        verdicts.expect_known_failures(items, manifest)
    except (ValueError, TypeError) as error:
        raise pytest.UsageError(f"{manifest}: {error}") from error


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    verdicts.settle(item, call, report)
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    """The reporter leaves the plugin manager (as junitxml's LogXML does), then the run stops: its work folder
    is kept when the reports could not be written."""
    reporter = config.stash.get(REPORTER, None)
    if reporter is not None and config.pluginmanager.is_registered(reporter):
        config.pluginmanager.unregister(reporter)
    if (session := config.stash.get(SESSION, None)) is not None:
        session.stop(keep_work_dir=reporter is not None and reporter.failed)
