"""The controller's reporter: records arrive on pytest's test reports; one that cannot be read is named and
left out while the rest are reported; when writing the reports fails, the records are kept."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from _pytest.reports import TestReport, pytest_report_from_serializable, pytest_report_to_serializable

from harness import plugin, reporter as reporter_module
from harness.context import RunContext
from harness.record import RECORD_PROPERTY, record_property
from harness.reporter import ConformanceReporter
from harness.tests.report.test_report import make_records, typed


def _reporter(tmp_path: Path) -> ConformanceReporter:
    options = SimpleNamespace(
        qnn_sdk=None, report_dir=tmp_path / "reports", baseline=None, allow_missing=False, shard=None
    )
    context = RunContext("run1", (), {}, (), tmp_path / "work")
    (tmp_path / "work").mkdir()
    return ConformanceReporter(options, context, None)


def _report(nodeid: str, record: dict | None) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, user_properties=[(RECORD_PROPERTY, record)] if record is not None else [])


def test_an_unreadable_record_is_named_and_the_rest_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: None)  # environment.per_soc copes with none
    reporter = _reporter(tmp_path)
    good = [r.to_dict() for r in typed(make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",)))]
    for record in good:
        reporter.pytest_runtest_logreport(_report(record["nodeid"], record))
    reporter.pytest_runtest_logreport(_report("suites/test_state.py::test_state[torn]", {"check": "state"}))
    reporter.pytest_runtest_logreport(_report("suites/test_state.py::test_state[none]", None))  # no record: not a check
    session = SimpleNamespace(exitstatus=0)
    reporter.pytest_sessionfinish(session)
    document = json.loads((tmp_path / "reports" / "run1" / "SM8650" / "report.json").read_text())
    assert document["summary"]["total"] == len(good)
    assert any(
        line.startswith("unreadable record of suites/test_state.py::test_state[torn] (TypeError: ")
        for line in reporter._lines
    )


def test_a_failed_report_keeps_the_records(tmp_path, monkeypatch):
    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: None)
    reporter = _reporter(tmp_path)
    record = typed(make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",)))[0]
    reporter.pytest_runtest_logreport(_report(record.nodeid, record.to_dict()))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reporter_module.report, "write_run", full_disk)
    session = SimpleNamespace(exitstatus=0)
    reporter.pytest_sessionfinish(session)
    assert reporter.failed and session.exitstatus == reporter_module.REPORTS_NOT_WRITTEN
    kept = json.loads((tmp_path / "work" / "records.json").read_text())
    assert kept == [record.to_dict()]
    assert "the records are in" in reporter._lines[-1] and "work folder is kept" in reporter._lines[-1]
    assert reporter._lines[-1].startswith("reports not written: No space left on device")


def test_a_run_that_judged_nothing_says_why_it_wrote_no_report(tmp_path):
    """Every selected cell skipped before a verdict (e.g. 16a4w_block on an SoC older than V69): no report, and
    the terminal names the distinct reasons with counts instead of saying nothing."""
    reporter = _reporter(tmp_path)
    reason = "16a4w_block needs HTP V69 or newer; SM8350 has V68"
    for index in range(3):
        skipped = SimpleNamespace(nodeid=f"t[{index}]", skipped=True, longrepr=("f.py", 1, f"Skipped: {reason}"))
        reporter.pytest_runtest_logreport(skipped)
    reporter.pytest_sessionfinish(SimpleNamespace(exitstatus=0))
    assert not (tmp_path / "reports").exists()
    assert reporter._lines == [
        "no check was judged, so no report was written: 3 check(s) skipped:",
        f"  3 x {reason}",
    ]


def test_a_run_with_no_selected_check_adds_no_lines(tmp_path):
    """The twin: nothing collected, nothing skipped: pytest's own "no tests ran" is the whole story."""
    reporter = _reporter(tmp_path)
    reporter.pytest_runtest_logreport(SimpleNamespace(nodeid="t", skipped=False, longrepr=None))
    reporter.pytest_sessionfinish(SimpleNamespace(exitstatus=0))
    assert reporter._lines == []


def test_a_record_arrives_through_user_properties_as_xdist_forwards_a_report(tmp_path):
    """settle() puts the record in the call report's user_properties; xdist sends a worker's report to the
    controller through pytest's own serialisation hooks, and the reporter reads the record from what arrives.
    The record is not on the item, so the teardown report (what junitxml writes properties from) has none."""
    record = typed(make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",)))[0]
    item_properties: list = []
    report = TestReport(record.nodeid, ("suites/test_state.py", 1, "x"), {}, "passed", None, "call", [], 0.5)
    report.user_properties = list(item_properties)
    report.user_properties.append(record_property(record))
    assert item_properties == []
    sent = pytest_report_to_serializable(report)
    arrived = pytest_report_from_serializable(json.loads(json.dumps(sent)))  # execnet may send a pair as a list
    reporter = _reporter(tmp_path)
    reporter.pytest_runtest_logreport(arrived)
    assert [r.to_dict() for r in reporter.records] == [record.to_dict()]


def test_the_reporter_leaves_the_plugin_manager_at_unconfigure(tmp_path):
    """As junitxml unregisters its LogXML: a second session in the same process (pytester, an IDE) must not
    find the last run's reporter still collecting."""
    manager = pytest.PytestPluginManager()
    reporter = _reporter(tmp_path)
    manager.register(reporter, plugin.REPORTER_NAME)
    config = SimpleNamespace(stash=pytest.Stash(), pluginmanager=manager)
    config.stash[plugin.REPORTER] = reporter
    plugin.pytest_unconfigure(config)
    assert not manager.is_registered(reporter) and manager.get_plugin(plugin.REPORTER_NAME) is None
