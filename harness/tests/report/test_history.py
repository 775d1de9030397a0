"""The nightly store and its history: promote four runs built from one small report fixture (a clean
night, then one with an injected regression, one where a check flips, one where a card is missing), then
`history` must name the regression's first night, the flaky check and the missing card, and must not
call a steady known failure flaky or new. Runs are written by the suite's own report writer, so they are
the files a real run leaves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report.nightly import history, promote
from harness.report.render import writer

COLUMNS = [{"name": "export", "short": "exp"}, {"name": "state", "short": "st"}]
CARDS = ("counter_add", "kv_cache", "slice_mask")
SOCS = ("SM8650", "SM8750")
KNOWN = (
    "known failure [uninitialised_delegated_buffer]: delegated buffer ignores its initial value <b> "
    "(docs/FINDINGS.md#F1; executorch backends/qualcomm/runtime/QnnManager.cpp QnnManager::AllocateTensor)"
)
REGRESSED = ("SM8650", "kv_cache-fp16-delegate_mutbuf-SM8650", "state")
FLAKY = ("SM8750", "counter_add-fp16-delegate_mutbuf-SM8750", "state")
STEADY = ("SM8650", "kv_cache-fp16-skip_mutbuf-SM8650", "state")  # a known failure every night


def _steps(error: float) -> list[dict]:
    return [{"step": i, "max_abs_error": error * (i + 1), "sqnr_db": 60.0, "mismatches": 0} for i in range(4)]


def _records(night: int) -> list[CheckRecord]:
    """Night 1 clean; 2: REGRESSED fails (and stays failing); 3: FLAKY fails once; 4: slice_mask is not
    measured on SM8650."""
    records = []
    for soc in SOCS:
        for card in CARDS:
            if night == 4 and soc == "SM8650" and card == "slice_mask":
                continue
            for mode in ("delegate_mutbuf", "skip_mutbuf"):
                case_id = f"{card}-fp16-{mode}-{soc}"
                for check in ("export", "state"):
                    key = (soc, case_id, check)
                    verdict, message, known, error = "passed", "", "", 1e-3
                    if key == REGRESSED and night >= 2 or key == FLAKY and night == 3:
                        verdict, message, error = "failed", "step 2: max abs error 0.5 > 0.01", 0.5 * night
                    if key == STEADY:
                        verdict, message, known = "xfailed", KNOWN, KNOWN
                    records.append(
                        CheckRecord.from_dict(
                            {
                                "nodeid": f"suites/test_{check}.py::test_{check}[{case_id}]",
                                "check": check,
                                "case_id": case_id,
                                "card": card,
                                "tags": [],
                                "dtype": "fp16",
                                "mode": mode,
                                "soc": soc,
                                "verdict": verdict,
                                "message": message,
                                "known_failure": known,
                                "evidence": {"steps": _steps(error)} if check == "state" else {},
                                "device_serial": f"localfilesystem:/tmp/x/adb.sock/emulator-{night}",
                            }
                        )
                    )
    return records


def _run(reports: Path, night: int) -> Path:
    run_id = f"2026120{night}-020000-{night}"
    environments = {
        soc: {"soc": soc, "executorch": "1.5.1", "emulated": True, "started": f"2026-12-0{night}T02:00:00+0000"}
        for soc in SOCS
    }
    writer.write_run(_records(night), environments, reports, run_id, COLUMNS)
    return reports / run_id


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.report", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nightly")
    for night in (1, 2, 3, 4):
        completed = _cli("promote", _run(root / "reports", night), "--to", root / "nightly")
        assert completed.returncode == 0, completed.stderr
    return root / "nightly"


def _check(document: dict, key: tuple[str, str, str]) -> dict:
    (found,) = [c for c in document["checks"] if (c["soc"], c["case_id"], c["check"]) == key]
    return found


@pytest.mark.child_python
def test_history_names_the_regressions_first_night_the_flaky_check_and_the_missing_card(store):
    completed = _cli("history", store)
    assert completed.returncode == 0, completed.stderr
    document = json.loads((store / "history.json").read_text())
    names = [n["name"] for n in document["nights"]]
    assert names == [
        "000001-2026-12-01-20261201-020000-1",
        "000002-2026-12-02-20261202-020000-2",
        "000003-2026-12-03-20261203-020000-3",
        "000004-2026-12-04-20261204-020000-4",
    ]
    regressed = _check(document, REGRESSED)
    assert regressed["failing_since"] == names[1] and regressed["started_failing"] == [names[1]]
    assert not regressed["flaky"]
    flaky = _check(document, FLAKY)
    assert flaky["flaky"] and flaky["started_failing"] == [names[2]] and flaky["stopped_failing"] == [names[3]]
    assert flaky["failing_since"] is None
    steady = _check(document, STEADY)  # the check it must not match: a known failure every night
    assert steady["failing_since"] == names[0] and not steady["started_failing"] and not steady["flaky"]
    missing = {(m["kind"], m["name"]): m for m in document["missing"]}
    assert missing.pop(("card", "SM8650: slice_mask"))["missing_since"] == names[3]
    assert not missing, missing  # the emulated devices change address every night and are not missing
    assert f"flaky across nights: {' '.join(FLAKY)}" in completed.stdout
    assert "missing since 000004-2026-12-04-20261204-020000-4: card SM8650: slice_mask" in completed.stdout
    findings = {f["finding"]: f["counts"] for f in document["findings"]}
    assert findings == {"F1": [1, 1, 1, 1], "new-state": [0, 1, 2, 1]}
    (errors,) = [e for e in document["errors"] if (e["soc"], e["case_id"], e["check"]) == REGRESSED]
    assert [series[1] for series in errors["max_abs_error"]] == [2e-3, 2.0, 3.0, 4.0]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.svgs = 0
        self.tags: set[str] = set()
        self._row: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.svgs += tag == "svg"
        if tag == "tr":
            self._row = []

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row.append(data.strip())


@pytest.mark.child_python
def test_history_page_shows_the_same_and_escapes_report_text(store):
    history.write(store)
    text = (store / "history.html").read_text()
    page = _Page()
    page.feed(text)
    assert [
        REGRESSED[1],
        "state",
        "000002-2026-12-02-20261202-020000-2",
        "000002-2026-12-02-20261202-020000-2",
    ] == page.rows[next(i for i, row in enumerate(page.rows) if REGRESSED[1] in row)][1:5]
    assert any(row[:2] == ["card", "SM8650: slice_mask"] for row in page.rows)
    assert page.svgs >= 2 and "b" not in page.tags  # the known failure's <b> is text, not markup
    assert "&lt;b&gt;" in text and "<script" not in text and "http" not in text.replace("http://www.w3.org", "")


@pytest.mark.child_python
def test_a_night_that_cannot_be_read_is_named_not_fatal(tmp_path, store):
    copy = tmp_path / "store"
    subprocess.run(["cp", "-r", str(store), str(copy)], check=True)
    broken = promote.nights(copy)[1].folder / "SM8650" / "report.json"
    broken.write_text("{not json")
    completed = _cli("history", copy)
    assert completed.returncode == 0, completed.stderr
    assert f"unreadable night 000002-2026-12-02-20261202-020000-2: {history.NOT_SEALED}" in completed.stdout
    assert "Traceback" not in completed.stderr


@pytest.mark.child_python
def test_history_refuses_a_folder_that_is_not_a_store(tmp_path):
    completed = _cli("history", tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip().count("\n") == 0 and "is not a nightly store" in completed.stderr


def test_a_phone_that_went_missing_is_named_by_its_serial(tmp_path):
    """Phones keep their serial across nights (their adb server may move): the one that did not come back is
    missing, the one that stayed is not."""
    reports = tmp_path / "reports"
    for night, phones in ((1, ("R5CW1", "R3CT9")), (2, ("R5CW1",))):
        provenance = {
            "SM8650": {
                "host": {"executorch": "1.5.1", "torch": "2.13.0", "qnn_build_id": "v2.51.0.1"},
                "devices": [
                    {"serial": f"rack-{night}:5037/{serial}", "soc": "SM8650", "health": "passed", "kind": "phone"}
                    for serial in phones
                ],
                "warnings": [],
            }
        }
        records = [r for r in _records(1) if r.soc == "SM8650"]
        writer.write_run(
            records,
            {"SM8650": {"soc": "SM8650", "started": "2026-12-02T02:00:00+0000"}},
            reports,
            f"run{night}",
            COLUMNS,
            provenance=provenance,
        )
        promote.promote(reports / f"run{night}", tmp_path / "store")
    document = history.build(history.read_store(tmp_path / "store"))
    assert [(m["kind"], m["name"], m["missing_since"]) for m in document["missing"]] == [
        ("device", "SM8650: R3CT9", "000002-2026-12-02-run2")
    ]


@pytest.mark.child_python
def test_findings_sort_numerically_with_deltas_and_verdicts_each_have_their_colour(store):
    assert sorted(["F11", "new-state", "F2", "F1"], key=history.finding_order) == ["F1", "F2", "F11", "new-state"]
    assert history._deltas([0, 1, 3, 3, 1]) == [(0, ""), (1, "+1"), (3, "+2"), (3, ""), (1, "-2")]
    classes = [history.square_class(v) for v in ("passed", "failed", "xfailed", "xpassed", "skipped", None)]
    assert classes == ["passed", "failed", "xfailed", "xpassed", "other", "absent"]
    history.write(store)
    text = (store / "history.html").read_text()
    for verdict in ("failed", "xfailed", "passed"):
        assert f'class="v {verdict}"' in text
    assert len({line for line in text.splitlines() if line.startswith("span.")}) >= 2
    row = next(line for line in text.splitlines() if line.startswith('<tr class="finding">') and "new-state" in line)
    assert (
        '<td>1 <span class="up">+1</span></td><td>2 <span class="up">+1</span></td><td>1 <span class="down">-1</span>'
        in row
    )
    assert 'href="000004-2026-12-04-20261204-020000-4/FINDINGS.md#F1"' in text
    copy = store.parent / "site"
    history.write(store, copy)  # written elsewhere: the links reach the store from there
    assert (
        'href="../nightly/000004-2026-12-04-20261204-020000-4/SM8650/report.html#cell-'
        in (copy / "history.html").read_text()
    )
