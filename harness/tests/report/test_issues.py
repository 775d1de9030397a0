"""`python -m harness.report issues RUN`: one issue per finding (not per bundle), with a script that runs on
its own, the control mode, the numbers, links that work outside this repository, and the bundles covered.

The run is written by the suite's report writer; its bundles hold a case.json and a card module as a real
bundle does (a small card module in the zoo's style: constants, a helper, the model, the steps, and the
suite's register call the script must leave out)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.record import CheckRecord
from harness.report.nightly import issues
from harness.report.render import writer
from harness.tests.report.test_history import _cli

COLUMNS = [{"name": "state", "short": "st"}, {"name": "partitions", "short": "pt"}]
F1 = (
    "known failure [uninitialised_delegated_buffer]: delegated buffer ignores its registered value "
    "(docs/FINDINGS.md#F1; executorch backends/qualcomm/runtime/QnnManager.cpp QnnManager::AllocateTensor)"
)
HOSTILE = "state differs <img src=x onerror=alert(1)> ``` [link](http://evil) @team"
CARD_MODULE = '''"""Cards for the test."""

from __future__ import annotations

import torch

from harness.pipeline.card import ModelCard, register

ROWS = 8
UNUSED = 3
Steps = list[tuple[torch.Tensor, ...]]


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


class CounterAdd(torch.nn.Module):
    """Adds each step's input to its buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(ROWS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x)
        return self.count.clone()


def _counter_steps(n: int) -> Steps:
    generator = _generator()
    return [(torch.rand(ROWS, generator=generator),) for _ in range(n)]


register(ModelCard(name="counter_add", build=CounterAdd, mutated_buffers=("count",), steps=_counter_steps))
'''


def _steps() -> list[dict]:
    return [{"step": i, "max_abs_error": 131008.0, "sqnr_db": "-Infinity", "mismatches": 8} for i in range(4)]


def _bundle(soc_folder: Path, case_id: str, message: str) -> str:
    folder = soc_folder / "repro" / case_id
    (folder / "card").mkdir(parents=True)
    (folder / "card" / "cards.py").write_text(CARD_MODULE)
    tree = ast.parse(CARD_MODULE)
    sources = {node.name: ast.get_source_segment(CARD_MODULE, node) for node in tree.body if hasattr(node, "name")}
    case = {
        "case_id": case_id,
        "dtype": "fp16",
        "mode": "delegate_mutbuf",
        "soc": soc_folder.name,
        "steps": 4,
        "card": {
            "name": "counter_add",
            "file": "card/cards.py",
            "mutated_buffers": ["count"],
            "build_source": sources["CounterAdd"],
            "steps_source": sources["_counter_steps"],
        },
        "numbers": _steps(),
        "tolerance": {"atol": 1e-2, "rtol": 1e-2, "range_fraction": 0.0},
        "lowering": {"ok": True, "error": ""},
        "checks": {"state": {"upstream": "executorch backends/qualcomm/runtime/QnnManager.cpp QnnManager::Allocate"}},
    }
    (folder / "case.json").write_text(json.dumps(case))
    (soc_folder / "repro" / f"{case_id}.tar.gz").write_bytes(b"")
    return f"repro/{case_id}"


def _record(soc: str, card: str, mode: str, check: str, verdict: str, **extra) -> CheckRecord:
    case_id = f"{card}-fp16-{mode}-{soc}"
    return CheckRecord.from_dict(
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
            **extra,
        }
    )


def _run(root: Path) -> Path:
    """counter_add fails F1 delegated on two SoCs and passes with skip_mutable_buffer=True; kv_cache fails a
    check no entry expects, in both modes."""
    records = []
    for soc in ("SM8650", "SM8750"):
        soc_folder = root / "reports" / "run1" / soc
        repro = _bundle(soc_folder, f"counter_add-fp16-delegate_mutbuf-{soc}", F1)
        evidence = {"steps": _steps()}
        records += [
            _record(
                soc,
                "counter_add",
                "delegate_mutbuf",
                "state",
                "xfailed",
                message=F1,
                known_failure=F1,
                evidence=evidence,
                repro=repro,
            ),
            _record(soc, "counter_add", "delegate_mutbuf", "partitions", "passed"),
            _record(soc, "counter_add", "skip_mutbuf", "state", "passed"),
            _record(soc, "counter_add", "skip_mutbuf", "partitions", "passed"),
        ]
        for mode in ("delegate_mutbuf", "skip_mutbuf"):
            records += [
                _record(soc, "kv_cache", mode, "partitions", "failed", message=HOSTILE),
                _record(soc, "kv_cache", mode, "state", "passed"),
            ]
    environments = {
        soc: {
            "soc": soc,
            "executorch": "1.5.1",
            "torch": "2.13.0+cpu",
            "torchao": "0.18.0",
            "qnn_build_id": "v2.51.0.260929181845",
            "python": "3.11.7",
        }
        for soc in ("SM8650", "SM8750")
    }
    writer.write_run(records, environments, root / "reports", "run1", COLUMNS)
    return root / "reports" / "run1"


@pytest.mark.child_python
def test_one_issue_per_finding_with_a_script_that_runs(tmp_path):
    run = _run(tmp_path)
    completed = _cli("issues", run)
    assert completed.returncode == 0, completed.stderr
    written = sorted(p.name for p in (run / "issues").iterdir())
    assert written == ["F1.md", "F1.py", "new-partitions.md"], written  # two bundles, two SoCs: one F1 issue
    text = (run / "issues" / "F1.md").read_text()
    assert text.startswith("# [QNN] The delegated mutable buffer starts uninitialised\n")
    assert "| control | ` counter_add-fp16-skip_mutbuf-SM8650 ` | skip_mutbuf | passed |" in text
    assert "The same card passes with `skip_mutable_buffer=True`" in text
    assert "| 0 | 131008 | -Infinity | 8 |" in text.replace("\\-", "-")
    assert "` 1.5.1 `" in text and "` v2.51.0.260929181845 `" in text
    assert "(https://github.com/pytorch/executorch/blob/v1.5.1/backends/qualcomm/runtime/QnnManager.cpp)" in text
    assert "](docs/" not in text and "](../" not in text  # no link into this repository
    for soc in ("SM8650", "SM8750"):
        assert f"` {soc}/repro/counter_add-fp16-delegate_mutbuf-{soc}.tar.gz `" in text
    script = (run / "issues" / "F1.py").read_text()
    assert script in text  # the issue carries the script itself
    assert "register(" not in script and "harness" not in script and "UNUSED" not in script
    compile(script, "F1.py", "exec")
    eager = subprocess.run(
        [sys.executable, str(run / "issues" / "F1.py"), "--eager-only"], capture_output=True, text=True, timeout=120
    )
    assert eager.returncode == 0, eager.stderr
    assert "eager: 4 step(s), output shapes [(8,)]" in eager.stdout


def test_a_failure_no_entry_expects_is_its_own_finding_and_its_words_stay_text(tmp_path):
    run = _run(tmp_path)
    issues.write(run)
    text = (run / "issues" / "new-partitions.md").read_text()
    assert "The control fails too" in text
    span = "```` state differs <img src=x onerror=alert(1)> ``` [link](http://evil) @team ````"
    assert span in text  # in a code span its fence cannot close: shown as the characters it holds
    # the title is plain text (GitHub's title field shows no Markdown), without what would make HTML or a link
    assert "# [QNN] partitions fails: state differs img src=x onerror=alert(1) ``` [link] (http://evil) @team\n" in text
    assert "<img" not in text.replace(span, "")
    assert "](http://evil" not in text.replace(span, "")
    assert "Not analysed yet" in text and "No reproduction bundle" in text


def test_a_bundle_is_data_a_planted_card_path_or_link_is_not_read(tmp_path):
    run = _run(tmp_path)
    case_file = run / "SM8650" / "repro" / "counter_add-fp16-delegate_mutbuf-SM8650" / "case.json"
    case = json.loads(case_file.read_text())
    case["card"]["file"] = "../../../../../../etc/passwd"
    case_file.write_text(json.dumps(case))
    link = run / "SM8750" / "repro" / "counter_add-fp16-delegate_mutbuf-SM8750"
    os.rename(link, tmp_path / "moved")
    os.symlink(tmp_path / "moved", link)
    issues.write(run)
    text = (run / "issues" / "F1.md").read_text()
    assert not (run / "issues" / "F1.py").exists()
    assert "cannot be cut out of its module on its own" in text and "root:" not in text


def test_a_card_that_needs_the_suite_gets_no_script(tmp_path):
    source = CARD_MODULE.replace("ROWS = 8", "from harness.pipeline.sizes import ROWS")
    assert issues.card_code(source, "CounterAdd", "_counter_steps") is None
    assert issues.card_code(CARD_MODULE, "CounterAdd", "_counter_steps") is not None
    assert issues.card_code(CARD_MODULE, "Missing", "_counter_steps") is None


def test_issues_of_a_folder_without_reports_is_one_line(tmp_path):
    completed = _cli("issues", tmp_path)
    assert completed.returncode == 2 and completed.stderr.count("\n") == 1 and "no report.json" in completed.stderr


def test_finding_of_names_the_finding_and_not_a_pass():
    check = {"verdict": "xfailed", "known_failure": F1, "message": ""}
    assert issues.finding_of("state", check) == "F1"
    assert issues.finding_of("state", {**check, "verdict": "passed"}) is None
    assert issues.finding_of("state", {**check, "verdict": "xpassed"}) is None
    assert issues.finding_of("state", {"verdict": "failed", "known_failure": "", "signature": "x/../y"}) == (
        "new-state-xy"
    )


def test_a_manifest_entry_records_its_upstream_issue_and_the_issue_says_it_is_filed(tmp_path):
    from harness import checks, known_failures  # noqa: F401  checks: the signatures a manifest may name

    entry = '[[known_failure]]\npattern = "test_state[*]"\nsignature = "state_mismatch"\nreason = "r"\n'
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(entry + 'upstream = "https://github.com/pytorch/executorch/issues/12345"\n')
    bad.write_text(entry + 'upstream = "https://evil.example/pytorch/executorch/issues/1"\n')
    (loaded,) = known_failures.load(good)
    assert loaded.describe().endswith("[upstream: https://github.com/pytorch/executorch/issues/12345]")
    with pytest.raises(ValueError, match="not an upstream issue"):
        known_failures.load(bad)
    run = _run(tmp_path)
    report = run / "SM8650" / "report.json"
    document = json.loads(report.read_text())
    for case in document["cases"]:
        for check in case["checks"].values():
            if check["known_failure"]:
                check["known_failure"] += " [upstream: https://github.com/pytorch/executorch/issues/12345]"
    report.write_text(json.dumps(document))
    issues.write(run)
    text = (run / "issues" / "F1.md").read_text()
    assert "**Filed already**: https://github.com/pytorch/executorch/issues/12345 (" in text
    issues.write(_run(tmp_path / "again"))
    assert "Filed already" not in (tmp_path / "again" / "reports" / "run1" / "issues" / "F1.md").read_text()


# --- the output folder and file names, as attacks that fail -----------------------------------------------------


def test_a_symlinked_issues_folder_is_refused_and_nothing_is_written_through_it(tmp_path):
    run = _run(tmp_path)
    elsewhere = tmp_path / "on_sys_path"
    elsewhere.mkdir()
    (run / "issues").symlink_to(elsewhere)
    completed = _cli("issues", run)
    assert completed.returncode == 2 and completed.stderr.count("\n") == 1, completed.stderr
    assert "is a symlink" in completed.stderr and "--out" in completed.stderr
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_an_issues_folder_others_may_write_is_refused(tmp_path, mode):
    run = _run(tmp_path)
    (run / "issues").mkdir()
    os.chmod(run / "issues", mode)
    completed = _cli("issues", run)
    assert completed.returncode == 2 and "writable by others" in completed.stderr, completed.stderr
    assert list((run / "issues").iterdir()) == []


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another account needs root")
def test_an_issues_folder_of_another_account_is_refused(tmp_path):
    run = _run(tmp_path)
    (run / "issues").mkdir(mode=0o755)
    os.chown(run / "issues", 65534, 65534)
    completed = _cli("issues", run)
    assert completed.returncode == 2 and "belongs to uid 65534" in completed.stderr, completed.stderr
    assert list((run / "issues").iterdir()) == []


def test_a_planted_report_cannot_name_a_file(tmp_path):
    """A report whose known-failure words are `sitecustomize` (or a path) once named the script written for them:
    sitecustomize.py in a folder on sys.path runs in every later Python. File names come from F<n> ids only;
    any other finding is new-<check>[-<signature>] reduced to [a-z0-9_]."""
    run = _run(tmp_path)
    report = run / "SM8650" / "report.json"
    document = json.loads(report.read_text())
    for case in document["cases"]:
        for name, check in case["checks"].items():
            if check["known_failure"]:
                check["known_failure"] = "sitecustomize"
            if name == "partitions" and check["verdict"] == "failed":
                check["known_failure"] = "../../../../tmp/evil"
    report.write_text(json.dumps(document))
    issues.write(run)
    names = sorted(p.name for p in (run / "issues").iterdir())
    assert not [n for n in names if "sitecustomize" in n or "evil" in n], names
    assert all(issues.FILE_STEM.match(n.rsplit(".", 1)[0]) for n in names), names
    assert not (tmp_path / "evil.md").exists() and not Path("/tmp/evil.md").exists()


def test_a_planted_link_in_the_folder_is_replaced_not_written_through(tmp_path):
    run = _run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("unchanged")
    (run / "issues").mkdir(mode=0o700)
    (run / "issues" / "F1.py").symlink_to(victim)
    issues.write(run)
    assert victim.read_text() == "unchanged"
    assert not (run / "issues" / "F1.py").is_symlink() and "def main()" in (run / "issues" / "F1.py").read_text()


def test_a_night_without_bundles_says_so_and_how_to_get_them(tmp_path):
    run = _run(tmp_path)
    for soc in ("SM8650", "SM8750"):
        shutil.rmtree(run / soc / "repro")
    completed = _cli("issues", run)
    assert completed.returncode == 0, completed.stderr
    assert "2 reproduction bundle(s) the reports name are not in" in completed.stderr
    assert "--no-bundles" in completed.stderr and "python -m harness repro CASE_ID --run RUN" in completed.stderr
    text = (run / "issues" / "F1.md").read_text()
    assert "cannot be cut out" not in text and ".tar.gz" not in text
    assert "this folder holds none of the 2 reproduction bundle(s)" in text
    assert "` python -m harness repro counter_add-fp16-delegate_mutbuf-SM8650 --run RUN `" in text


def test_a_cards_recorded_arguments_become_literals_or_no_script():
    """A card built with functools.partial records its arguments (harness/repro/bundle.py); the script gets them
    back as literals or torch dtypes, re-printed, and anything else means no script (never code from a bundle)."""
    from functools import partial

    import torch

    from harness.repro.bundle import _call_arguments

    recorded = _call_arguments(partial(max, "index_copy", (3,), dtype=torch.int32))
    assert issues._arguments(recorded) == ("('index_copy', (3,), )", "{'dtype': torch.int32}")
    assert _call_arguments(partial(max, object())) is None
    for planted in ('__import__("os").system("id")', "torch.int32; import os", "torch.nn", "(1,) + (2,)"):
        assert issues._arguments({"args": [planted], "kwargs": {}}) is None, planted
    assert issues._arguments({"args": [], "kwargs": {"a b": "1"}}) is None


def test_a_script_exits_1_when_its_defect_shows_and_0_when_not(tmp_path, monkeypatch, capsys):
    """The script's verdict per kind of finding, on what a lowering and run would have seen (no QNN here); then
    main() end to end with the QNN part replaced: 1 with the defect, 0 without, 2 when it broke otherwise."""
    import importlib.util

    run = _run(tmp_path)
    issues.write(run)
    spec = importlib.util.spec_from_file_location("finding_script", run / "issues" / "F1.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    clean = {
        "error": "",
        "errors": [0.0],
        "bad_steps": [],
        "annotated": [],
        "encodings": {},
        "delegates": {"forward": 1},
    }
    shown = {
        "numbers": {"bad_steps": [0]},
        "error": {"error": "QnnError: 6004"},
        "annotation": {"annotated": ["count (input of aten.add_.Tensor)"]},
        "outside": {"outside": {"count"}},
        "partitions": {"delegates": {"forward": 2}},
        "encoding": {"encodings": {"prefill": {"count": (0.1, 0)}, "decode": {"count": (0.2, 0)}}},
    }
    for kind, seen in shown.items():
        monkeypatch.setattr(script, "DEFECT", kind)
        assert script.defect_shows({**clean, "outside": set(), **seen}), kind
        assert not script.defect_shows({**clean, "outside": set()}), kind
    monkeypatch.setattr(script, "DEFECT", "inside")
    assert script.defect_shows({**clean, "outside": set()}) and not script.defect_shows({**clean, "outside": {"count"}})
    monkeypatch.setattr(script, "DEFECT", "numbers")
    monkeypatch.setattr(sys, "argv", ["F1.py"])
    for failing, code, words in (
        ({"bad_steps": [0, 1]}, 1, "DEFECT SHOWS: outputs out of tolerance at steps [0, 1]"),
        ({}, 0, "defect does not show"),
        ({"error": "RuntimeError: no backend"}, 2, "could not tell"),
    ):
        monkeypatch.setattr(
            script,
            "observe",
            lambda s, e, skip, f=failing: {**clean, "outside": set(), **(f if skip == script.FAILING_SKIP else {})},
        )
        assert script.main() == code
        assert words in capsys.readouterr().out


def test_an_error_finding_shows_only_with_the_error_the_suite_recorded(tmp_path, monkeypatch):
    """A lowering failure's script says DEFECT SHOWS only for the error the check recorded (type and first words,
    digits aside): an SDK that does not come up, which breaks both modes alike, is not the finding."""
    import importlib.util

    run = _run(tmp_path)
    issues.write(run)
    spec = importlib.util.spec_from_file_location("finding_script", run / "issues" / "F1.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recorded = issues.recorded_error(
        "lowering failed: RuntimeError: Tried to erase Node getitem_1 but it still had 1 users in the graph"
    )
    assert recorded == ("RuntimeError", ["Tried", "to", "erase", "Node"])
    assert issues.recorded_error("state_mismatch at step 2") is None
    monkeypatch.setattr(script, "DEFECT", "error")
    monkeypatch.setattr(script, "RECORDED_ERROR", recorded)
    assert script.defect_shows({"error": "RuntimeError: Tried to erase Node getitem but it still had 2 users"})
    assert not script.defect_shows({"error": "RuntimeError: Failed to set up QNN SDK. To resolve, try one of"})
    assert not script.defect_shows({"error": "ValueError: Tried to erase Node getitem"})
    monkeypatch.setattr(script, "RECORDED_ERROR", None)
    assert script.defect_shows({"error": "QnnError: 6004"})
