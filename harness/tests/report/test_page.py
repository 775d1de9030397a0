"""What is new comes first: a gated report.html opens with the gate, each named check
linked to its cell; the matrix is a fold per dtype without empty columns; known failures are grouped by
finding; the chart draws the tolerance; summary.md of a default-matrix run fits a GitHub comment; the
records carry signature and finding; a merge keeps provenance; the terminal ends with the conformance
block. The HTML is read with html.parser, as a browser's DOM would be."""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from harness import verdicts
from harness.check_registry import CheckFailure, CheckSpec
from harness.known_failures import KnownFailure
from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report import gate, summary_line, write_run
from harness.report.gate import clip
from harness.report.intake import read_report
from harness.report.nightly import merge as merging
from harness.report.render.chart import error_chart
from harness.report.render.markdown import render as render_markdown
from harness.report.render.page import anchor
from harness.tests.report.test_report import (
    CHROMIUM_FLAGS,
    COLUMNS,
    MANY_CARDS,
    SCHEMA,
    _find,
    chromium,  # noqa: F401 (the fixture, used as an argument)
    environments,
    make_records,
    typed,
)
from harness.text import markdown_text
from harness.vocabulary import DTYPES, Mode, Verdict

COMMENT_LIMIT = 60 * 1024  # both SoCs' summary.md under 60 KB (a GitHub comment holds 65,536 characters)
BEFORE_REPORT = Path("/work/before-report")  # a real default-matrix run, when this machine has it (read only)
F1 = (
    "known failure [uninitialised_delegated_buffer]: delegated buffer ignores its registered initial value "
    "(docs/FINDINGS.md#F1; executorch backends/qualcomm/runtime/QnnManager.cpp)"
)
F3 = "known failure [lowering_failed]: quantized mul_ on a buffer is rejected (docs/FINDINGS.md#F3; op_mul.py)"


class _Page(HTMLParser):
    """The page's structure: its sections in order, each one's links, the dtype folds and the matrix cells."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []  # ids, in page order
        self.links: dict[str, list[str]] = {}  # section id -> hrefs
        self.cells: dict[str, str] = {}  # cell id -> verdict
        self.folds: list[dict] = []  # {"dtype", "open", "tables": [[column headers]], "empty": n}
        self.fold_summaries: list[str] = []
        self._section: str | None = None
        self._header: list[str] | None = None
        self._in_checks_th = False
        self._summary = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        classes = (values.get("class") or "").split()
        if tag == "section":
            self._section = values.get("id") or values.get("aria-label") or ""
            self.sections.append(self._section)
        if tag == "a" and self._section is not None:
            self.links.setdefault(self._section, []).append(values.get("href") or "")
        if tag == "details" and "fold" in classes:
            self.folds.append({"dtype": values["id"], "open": "open" in values, "tables": [], "empty": 0})
        if tag == "table" and "matrix" in classes:
            self.folds[-1]["tables"].append([])
        if tag == "tr" and "checks" in classes:
            self._header = self.folds[-1]["tables"][-1]
        if tag == "th" and self._header is not None:
            self._in_checks_th = True
        if tag == "td" and "cell" in classes:
            self.cells[values["id"]] = values["data-verdict"]
        if tag == "td" and "none" in classes:
            self.folds[-1]["empty"] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = None
        if tag == "tr":
            self._header = None
        if tag == "th":
            self._in_checks_th = False

    def handle_data(self, data: str) -> None:
        if self._in_checks_th and self._header is not None and data.strip() and data.strip() != "model":
            self._header.append(data.strip())


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def _baseline(tmp_path: Path, records: list[dict]) -> Path:
    """records, written as the baseline run (its known failures expected, nothing xpassed)."""
    clean = [dict(r, verdict="xfailed") if r["verdict"] == "xpassed" else r for r in records]
    write_run(typed(clean), environments(), tmp_path / "base", "run0", COLUMNS)
    return tmp_path / "base" / "run0"


def _clean(records: list[dict]) -> list[dict]:
    return [dict(r, verdict="xfailed") if r["verdict"] == "xpassed" else dict(r) for r in records]


def test_a_gated_page_opens_with_the_gate_naming_the_injected_regression_linked_to_its_cell(tmp_path: Path):
    records = _clean(make_records())
    baseline = _baseline(tmp_path, records)
    regressed = _find(records, "ring_buffer", "16a8w", "skip_mutbuf", "address_sharing", "SM8650")
    regressed.update(verdict="failed", message="mutbuf 0 changed address between executes <b>bold</b>")
    result = gate(typed(records), baseline)
    folders = write_run(typed(records), environments(), tmp_path / "gated", "run1", COLUMNS, result)
    html = (folders["SM8650"] / "report.html").read_text()
    page = _parse(html)
    assert page.sections[0] == "gate", f"the gate is not the page's first section: {page.sections}"
    target = anchor(regressed["case_id"], "address_sharing")
    assert page.links["gate"] == [f"#{target}"], "the gate names exactly the regression, linked to its cell"
    assert page.cells[target] == "failed"
    gate_html = html.split('id="gate"')[1].split("</section>")[0]
    regression = gate_html.split('id="gate-regression"')[1].split('id="gate-new-failure"')[0]
    assert regressed["case_id"] in regression and "passed → failed" in regression
    assert "&lt;b&gt;bold&lt;/b&gt;" in regression and "<b>bold" not in html, "a message is text, not markup"
    for kind in ("new-failure", "known-failure-now-passes", "missing", "infrastructure-error"):
        section = gate_html.split(f'id="gate-{kind}"')[1].split("</div>\n    <div")[0]
        assert "empty-kind" in gate_html.split(f'id="gate-{kind}"')[0][-60:] and ">none<" in section, kind
    # the fold holding the regression is open, so its link lands on a visible cell
    assert next(f for f in page.folds if f["dtype"] == "dtype-16a8w")["open"]
    # must not match: the other SoC's gate passed, and an ungated page has no gate section
    other = _parse((folders["SM8750"] / "report.html").read_text())
    assert other.sections[0] == "gate" and other.links.get("gate", []) == []
    assert "Gate against the baseline: passed" in (folders["SM8750"] / "report.html").read_text()
    ungated = write_run(typed(records), environments(), tmp_path / "plain", "run2", COLUMNS)
    assert "gate" not in _parse((ungated["SM8650"] / "report.html").read_text()).sections


def _with_meta_llama(records: list[dict]) -> list[dict]:
    """The zoo's records plus a card that runs in meta_llama mode only, with a check of its own."""
    extra = []
    for soc in ("SM8650", "SM8750"):
        for dtype in DTYPES:
            for check in ("meta_llama_partitions", "state", "initial_state"):
                case_id = f"meta_llama_1layer-{dtype}-meta_llama-{soc}"
                extra.append(
                    {
                        **_find(records, "counter_add", dtype, "delegate_mutbuf", "export", soc),
                        "nodeid": f"suites/test_{check}.py::test_{check}[{case_id}]",
                        "check": check,
                        "case_id": case_id,
                        "card": "meta_llama_1layer",
                        "tags": ["llama"],
                        "mode": "meta_llama",
                        "evidence": {},
                    }
                )
    return records + extra


def test_the_matrix_is_a_fold_per_dtype_without_columns_no_row_has(tmp_path: Path):
    records = _with_meta_llama(make_records())
    columns = [*COLUMNS, {"name": "meta_llama_partitions", "short": "llama"}]
    folders = write_run(typed(records), environments(), tmp_path / "reports", "run1", columns)
    page = _parse((folders["SM8650"] / "report.html").read_text())
    assert [f["dtype"] for f in page.folds] == [f"dtype-{d}" for d in DTYPES]
    for fold in page.folds:
        zoo, llama = fold["tables"]
        assert "llama" not in zoo and len(zoo) == 2 * len(COLUMNS), zoo  # two modes x the zoo's checks
        assert llama == ["stat", "init", "llama"], "the meta llama card's table has only its own columns"
    # open: the folds with a failure or an xpass (SM8650: fp16's xpass, 16a4w's failing partitions); closed: the rest
    assert {f["dtype"]: f["open"] for f in page.folds} == {
        "dtype-fp16": True,
        "dtype-16a8w": False,
        "dtype-8a8w": False,
        "dtype-16a4w": True,
        "dtype-16a4w_block": False,
    }
    mine = [r for r in records if r["soc"] == "SM8650"]
    assert len(page.cells) == len(mine), "every check has its cell"
    # must not drop a column one row has: llama_tiny_kv has no 16a8w+ cases, but other cards fill them
    assert all(f["empty"] == 0 for f in page.folds[2:]) and all(len(f["tables"][0]) == 12 for f in page.folds)


def test_known_failures_are_grouped_by_finding_with_a_count_and_a_link(tmp_path: Path):
    records = make_records()
    for record in records:
        if record["known_failure"]:
            record["known_failure"] = F1
    moved = _find(records, "counter_add", "8a8w", "delegate_mutbuf", "partitions", "SM8650")
    moved.update(verdict="xfailed", known_failure=F3, message="lowering failed")
    folders = write_run(typed(records), environments(), tmp_path / "reports", "run1", COLUMNS)
    html = (folders["SM8650"] / "report.html").read_text()
    known = html.split('id="known"')[1].split("</section>")[0]
    f1 = sum(1 for r in records if r["soc"] == "SM8650" and r["known_failure"] == F1)
    links = _parse(html).links["known"]
    findings = [href for href in links if "FINDINGS.md#" in href]
    assert [href.rsplit("#", 1)[1] for href in findings] == ["F1", "F3"], "most checks first, each finding once"
    copy = Path(os.path.normpath(folders["SM8650"] / findings[0].split("#")[0]))  # the run folder's own copy
    assert (
        copy == folders["SM8650"].parent / "FINDINGS.md"
        and copy.read_text() == (REPO_ROOT / "docs" / "FINDINGS.md").read_text()
    )
    assert f'<td class="num">{f1} <span class="chip xpassed">1 now pass</span>' in known
    assert '<td class="num">1</td>' in known
    summary = (folders["SM8650"] / "summary.md").read_text()
    lines = [line for line in summary.splitlines() if line.startswith("- [F")]
    assert lines[0].startswith("- [F1](") and f": {f1} check(s), **1 now pass**" in lines[0]
    assert lines[1].startswith("- [F3](") and ": 1 check(s) in 1 case(s), `lowering_failed`" in lines[1]
    # the reason is said once, without the signature head and the reference the line already has
    assert "known failure \\[" not in lines[0] and "delegated buffer ignores its registered initial value" in lines[0]


def test_the_chart_draws_the_tolerance_line_where_steps_carry_it():
    steps = [
        {"step": 0, "max_abs_error": 1e-4, "sqnr_db": 60.0, "mismatches": 0, "tolerance": 1e-2},
        {"step": 1, "max_abs_error": 5.0, "sqnr_db": -3.0, "mismatches": 4, "tolerance": 2e-2},
    ]
    svg = error_chart(steps)
    line = svg.split('<polyline class="tolerance" points="')[1].split('"')[0]
    (_, y0), (_, y1) = (map(float, point.split(",")) for point in line.split())
    points = [float(part.split('cy="')[1].split('"')[0]) for part in svg.split("<circle")[1:]]
    assert points[0] > y0 and points[1] < y1, "a pass under its tolerance, a failure above it (y grows downwards)"
    assert "tolerance 0.02" in svg
    # must not draw one where no step carries a tolerance (reports written before steps had it)
    assert 'class="tolerance"' not in error_chart([{k: v for k, v in s.items() if k != "tolerance"} for s in steps])


def test_gate_reasons_are_cut_at_a_word_never_inside_one(tmp_path: Path):
    reason = "QnnManager::AllocateTensor " * 12
    cut = clip(reason)
    assert cut.endswith(" …") and len(cut) <= 162 and reason.startswith(cut[:-2]) and reason[len(cut) - 2] == " "
    assert clip("short reason") == "short reason"  # must not touch what fits
    records = _clean(make_records(socs=("SM8650",)))
    baseline = _baseline(tmp_path, records)
    _find(records, "counter_add", "fp16", "delegate_mutbuf", "export", "SM8650").update(
        verdict="failed", message=reason
    )
    folders = write_run(
        typed(records), environments(), tmp_path / "run", "run1", COLUMNS, gate(typed(records), baseline)
    )
    (entry,) = json.loads((folders["SM8650"] / "gate.json").read_text())["checks"]
    assert entry["why"] == cut


def _judge(error: BaseException | None, entries: list[KnownFailure]) -> CheckRecord:
    def function(outcome):
        if error is not None:
            raise error
        return {}

    spec = CheckSpec("state", function, "state", True, ("uninitialised_delegated_buffer",))
    case = SimpleNamespace(
        id="c-fp16-delegate_mutbuf-SM8650",
        card=SimpleNamespace(name="c", tags=()),
        dtype="fp16",
        mode=Mode.DELEGATE,
        soc="SM8650",
    )
    artifact = SimpleNamespace(delegate_count=1, cached=False, work={}, wall_s=0.0)
    outcome = SimpleNamespace(
        device_serial="d", artifact=artifact, retries=0, timings_s={}, timing=None, structure=None
    )
    return verdicts.judge(spec, case, outcome, entries, "n", str).record


def test_report_json_records_each_checks_signature_and_finding(tmp_path: Path):
    entry = KnownFailure("*", "uninitialised_delegated_buffer", "starts uninitialised", "docs/FINDINGS.md#F1; x.cpp")
    failure = CheckFailure("state differs", {}, "uninitialised_delegated_buffer")
    known = _judge(failure, [entry])
    assert (known.verdict.value, known.signature, known.finding) == ("xfailed", "uninitialised_delegated_buffer", "F1")
    new = _judge(CheckFailure("state differs", {}, "uninitialised_delegated_buffer"), [])
    assert (new.verdict.value, new.signature, new.finding) == ("failed", "uninitialised_delegated_buffer", "")
    passed = _judge(None, [])
    assert (passed.signature, passed.finding) == ("", "")  # must not name one for a pass
    folders = write_run([known, new, passed], {}, tmp_path, "run1", [{"name": "state", "short": "state"}])
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    (check,) = [c["checks"]["state"] for c in document["cases"]]  # one case: the last record of it counts
    assert "signature" in check and "finding" in check


def _default_matrix_like(tmp_path: Path) -> list[Path]:
    """Two SoCs of 15 cards x 4 dtypes x 2 modes x 6 checks, with known failures under 9 findings and 25
    manifest reasons, a bundle per failing case, many failures, infrastructure errors and a gate naming
    hundreds of checks: more than the default matrix's run gives summary.md to say."""
    records = make_records(MANY_CARDS)
    baseline = _baseline(tmp_path, records)
    known = 0
    for index, record in enumerate(records):
        if record["check"] in ("state", "initial_state", "partitions") and record["mode"] == "delegate_mutbuf":
            known += 1
            finding = known % 9 + 1
            record.update(
                verdict="xfailed",
                known_failure=f"known failure [state_mismatch]: reason {known % 25} of a defect, worded at length "
                f"as manifests do (docs/FINDINGS.md#F{finding}; executorch backends/qualcomm/some/file.cpp)",
                message=f"{record['case_id']}: state differs [signature: state_mismatch]",
                repro=f"repro/{record['case_id']}",
            )
        elif record["check"] == "address_sharing":
            record.update(verdict="failed", message=f"mutbuf {index} changed address between executes " * 3)
        elif record["check"] == "export" and index % 3 == 0:
            record.update(verdict="infra_error", message=f"device {index} stopped answering: `run` got nothing in 10 s")
        elif record["check"] == "annotation" and record["verdict"] == "passed":
            record.update(verdict="not_measured", message=f"no trace on device {index % 40}: pass --android-ndk PATH")
    result = gate(typed(records), baseline)
    folders = write_run(typed(records), environments(), tmp_path / "reports", "run1", COLUMNS, result)
    assert len(result.entries()) > 300
    return [folders[soc] / "summary.md" for soc in sorted(folders)]


def test_summary_md_of_both_socs_fits_a_github_comment(tmp_path: Path):
    files = _default_matrix_like(tmp_path)
    text = "\n".join(file.read_text() for file in files)
    assert len(text.encode()) < COMMENT_LIMIT, len(text.encode())
    first = files[0].read_text()
    heads = [line for line in first.splitlines() if line.startswith("## ")]
    assert heads[0].startswith("## Gate: FAILED") and heads[1].startswith("## Failures"), heads
    assert "- and " in first.split("## Gate")[1].split("##")[0], "the gate's table ends with how many more"
    known = first.split("## Known failures")[1].split("##")[0]
    assert len([line for line in known.splitlines() if line.startswith("- [F")]) == 9, "one line per finding"
    bundles = first.split("## Reproduction bundles")[1].split("##")[0]
    assert bundles.startswith(" (72)") and "In [repro/](repro/)" in bundles and "\n- " not in bundles, bundles


@pytest.mark.skipif(not BEFORE_REPORT.is_dir(), reason=f"{BEFORE_REPORT} (a real default-matrix run) is not here")
def test_summary_md_of_a_real_default_matrix_run_fits_a_github_comment():
    """Re-rendered from its report.json files (read only: nothing is written there)."""
    texts = [render_markdown(read_report(file)) for file in sorted(BEFORE_REPORT.glob("*/report.json"))]
    assert len(texts) == 2 and len("\n".join(texts).encode()) < COMMENT_LIMIT


def test_a_merge_keeps_provenance_and_the_qnn_build_warning(tmp_path: Path):
    records = make_records()
    warning = "emulator-sm8650: QNN build v2.37.0 on the device, v2.38.0 lowered the programs"
    parts = []
    for index in (1, 2):  # part 1: two cards, part 2: the others
        mine = [r for r in records if (r["card"] in ("counter_add", "ring_buffer")) == (index == 1)]
        provenance = {
            soc: {
                "host": {"executorch": "1.0.0", "torch": "2.9.0", "qnn_build_id": "v2.38.0"},
                "devices": [{"serial": f"dev{index}-{soc}", "soc": soc, "health": "passed", "kind": "emulated"}],
                "warnings": [warning] if index == 2 else [],
            }
            for soc in ("SM8650", "SM8750")
        }
        write_run(typed(mine), environments(), tmp_path / f"part{index}", f"run{index}", COLUMNS, None, provenance)
        parts.append(tmp_path / f"part{index}" / f"run{index}")
    merging.merge(parts, tmp_path / "merged")
    document = json.loads((tmp_path / "merged" / "SM8650" / "report.json").read_text())
    assert [d["serial"] for d in document["provenance"]["devices"]] == ["dev1-SM8650", "dev2-SM8650"]
    assert document["provenance"]["warnings"] == [warning]
    html = (tmp_path / "merged" / "SM8650" / "report.html").read_text()
    assert 'id="provenance"' in html and warning in html and "dev2-SM8650" in html
    # must not invent one: parts that measured none merge into a report without it
    write_run(typed(records[:10]), environments(), tmp_path / "bare", "run9", COLUMNS)
    merging.merge([tmp_path / "bare" / "run9"], tmp_path / "merged-bare")
    bare = json.loads((tmp_path / "merged-bare" / "SM8650" / "report.json").read_text())
    assert "provenance" not in bare


CONFTEST = """
import json, os
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import reporter as reporter_module
from harness.context import RunContext
from harness.record import RECORD_PROPERTY
from harness.report.gate import Outcome

reporter_module.prepare = lambda sdk: None  # no QNN toolchain here: the environment says none
RECORDS = json.loads(Path(os.environ["RECORDS"]).read_text())


def pytest_configure(config):
    here = Path(os.environ["RECORDS"]).parent
    options = SimpleNamespace(qnn_sdk=None, report_dir=here / "reports", baseline="base", allow_missing=False, shard=None, perf_budget=10.0, perf_gate=False)
    (here / "work").mkdir(exist_ok=True)
    baseline = {(r["soc"], r["case_id"], r["check"]): Outcome("passed") for r in RECORDS.values()}
    config.pluginmanager.register(
        reporter_module.ConformanceReporter(options, RunContext("run1", (), {}, (), here / "work"), baseline), "qnnsuite"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call":
        report.user_properties.append((RECORD_PROPERTY, RECORDS[item.name]))
    return report
"""

TESTS = """
import pytest

def test_passed(): pass
def test_regressed(): assert False, "address moved"
def test_known(): pytest.xfail("known failure [state_mismatch]: a defect")
def test_unmeasured(): pytest.skip("not measured: no trace")
def test_infrastructure(): assert False, "device stopped answering"
"""


@pytest.mark.child_python
def test_the_terminal_ends_with_the_conformance_block_naming_what_pytest_counted_as_skipped(tmp_path: Path):
    addopts = configparser.ConfigParser()
    addopts.read(REPO_ROOT / "pytest.ini")
    flags = addopts["pytest"]["addopts"].split()
    assert "-rfE" in flags and "-ra" not in flags, "no XFAIL line per known failure after the conformance block"
    base = _find(make_records(socs=("SM8650",)), "counter_add", "fp16", "delegate_mutbuf", "export", "SM8650")
    verdict_of = {
        "test_passed": "passed",
        "test_regressed": "failed",
        "test_known": "xfailed",
        "test_unmeasured": "not_measured",
        "test_infrastructure": "infra_error",
    }
    records = {
        name: dict(base, check=name[5:], verdict=verdict, nodeid=f"test_it.py::{name}", evidence={})
        for name, verdict in verdict_of.items()
    }
    (tmp_path / "records.json").write_text(json.dumps(records))
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_it.py").write_text(TESTS)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rfE", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "RECORDS": str(tmp_path / "records.json"), "PYTHONPATH": str(REPO_ROOT)},
    )
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    section = next(i for i, line in enumerate(lines) if "QNN mutable-buffer conformance" in line)
    counts = lines[section - 1]  # pytest's own last line comes before the block
    # pytest counts a not-measured check apart (not as skipped); an infrastructure error stays its failure (a FAILED
    # line with the device's words), which the conformance lines then count apart.
    assert "1 not measured" in counts and "2 failed" in counts and "skipped" not in counts, counts
    assert any(line.startswith("FAILED") and "test_infrastructure" in line for line in lines), "pytest lists it"
    tail = lines[section + 1 :]
    assert tail[0].startswith("SM8650: 1 passed, 1 failed, 1 xfailed, 1 not measured, 1 infrastructure errors")
    assert any(line.startswith("gate against base: FAILED") for line in tail)
    assert any("regression: SM8650 " in line and " regressed passed -> failed" in line for line in tail)
    assert tail[-1] == (
        "conformance: 1 passed, 1 failed, 1 xfailed, 0 skipped, 1 not measured, 1 infrastructure errors"
        " (5 checks on 1 SoC(s)); gate FAILED"
    ).replace(", 0 skipped", ""), tail[-1]
    assert "XFAIL" not in run.stdout, "no -ra flood"


# Opens every cell's popover in turn (as a click does: open, then its toggle handler) and writes where each one
# landed, with the box of its panel and the window and which of its corners the browser shows something else at
# (a panel's overflow clipped it, or it lies under another element), into the DOM that --dump-dom prints.
POPOVER_GEOMETRY = """<script>
(function () {
  document.querySelectorAll("details.fold").forEach(function (f) { f.open = true; });
  var seen = [];
  document.querySelectorAll("td.cell details").forEach(function (d) {
    d.parentElement.scrollIntoView({block: "center", inline: "center"});
    d.open = true;
    d.dispatchEvent(new Event("toggle"));
    var pop = d.querySelector(".pop"), panel = d.closest("section.panel");
    var box = pop.getBoundingClientRect(), outer = panel.getBoundingClientRect();
    var corners = [[box.left + 3, box.top + 3], [box.right - 3, box.top + 3], [box.left + 3, box.bottom - 3],
      [box.right - 3, box.bottom - 3]];
    seen.push({cell: d.parentElement.id, right_half: pop.classList.contains("left"), left: box.left,
      right: box.right, top: box.top, bottom: box.bottom, width: box.width,
      panel_left: outer.left + panel.clientLeft, panel_right: outer.left + panel.clientLeft + panel.clientWidth,
      viewport: document.documentElement.clientWidth, height: window.innerHeight,
      hidden_corners: corners.filter(function (p) { return !pop.contains(document.elementFromPoint(p[0], p[1])); })});
    d.open = false;
  });
  var out = document.createElement("pre");
  out.id = "geometry";
  out.textContent = JSON.stringify(seen);
  document.body.appendChild(out);
})();
</script>"""
WIDTHS = (1000, 1400, 1920)


def test_every_cell_popover_stays_inside_its_panel_and_the_window(chromium: str, tmp_path: Path):  # noqa: F811
    folders = write_run(typed(make_records()), environments(), tmp_path / "reports", "run1", COLUMNS)
    probe = tmp_path / "probe.html"
    probe.write_text((folders["SM8650"] / "report.html").read_text().replace("</body>", POPOVER_GEOMETRY + "</body>"))
    browsers = {
        width: subprocess.Popen(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={tmp_path / f'profile-{width}'}",
                f"--window-size={width},900",
                "--hide-scrollbars",
                "--dump-dom",
                probe.as_uri(),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for width in WIDTHS
    }
    for width, browser in browsers.items():
        dom, errors = browser.communicate(timeout=120)
        assert browser.returncode == 0 and 'id="geometry"' in dom, errors[-2000:]
        seen = json.loads(unescape(dom.split('<pre id="geometry">')[1].split("</pre>")[0]))
        assert {c["right_half"] for c in seen} == {True, False}, "cells of both halves were opened"
        assert all(abs(c["viewport"] - width) < 20 for c in seen), f"the window is not {width} px wide"
        clipped = [
            c
            for c in seen
            if c["left"] < max(c["panel_left"], 0) - 0.5
            or c["right"] > min(c["panel_right"], c["viewport"]) + 0.5
            or c["top"] < -0.5
            or c["bottom"] > c["height"] + 0.5
            or c["hidden_corners"]  # clipped by a panel, or under something else
        ]
        assert not clipped, f"{len(clipped)} of {len(seen)} popovers cross their panel at {width} px: {clipped[:3]}"
        assert min(c["width"] for c in seen) >= min(600, width - 100), "a popover was squeezed, not moved"


SOCKET = "localfilesystem:/tmp/qnnsuite-20261206-053633-4533-qxhixk7y/emulator/adb-server/adb.sock"


@pytest.mark.parametrize(
    ("address", "emulated", "shown"),
    [
        (f"{SOCKET}/127.0.0.1:45551", True, "emulated SM8650 (127.0.0.1:45551)"),
        ("127.0.0.1:5037/R5CW30ABCDE", False, "R5CW30ABCDE"),  # a phone: its serial
    ],
)
def test_devices_are_named_short_in_the_terminal_summary_md_and_the_page(
    tmp_path: Path, address: str, emulated: bool, shown: str
):
    records = [dict(r, device_serial=address) for r in make_records(socs=("SM8650",))]
    env = {"SM8650": dict(environments(("SM8650",))["SM8650"], device_serial=address, emulated=emulated)}
    folder = write_run(typed(records), env, tmp_path / "reports", "run1", COLUMNS)["SM8650"]
    line = summary_line(typed(records), "SM8650", folder / "report.html", emulated=emulated)
    assert f" on {shown} -> " in line, line
    page = unescape((folder / "report.html").read_text())
    summary = (folder / "summary.md").read_text()
    for text, name in ((line, shown), (page, shown), (summary, markdown_text(shown))):
        assert name in text and address not in text and "localfilesystem" not in text
    document = json.loads((folder / "report.json").read_text())  # the full address stays for what reads it
    assert document["environment"]["device_serial"] == address
    assert {case["device_serial"] for case in document["cases"]} == {address}


def test_the_page_labels_every_verdict_from_the_verdict_itself(tmp_path: Path):
    """Each verdict (not measured and infrastructure errors too) gets its own label in the matrix's cells."""
    records = make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    assert len(records) >= len(Verdict)
    for record, verdict in zip(records, Verdict, strict=False):
        record.update(verdict=verdict.value, message="" if verdict is Verdict.PASSED else f"why {verdict.value}")
        if verdict in (Verdict.XFAILED, Verdict.XPASSED):
            record.update(known_failure=F1, finding="F1")
    folders = write_run(typed(records), environments(), tmp_path / "reports", "run1", COLUMNS)
    html = (folders["SM8650"] / "report.html").read_text()
    for verdict in Verdict:  # the matrix's cell (the legend lists every label whatever the cells say)
        cell = rf'data-verdict="{verdict.value}">(<details><summary [^>]*>)?<span class="v {verdict.value}"[^>]*>'
        assert re.search(cell + re.escape(verdict.label) + "</span>", html), verdict
