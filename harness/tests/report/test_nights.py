"""docs/ci.md's GitHub workflow, replayed for five nights as its commands are written there: every `suite`
job's step (shards x SoCs; `harness/run.sh suite` is night_suite.py, which writes the synthetic shard the
suite would), the artifacts passed on as the workflow passes them, then the gate job's `merge and gate` and
`promote and write the history` steps, the store carried to the next night as its artifact. Night 3
brings a regression, night 4 a known failure that passes. The nights must all be stored (the failing ones
too, with their gate's verdict), the next gate must take the newest night that passed as its baseline, and
the history must date the regression, show the XPASS apart and link each row to pages that exist."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from harness.paths import REPO_ROOT
from harness.report.nightly import promote

CI = (REPO_ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
WORKFLOW = CI.split("```yaml\n", 1)[1].split("```", 1)[0]
ONE_HOST = CI.split("## One host\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
NIGHTS = 5
STORE_KEY = "a secret every job of the workflow is given"


def step_script(job: str, name: str) -> str:
    """The `run: |` block of the step of `job` whose name starts with `name`, as the workflow writes it."""
    lines = WORKFLOW.split(f"\n  {job}:\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"- name: {name}"))
    run = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "run: |")
    indent = len(lines[run + 1]) - len(lines[run + 1].lstrip())
    body = []
    for line in lines[run + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body)


def matrix(key: str) -> list[str]:
    return re.search(rf"^\s+{key}: \[([^\]]*)\]", WORKFLOW, re.M).group(1).replace(" ", "").split(",")


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A step as GitHub runs it: `bash -e` in the workspace."""
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _artifact(source: Path, target: Path) -> None:
    """upload-artifact then download-artifact: the files, hidden ones left out (include-hidden-files: false)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".*"))


def _environment(tmp_path: Path, night: int) -> dict[str, str]:
    tools = tmp_path / "bin"
    if not tools.exists():
        tools.mkdir()
        (tools / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # the venv's, as setup-python's
        (tools / "python").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO_ROOT),
        "QNNSUITE_STORE_KEY": STORE_KEY,
        "QNNSUITE_TEST_NIGHT": str(night),
        "COLUMNS": "300",
    }


def _suite_stub(workspace: Path) -> None:
    """harness/run.sh in the job's checkout: the synthetic suite (night_suite.py)."""
    script = workspace / "harness" / "run.sh"
    script.parent.mkdir(parents=True)
    script.write_text('#!/bin/sh\nexec python -m harness.tests.report.night_suite "$@"\n')
    script.chmod(0o755)


def _night(tmp_path: Path, night: int) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """One scheduled run on main: every suite job, then the gate job; the store artifact updated."""
    env = _environment(tmp_path, night)
    store = tmp_path / "artifacts" / "nightly-store"
    gate_job = tmp_path / f"night{night}" / "gate"
    (gate_job / "parts").mkdir(parents=True)
    for soc in matrix("soc"):
        for shard in matrix("shard"):
            job = tmp_path / f"night{night}" / f"suite-{soc}-{shard}"
            job.mkdir(parents=True)
            _suite_stub(job)
            if store.exists():
                _artifact(store, job / "nightly")
            script = step_script("suite", "run shard").replace("${{ matrix.soc }}", soc)
            completed = _bash(script.replace("${{ matrix.shard }}", shard), job, env)
            assert completed.returncode == 0, completed.stderr
            (run,) = (job / "out").glob("2*/")  # path: out/2*/
            _artifact(run, gate_job / "parts" / f"report-{soc}-{shard}")
    if store.exists():
        _artifact(store, gate_job / "nightly")
    merged = _bash(step_script("gate", "merge and gate"), gate_job, env)
    assert merged.returncode in (0, 1), merged.stderr  # 1: the gate failed, and the promote step still runs
    promoted = _bash(step_script("gate", "promote and write the history"), gate_job, env)
    assert promoted.returncode == 0, promoted.stderr
    shutil.rmtree(store, ignore_errors=True)
    _artifact(gate_job / "nightly", store)
    return merged, promoted


class _Links(HTMLParser):
    """Each table row's links, and every element id (a page's cells)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids.add(attributes["id"])
        if tag == "tr":
            self.rows.append((attributes.get("class") or "", []))
        elif tag == "a" and self.rows:
            self.rows[-1][1].append(attributes["href"])


def _target(page: Path, href: str) -> tuple[Path, str]:
    parts = urlsplit(href)
    assert not parts.scheme and not parts.netloc and not href.startswith("/"), f"not a relative link: {href}"
    return (page.parent / unquote(parts.path)).resolve(), unquote(parts.fragment)


@pytest.fixture(autouse=True)
def _store_key(monkeypatch) -> None:
    """This process reads the store as the workflow's jobs do: with the shared key."""
    monkeypatch.setenv("QNNSUITE_STORE_KEY", STORE_KEY)


@pytest.fixture(scope="module")
def nights(tmp_path_factory) -> tuple[Path, list]:
    tmp_path = tmp_path_factory.mktemp("ci")
    results = [_night(tmp_path, night) for night in range(1, NIGHTS + 1)]
    return tmp_path / "artifacts" / "nightly-store", results


@pytest.mark.child_python
def test_the_workflow_stores_every_night_with_its_gate_and_gates_against_the_newest_that_passed(nights):
    store, results = nights
    assert 'QNNSUITE_STORE_KEY: "${{ secrets.QNNSUITE_STORE_KEY }}"' in WORKFLOW
    stored = promote.nights(store)
    assert [night.folder.name.split("-", 4)[:4] for night in stored] == [
        [f"{i:06d}", "2026", "12", f"{i:02d}"] for i in range(1, NIGHTS + 1)
    ], "one night per run, named by its date, whatever the merge's --out folder is called"
    gates = [promote.gate_of(promote.night_record(night)) for night in stored]
    assert gates == ["not gated", "passed", "failed", "failed", "failed"]
    assert [merged.returncode for merged, _ in results] == [0, 0, 1, 1, 1]
    # night 3 failed its gate: nights 4 and 5 are gated against night 2, and say so
    for night in (3, 4):
        gate = json.loads((stored[night].folder / "SM8650" / "gate.json").read_text())
        assert gate["baseline"] == {"night": stored[1].folder.name, "run_id": stored[1].run_id, "executorch": "1.5.1"}
        merged = results[night][0]
        assert f"skipped newer night(s) {stored[night - 1].folder.name} (its gate failed)" in merged.stderr
    night4 = json.loads((stored[3].folder / "SM8650" / "gate.json").read_text())
    kinds = {(entry["kind"], entry["case_id"], entry["check"]) for entry in night4["checks"]}
    assert ("regression", "kv_cache-fp16-delegate_mutbuf-SM8650", "state") in kinds
    assert ("known failure now passes", "counter_add-fp16-delegate_mutbuf-SM8650", "state") in kinds
    assert night4["missing"] == 0 and night4["excluded"] == 0


@pytest.mark.child_python
def test_the_history_dates_the_regression_shows_the_xpass_and_links_rows_to_existing_pages(nights):
    store, results = nights
    stored = promote.nights(store)
    history = json.loads((store / "history.json").read_text())
    (regressed,) = [
        c for c in history["checks"] if (c["case_id"], c["check"]) == ("kv_cache-fp16-delegate_mutbuf-SM8650", "state")
    ]
    assert regressed["failing_since"] == stored[2].folder.name and regressed["started_failing"] == [
        stored[2].folder.name
    ]
    (xpassed,) = [c for c in history["checks"] if c["xpassed"]]
    assert xpassed["case_id"] == "counter_add-fp16-delegate_mutbuf-SM8650" and xpassed["xpassed"] == [
        stored[3].folder.name
    ]
    assert f"started failing on {stored[2].folder.name}" in results[2][1].stdout
    assert f"known failure passed on {stored[3].folder.name}" in results[3][1].stdout
    page = store / "history.html"
    text = page.read_text()
    links = _Links()
    links.feed(text)
    assert 'class="v xpassed"' in text and text.count('<tr class="xpassed">') == 1
    rows = [(kind, hrefs) for kind, hrefs in links.rows if kind in ("changed", "xpassed", "steady", "night")]
    assert len([kind for kind, _ in rows if kind == "night"]) == NIGHTS and len(rows) > NIGHTS
    ids: dict[Path, set[str]] = {}
    for kind, hrefs in rows:
        assert hrefs, f"a {kind} row without a link"
        for href in hrefs:
            target, fragment = _target(page, href)
            assert target.is_file() and target.is_relative_to(store.resolve()), href
            if fragment and target.suffix == ".html":
                if target not in ids:
                    found = _Links()
                    found.feed(target.read_text())
                    ids[target] = found.ids
                assert fragment in ids[target], href
            if target.name == "FINDINGS.md":
                assert f"## {fragment}" in target.read_text() or fragment in target.read_text()
    # every night kept its own FINDINGS.md, which its pages link: the store's pages travel with it
    assert all((night.folder / "FINDINGS.md").is_file() for night in stored)
    assert not [p for p in store.rglob("*") if stat.S_ISLNK(p.lstat().st_mode)]


@pytest.mark.child_python
def test_the_one_host_nightly_stores_every_night_and_gates_against_the_last_that_passed(tmp_path, monkeypatch):
    """docs/ci.md's one-host night, from `night=` on (the line before it is the plain whole-matrix run), as
    written, on three nights (`date` answers each night's day): the third brings the regression."""
    script = ONE_HOST[ONE_HOST.index("night=") :]
    monkeypatch.delenv("QNNSUITE_STORE_KEY")  # one host: the user's own key
    host = tmp_path / "host"
    host.mkdir()
    _suite_stub(host)
    outputs = []
    for night in (1, 2, 3):
        env = _environment(tmp_path, night)
        del env["QNNSUITE_STORE_KEY"]
        (tmp_path / "bin" / "date").write_text(f"#!/bin/sh\necho 202612{night:02d}\n")
        (tmp_path / "bin" / "date").chmod(0o755)
        completed = subprocess.run(
            ["bash", "-c", script], cwd=host, env=env, capture_output=True, text=True, timeout=600
        )
        assert completed.returncode == 0, completed.stderr
        outputs.append(completed)
    stored = promote.nights(host / "nightly")
    assert [night.date for night in stored] == ["2026-12-01", "2026-12-02", "2026-12-03"]
    assert [promote.gate_of(promote.night_record(night)) for night in stored] == ["not gated", "passed", "failed"]
    assert "gate against nightly" in outputs[2].stdout and "FAILED" in outputs[2].stdout
    history = json.loads((host / "nightly" / "history.json").read_text())
    assert [c["failing_since"] for c in history["checks"] if c["started_failing"]] == [stored[2].folder.name]
