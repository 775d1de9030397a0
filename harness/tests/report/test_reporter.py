"""The controller's reporter: records arrive on pytest's test reports; one that cannot be read is named and
left out while the rest are reported; when writing the reports fails, the records are kept."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from harness import reporter as reporter_module
from harness.context import RunContext
from harness.record import REPORT_ATTRIBUTE
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
    report = SimpleNamespace(nodeid=nodeid)
    if record is not None:
        setattr(report, REPORT_ATTRIBUTE, record)
    return report


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
