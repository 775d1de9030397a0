"""The reporting layer on made-up check records (two SoCs, every verdict): the four files per SoC, the
report.json schema, gating against a baseline, the diff command, and the HTML as a browser shows it."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report import BaselineError, gate, summary_line, write_run
from harness.report.document import reason_of
from harness.text import markdown_text
from harness.vocabulary import DTYPES, MATRIX_MODES as MODES

SCHEMA = json.loads((REPO_ROOT / "harness" / "report" / "report.schema.json").read_text())
SOCS = ("SM8650", "SM8750")
CHECKS = ("export", "annotation", "partitions", "address_sharing", "state", "initial_state")
COLUMNS = [{"name": name, "short": name[:4]} for name in CHECKS]
FILES = ("report.json", "junit.xml", "summary.md", "report.html")
KNOWN = (
    "known failure [uninitialised_delegated_buffer]: delegated mutable buffer starts uninitialised "
    "(executorch backends/qualcomm/runtime)"
)
CARDS = {
    "counter_add": ("counter",),
    "counter_nonzero_init": ("counter", "nonzero_init"),
    "kv_index_copy_dim1": ("kv",),
    "ring_buffer": ("kv", "ring"),
    "llama_tiny_kv": ("kv", "llama"),
}
MANY_CARDS = {
    **CARDS,
    **{
        name: ("kv",)
        for name in (
            "kv_index_copy_dim2",
            "kv_index_put",
            "causal_mask_slice_assign",
            "copy_computed",
            "read_before_after",
            "kv_arange_init",
            "mutated_beside_unmutated",
            "running_average",
            "kv_gather_written",
            "ring_gather_written",
        )
    },
}
FAILED = {
    ("ring_buffer", "8a8w", "delegate_mutbuf", "state", "SM8750"),
    ("kv_index_copy_dim1", "16a4w", "skip_mutbuf", "partitions", "SM8650"),
}
STRICT_XPASS = ("counter_nonzero_init", "16a8w", "delegate_mutbuf", "initial_state", "SM8750")
XPASS = ("counter_nonzero_init", "fp16", "delegate_mutbuf", "state", "SM8650")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def _steps(rng: random.Random, bad: bool, n: int = 8) -> list[dict]:
    steps = []
    for step in range(n):
        error = 0.0 if step == 0 and not bad else rng.uniform(1e-4, 4e-3) * (1 + step)
        mismatches = rng.randint(3, 40) if bad and step >= 1 else 0
        sqnr = math.inf if error == 0 else (rng.uniform(-5, 8) if mismatches else rng.uniform(38, 62))
        steps.append(
            {
                "step": step,
                "max_abs_error": error * (300 if mismatches else 1),
                "sqnr_db": sqnr,
                "mismatches": mismatches,
            }
        )
    if bad:
        steps[-1].update(max_abs_error=math.nan, sqnr_db=-math.inf)
    return steps


def _record(rng: random.Random, card: str, tags: tuple[str, ...], dtype: str, mode: str, check: str, soc: str) -> dict:
    case_id = f"{card}-{dtype}-{mode}-{soc}"
    key = (card, dtype, mode, check, soc)
    verdict, message, known, evidence = "passed", "", "", {}
    if check in ("state", "initial_state"):
        evidence = {"steps": _steps(rng, bad=False)}
    if check == "annotation" and dtype == "fp16":
        verdict, message, evidence = "skipped", "fp16 is not quantized: no annotations to check", {}
    elif check == "initial_state" and "nonzero_init" not in tags:
        verdict, message, evidence = "skipped", "no output element depends on the buffers' initial values", {}
    elif key == STRICT_XPASS:
        verdict, message, known = "xpassed", f"[XPASS(strict)] {KNOWN}: it passes now", KNOWN
    elif key == XPASS:
        verdict, known = "xpassed", KNOWN
    elif check in ("state", "initial_state") and "nonzero_init" in tags and mode == "delegate_mutbuf":
        verdict, known, evidence = "xfailed", KNOWN, {"steps": _steps(rng, bad=True)}
        message = (
            f"{case_id}: 4 output element(s) that depend on the registered initial value differ from eager, "
            "first at step 0 [signature: uninitialised_delegated_buffer]"
        )
    elif key in FAILED and check == "state":
        verdict, evidence = "failed", {"steps": _steps(rng, bad=True)}
        message = "state differs from eager: 91 element(s) out of tolerance in 7/8 step(s); first at step 1"
    elif key in FAILED:
        verdict = "failed"
        message = "2 delegate(s) ['QnnBackend'], expected 1 x QnnBackend; outside the delegates: aten.index_put.default"
        evidence = {"delegates": [{"backend": "QnnBackend"}] * 2, "ops_outside": ["aten.index_put.default"]}
    lowering = 6.0 if "llama" in tags else 1.0
    return {
        "nodeid": f"suites/test_{check}.py::test_{check}[{case_id}]",
        "check": check,
        "case_id": case_id,
        "card": card,
        "tags": sorted(tags),
        "dtype": dtype,
        "mode": mode,
        "soc": soc,
        "verdict": verdict,
        "message": message,
        "known_failure": known,
        "evidence": evidence,
        "device_serial": f"emulator-{soc.lower()}",
        "delegates": 1,
        "timings_s": {
            "import_and_build": round(rng.uniform(0.1, 0.4), 3),
            "export": round(rng.uniform(0.3, 1.2), 3),
            "quantize": 0.0 if dtype == "fp16" else round(rng.uniform(0.5, 2) * lowering, 3),
            "lower": round(rng.uniform(2, 6) * lowering, 3),
            "serialize": round(rng.uniform(0.05, 0.2), 3),
            "push": round(rng.uniform(0.1, 0.5), 3),
            "run": round(rng.uniform(0.8, 3), 3),
            "pull": round(rng.uniform(0.05, 0.3), 3),
            "device_total": 4.2,
            "lower_wall": 9.5,
        },
        "duration_s": round(rng.uniform(0.001, 0.05), 3),
        "check_s": 0.002,
    }


def make_records(cards: dict[str, tuple[str, ...]] = CARDS, socs: tuple[str, ...] = SOCS, seed: int = 7) -> list[dict]:
    """Records as harness/verdicts.py makes them (as dicts) (llama cards have two dtypes only, so some cells are empty)."""
    rng = random.Random(seed)
    return [
        _record(rng, card, tags, dtype, mode, check, soc)
        for soc in socs
        for card, tags in cards.items()
        for dtype in (DTYPES[:2] if "llama" in tags else DTYPES)
        for mode in MODES
        for check in CHECKS
    ]


def environments(socs: tuple[str, ...] = SOCS) -> dict[str, dict]:
    return {
        soc: {
            "executorch": "1.0.0",
            "torch": "2.9.0",
            "torchao": "0.14.0",
            "qnn_build_id": "v2.37.0.250724175447",
            "bridge": "on",
            "device_serial": f"emulator-{soc.lower()}",
            "device_model": f"emulated {soc}",
            "soc": soc,
            "htp_arch": "V75" if soc == "SM8650" else "V79",
            "host": "ci-runner (x86_64, Linux 6.1)",
            "python": "3.11.7",
            "started": "2026-11-30T06:00:02",
            "finished": "2026-11-30T06:41:37",
            "emulated": True,
        }
        for soc in socs
    }


def typed(records: list[dict]) -> list[CheckRecord]:
    return [CheckRecord.from_dict(record) for record in records]


def _find(records: list[dict], card: str, dtype: str, mode: str, check: str, soc: str) -> dict:
    return next(r for r in records if r["case_id"] == f"{card}-{dtype}-{mode}-{soc}" and r["check"] == check)


@pytest.fixture()
def run(tmp_path: Path) -> tuple[list[dict], Path, dict[str, Path]]:
    records = make_records()
    return (
        records,
        tmp_path / "reports",
        write_run(typed(records), environments(), tmp_path / "reports", "run1", COLUMNS),
    )


def test_two_soc_run_writes_four_files_per_soc_and_points_latest(run):
    records, root, folders = run
    assert folders == {soc: root / "run1" / soc for soc in SOCS}
    for folder in folders.values():
        assert all((folder / name).stat().st_size > 0 for name in FILES)
    assert (root / "latest").is_symlink() and os.readlink(root / "latest") == "run1"
    write_run(typed(records), environments(), root, "run2", COLUMNS)
    assert os.readlink(root / "latest") == "run2" and (root / "latest" / "SM8650" / "report.html").exists()


def test_report_json_is_strict_json_valid_against_the_schema(run):
    records, _, folders = run
    for soc, folder in folders.items():
        text = (folder / "report.json").read_text()
        document = json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
        jsonschema.Draft202012Validator(SCHEMA).validate(document)
        mine = [r for r in records if r["soc"] == soc]
        assert document["summary"]["total"] == len(mine) == sum(len(c["checks"]) for c in document["cases"])
        assert document["environment"]["soc"] == soc
    sm8750 = json.loads((folders["SM8750"] / "report.json").read_text())
    case = next(c for c in sm8750["cases"] if c["case_id"] == "counter_nonzero_init-16a8w-delegate_mutbuf-SM8750")
    assert case["checks"]["initial_state"]["verdict"] == "xpassed"  # a strict XPASS, as pytest reports it
    assert case["checks"]["initial_state"]["check_s"] == 0.002  # record fields beyond the check's own pass through
    ring = next(c for c in sm8750["cases"] if c["case_id"] == "ring_buffer-8a8w-delegate_mutbuf-SM8750")
    assert ring["checks"]["state"]["evidence"]["steps"][-1]["sqnr_db"] == "-Infinity"
    assert list(ring["checks"]) == list(CHECKS)


def test_a_soc_without_environment_still_gets_a_valid_report(tmp_path: Path):
    folders = write_run(typed(make_records(socs=("SM8650",))), {}, tmp_path, "run1", COLUMNS)
    document = json.loads((folders["SM8650"] / "report.json").read_text())
    jsonschema.Draft202012Validator(SCHEMA).validate(document)
    assert document["environment"] == {"soc": "SM8650"} and (folders["SM8650"] / "report.html").exists()


def test_junit_has_one_testcase_per_check_record(run):
    records, _, folders = run
    for soc, folder in folders.items():
        suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
        cases = suite.findall("testcase")
        mine = [r for r in records if r["soc"] == soc]
        assert len(cases) == len(mine) == int(suite.get("tests"))
        assert {c.get("classname") for c in cases} == set(CHECKS)
        assert {c.get("name") for c in cases} == {r["case_id"] for r in mine}
        failures = sum(c.find("failure") is not None for c in cases)
        skipped = [c.find("skipped") for c in cases if c.find("skipped") is not None]
        assert failures == int(suite.get("failures")) >= 2
        assert len(skipped) == int(suite.get("skipped")) and all(s.get("message") for s in skipped)
        assert any(s.get("type") == "xfailed" for s in skipped)


def test_summary_md_names_failures_known_failures_and_slow_stages(run):
    _, _, folders = run
    text = (folders["SM8750"] / "summary.md").read_text()
    failures = text.split("## Failures")[1].split("##")[0]
    assert "- **failed** state: 1 check(s) in ring_buffer-8a8w-delegate_mutbuf-SM8750; e.g. state differs" in failures
    assert (
        "- **xpassed** initial_state `uninitialised_delegated_buffer`: 1 check(s) in counter_nonzero_init-16a8w"
        in failures
    )
    known = text.split("## Known failures")[1].split("##")[0]
    assert markdown_text(reason_of(KNOWN)) in known and "## Slowest stages" in text and "| lower |" in text


class _Matrix(HTMLParser):
    """Card names and verdict cells of the matrix's tables (class="matrix", a fold per dtype); and any
    resource the page would fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.cards, self.cells, self.fetches, self._in_card = 0, [], [], [], False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag in ("script", "img", "link", "iframe") and (values.get("src") or values.get("href")):
            self.fetches.append(values)
        if tag == "table" and "matrix" in (values.get("class") or "").split():
            self.depth = 1
        elif tag == "table" and self.depth:
            self.depth += 1
        if self.depth and tag == "th" and "card" in (values.get("class") or "").split():
            self._in_card = True
        if self.depth and tag == "td" and "cell" in (values.get("class") or "").split():
            self.cells.append(values["data-verdict"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.depth:
            self.depth -= 1
        if tag == "th":
            self._in_card = False

    def handle_data(self, data: str) -> None:
        if self._in_card and data.strip():
            self.cards.append(data.strip())


def test_html_is_a_self_contained_matrix_of_cards_and_check_cells(run):
    records, _, folders = run
    for soc, folder in folders.items():
        html = (folder / "report.html").read_text()
        parsed = _Matrix()
        parsed.feed(html)
        assert {card for card in parsed.cards if card != "model"} == set(CARDS)
        assert len(parsed.cards) == sum(
            len([c for c in CARDS if d in DTYPES[:2] or "llama" not in CARDS[c]]) + 1 for d in DTYPES
        )
        mine = [r for r in records if r["soc"] == soc]
        assert len(parsed.cells) == len(mine)
        assert {"passed", "failed", "xpassed", "xfailed", "skipped"} == set(parsed.cells)
        assert not parsed.fetches and "<svg" in html and "<details" in html
    sm8750 = (folders["SM8750"] / "report.html").read_text()
    assert ">FAIL<" in sm8750 and ">XPASS<" in sm8750 and ">xfail<" in sm8750 and "state differs from eager" in sm8750


def test_summary_line_counts_and_points_at_the_html(run):
    records, _, folders = run
    line = summary_line(typed(records), "SM8750", folders["SM8750"] / "report.html")
    assert line.startswith("SM8750: ") and line.endswith("run1/SM8750/report.html")
    assert " 1 failed, 1 xpassed, " in line and " xfailed, " in line and line.count("->") == 1
    assert summary_line(typed(records), "SM8650").startswith("SM8650: ") and "->" not in summary_line(
        typed(records), "SM8650"
    )


@pytest.fixture()
def clean_run(tmp_path: Path) -> tuple[list[dict], Path, dict[str, Path]]:
    """A run whose known failures all still fail (nothing xpassed), written as run1."""
    records = [dict(r, verdict="xfailed") if r["verdict"] == "xpassed" else r for r in make_records()]
    return (
        records,
        tmp_path / "reports",
        write_run(typed(records), environments(), tmp_path / "reports", "run1", COLUMNS),
    )


def test_gate_identical_run_is_ok(clean_run):
    records, root, _ = clean_run
    for baseline in (root / "run1", root / "latest"):
        result = gate(typed(records), baseline)
        assert result.ok and result.lines() == []
    one_soc = gate(typed([r for r in records if r["soc"] == "SM8650"]), root / "run1" / "SM8650" / "report.json")
    assert one_soc.ok and one_soc.lines() == []


def test_gate_fails_on_a_known_failure_passing_even_against_itself(run):
    records, root, _ = run
    result = gate(typed(records), root / "run1")
    assert not result.ok and result.regressions == () and result.new_failures == () and result.missing == ()
    assert sorted(c.key for c in result.fixed_known_failures) == [
        ("SM8650", "counter_nonzero_init-fp16-delegate_mutbuf-SM8650", "state"),
        ("SM8750", "counter_nonzero_init-16a8w-delegate_mutbuf-SM8750", "initial_state"),
    ]


def test_gate_fails_on_a_new_failing_check_absent_from_the_baseline(clean_run):
    records, root, _ = clean_run
    new = dict(
        _find(records, "ring_buffer", "fp16", "skip_mutbuf", "state", "SM8650"),
        check="bounded_state",
        verdict="failed",
        message="step 3: inf in output 0",
    )
    known = dict(new, check="other_new", verdict="xfailed", known_failure="a known defect", message="")
    passing = dict(new, check="third_new", verdict="passed", message="")
    result = gate(typed([*records, new, known, passing]), root / "run1")
    assert not result.ok and [c.key for c in result.new_failures] == [("SM8650", new["case_id"], "bounded_state")]
    assert result.lines() == [
        f"new failure: SM8650 {new['case_id']} bounded_state absent -> failed: step 3: inf in output 0"
    ]


def test_gate_fails_on_a_dropped_check_unless_missing_is_allowed(clean_run):
    records, root, _ = clean_run
    dropped = _find(records, "kv_index_copy_dim1", "fp16", "delegate_mutbuf", "partitions", "SM8750")
    now = [r for r in records if r is not dropped]
    result = gate(typed(now), root / "run1")
    assert not result.ok and [c.key for c in result.missing] == [("SM8750", dropped["case_id"], "partitions")]
    assert result.lines()[0] == (
        "1 check(s) of the baseline are missing: if this run left them out on purpose, gate it with --allow-missing"
    )
    assert result.lines()[1].startswith(f"missing: SM8750 {dropped['case_id']} partitions passed -> absent")
    allowed = gate(typed(now), root / "run1", allow_missing=True)
    assert allowed.ok and allowed.lines()[0].startswith("missing (allowed): ")


def test_gate_result_is_written_beside_each_report(clean_run, tmp_path: Path):
    records, root, _ = clean_run
    now = [dict(r) for r in records]
    regressed = _find(now, "ring_buffer", "16a8w", "skip_mutbuf", "address_sharing", "SM8650")
    regressed.update(verdict="failed", message="mutbuf 0 changed address between executes")
    result = gate(typed(now), root / "run1")
    folders = write_run(typed(now), environments(), tmp_path / "gated", "run2", COLUMNS, result)
    sm8650 = json.loads((folders["SM8650"] / "gate.json").read_text())
    assert sm8650["ok"] is False and [(e["kind"], e["case_id"], e["check"]) for e in sm8650["checks"]] == [
        ("regression", regressed["case_id"], "address_sharing")
    ]
    assert json.loads((folders["SM8750"] / "gate.json").read_text()) == {
        "ok": True,
        "baseline": {},
        "selection": "",
        "excluded": 0,
        "missing": 0,
        "missing_not_listed": 0,
        "checks": [],
        "performance": [],
        "structure": [],
    }
    summary = (folders["SM8650"] / "summary.md").read_text()
    assert (
        "## Gate: FAILED (1 check(s) named)" in summary
        and f"| regression | {regressed['case_id']} | address_sharing |" in summary
    )


def test_gate_names_exactly_the_injected_regression(clean_run):
    records, root, _ = clean_run
    now = [dict(r) for r in records]
    regressed = _find(now, "ring_buffer", "16a8w", "skip_mutbuf", "address_sharing", "SM8650")
    regressed.update(verdict="failed", message="mutbuf 0 changed address between executes")
    result = gate(typed(now), root / "run1")
    assert not result.ok and result.fixed_known_failures == ()
    assert [c.key for c in result.regressions] == [("SM8650", regressed["case_id"], "address_sharing")]
    assert result.lines() == [
        f"regression: SM8650 {regressed['case_id']} address_sharing passed -> failed: "
        "mutbuf 0 changed address between executes"
    ]


def _known_failure_changed(clean_run, **change: str) -> tuple[dict, object]:
    """clean_run with its known failure counter_nonzero_init 8a8w delegated state (SM8750) changed, gated
    against itself as written: (the changed record, the gate result)."""
    records, root, _ = clean_run
    now = [dict(r) for r in records]
    changed = _find(now, "counter_nonzero_init", "8a8w", "delegate_mutbuf", "state", "SM8750")
    assert changed["verdict"] == "xfailed"
    changed.update(known_failure="", **change)
    return changed, gate(typed(now), root / "run1")


def test_gate_names_a_known_failure_that_now_passes(clean_run):
    fixed, result = _known_failure_changed(clean_run, verdict="passed", message="")
    assert not result.ok and result.regressions == ()
    assert [c.key for c in result.fixed_known_failures] == [("SM8750", fixed["case_id"], "state")]
    assert len(result.lines()) == 1 and "update the known-failures manifest" in result.lines()[0]


def test_gate_refuses_an_ambiguous_or_missing_baseline(run):
    records, root, _ = run
    write_run(typed(records), environments(), root, "run2", COLUMNS)
    with pytest.raises(BaselineError, match="two reports for SM8650"):
        gate(typed(records), root)
    with pytest.raises(BaselineError, match="does not exist"):
        gate(typed(records), root / "nope")


def _diff(before: Path, after: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.report", "diff", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


@pytest.mark.child_python
def test_diff_cli_exit_codes(run, tmp_path: Path):
    records, root, _ = run
    same = _diff(root / "run1", root / "latest")
    assert (same.returncode, same.stdout) == (0, "")
    now = [dict(r) for r in records]
    _find(now, "counter_add", "fp16", "delegate_mutbuf", "export", "SM8750").update(verdict="failed", message="x")
    _find(now, "counter_nonzero_init", "8a8w", "delegate_mutbuf", "state", "SM8650").update(verdict="passed")
    write_run(typed(now), environments(), root, "run2", COLUMNS)
    worse = _diff(root / "run1", root / "run2")
    assert worse.returncode == 1, worse.stderr
    assert worse.stdout.splitlines() == [
        "SM8650 counter_nonzero_init-8a8w-delegate_mutbuf-SM8650 state xfailed -> passed  [known failure now passes]",
        "SM8750 counter_add-fp16-delegate_mutbuf-SM8750 export passed -> failed  [regression]",
    ]
    better = _diff(root / "run2" / "SM8750" / "report.json", root / "run1" / "SM8750" / "report.json")
    assert (better.returncode, better.stdout.split()[-1]) == (0, "passed")
    missing = _diff(tmp_path / "missing", root / "run1")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed on first use (apt lists refreshed only if the plain install fails)."""
    if not Path(CHROMIUM).exists() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        try:
            if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
                subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300)
                subprocess.run(install, env=env, capture_output=True, timeout=900)
        except subprocess.TimeoutExpired:
            pass
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} is missing and `apt-get install chromium` did not provide it (needs root and Debian's packages)"
        )
    return CHROMIUM


def _chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=90
    )


def test_html_renders_in_headless_chromium(chromium: str, tmp_path: Path):
    cards = dict(MANY_CARDS)
    folders = write_run(typed(make_records(cards)), environments(), tmp_path / "reports", "run1", COLUMNS)
    page = (folders["SM8750"] / "report.html").as_uri()
    dumped = _chromium(chromium, tmp_path / "profile", "--dump-dom", page)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert 'id="matrix"' in dumped.stdout and all(f">{card}<" in dumped.stdout for card in cards)
    screenshot = tmp_path / "report.png"
    shot = _chromium(
        chromium,
        tmp_path / "profile",
        f"--screenshot={screenshot}",
        "--window-size=1920,1200",
        "--hide-scrollbars",
        page,
    )
    assert shot.returncode == 0 and screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot.stderr[-2000:]


def _with_infrastructure_and_unmeasured(records: list[dict]) -> tuple[list[dict], dict, dict]:
    now = [dict(r) for r in records]
    lost = _find(now, "ring_buffer", "fp16", "delegate_mutbuf", "state", "SM8650")
    lost.update(verdict="infra_error", message="device emulator-sm8650 stopped answering: `run` got nothing in 10 s")
    unmeasured = _find(now, "ring_buffer", "fp16", "delegate_mutbuf", "address_sharing", "SM8650")
    unmeasured.update(verdict="not_measured", message="no execute trace on a phone device: pass --android-ndk PATH")
    return now, lost, unmeasured


def test_infrastructure_errors_and_unmeasured_checks_are_shown_apart_in_every_report(clean_run, tmp_path: Path):
    records, _, _ = clean_run
    now, lost, unmeasured = _with_infrastructure_and_unmeasured(records)
    folder = write_run(typed(now), environments(), tmp_path / "reports", "run2", COLUMNS)["SM8650"]
    document = json.loads((folder / "report.json").read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["summary"]["infra_error"] == 1 and document["summary"]["not_measured"] == 1
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert suite.get("errors") == "1"
    errors = [case for case in suite.iter("testcase") if case.find("error") is not None]
    assert [(c.get("classname"), c.get("name")) for c in errors] == [("state", lost["case_id"])]
    skipped = {
        c.get("classname"): c.find("skipped") for c in suite.iter("testcase") if c.get("name") == lost["case_id"]
    }
    assert skipped["address_sharing"].get("type") == "not_measured"
    summary = (folder / "summary.md").read_text()
    failures = summary.split("## Failures")[1].split("##")[0]
    assert lost["case_id"] not in failures, "an infrastructure error is no conformance failure"
    assert "## Infrastructure errors (1)" in summary and "stopped answering" in summary
    assert "## Not measured (1)" in summary and "--android-ndk" in summary
    html = (folder / "report.html").read_text()
    assert 'id="infrastructure"' in html and "stopped answering" in html and ">n/m<" in html
    line = summary_line(typed(now), "SM8650")
    assert "1 infrastructure errors" in line and "1 not measured" in line, line


def test_gate_lists_infrastructure_errors_apart_and_fails_on_them(clean_run):
    records, root, _ = clean_run
    now, lost, unmeasured = _with_infrastructure_and_unmeasured(records)
    result = gate(typed(now), root / "run1")
    assert result.regressions == () and result.new_failures == ()
    assert [c.key for c in result.infrastructure] == [("SM8650", lost["case_id"], "state")]
    assert [c.key for c in result.missing] == [("SM8650", unmeasured["case_id"], "address_sharing")]
    assert not result.ok, "a check that was not verified cannot pass the gate"
    kinds = [entry["kind"] for entry in result.entries()]
    assert kinds == ["missing", "infrastructure error"]
    assert gate(typed(now), root / "run1", allow_missing=True).ok is False  # unverified is not allowed away


def test_a_known_failure_that_fails_differently_is_a_new_failure(clean_run):
    different, result = _known_failure_changed(
        clean_run, verdict="failed", message="state differs from eager at step 2"
    )
    assert [c.key for c in result.new_failures] == [("SM8750", different["case_id"], "state")]
    assert result.lines() == [
        f"new failure: SM8750 {different['case_id']} state xfailed -> failed: state differs from eager at step 2"
    ]
