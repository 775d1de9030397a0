"""Every finding the known-failures manifest expects gets a script from `issues`, and every script runs.

No suite run is needed to know what `issues` writes for a finding: its script is cut out of the card module a
bundle carries, with the settings case.json records (harness/repro/bundle.py card_record). So this test makes,
for each manifest entry that points at a FINDINGS.md section, one case its pattern matches (the registered
cards in the dtypes and modes the matrix runs them, on SM8650), a report whose check fails as the entry expects,
and a bundle as the suite writes it; then it runs `python -m harness.report issues` and EVERY generated
script with --eager-only (the eager part: torch only, no QNN). The full scripts, lowering on the HTP simulator,
are timed in docs/FILING.md (minutes each on a loaded host).
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  checks: registers the check specs
from harness import check_registry, known_failures
from harness.numerics import TOLERANCES
from harness.pipeline import card as cards
from harness.pipeline.cases import driver_matrix, matrix, meta_llama_matrix
from harness.record import CheckRecord
from harness.report.render import writer
from harness.repro.bundle import card_record
from harness.tests.report.test_history import _cli
from harness.vocabulary import DEFAULT_CARD_MODULES, DTYPES, Case

SOC = "SM8650"
STEPS = 4


def _cases() -> list[Case]:
    for module in DEFAULT_CARD_MODULES:
        cards.load_module(module)
    registered = cards.cards()
    return (
        matrix(registered, DTYPES, [SOC])
        + meta_llama_matrix(registered, DTYPES, [SOC])
        + driver_matrix(registered, DTYPES, [SOC])
    )


def _expected_failures() -> list[tuple[Case, str, known_failures.KnownFailure]]:
    """Per manifest entry that names a finding, the first case and check its pattern matches."""
    names = [spec.name for spec in check_registry.specs()]
    cases, found = _cases(), []
    for entry in known_failures.load():
        if not re.search(r"FINDINGS\.md#F[0-9]+", entry.reference):
            continue
        pattern = known_failures._literal_brackets(entry.pattern)
        match = next(
            (
                (case, name)
                for case in cases
                for name in names
                if fnmatch.fnmatchcase(f"test_{name}[{case.id}]", pattern)
            ),
            None,
        )
        assert match is not None, f"manifest entry {entry.pattern} matches no case of the registered cards"
        found.append((*match, entry))
    return found


def _bundle(soc_folder: Path, case: Case, check: str, entry: known_failures.KnownFailure) -> str:
    """The bundle's files `issues` reads: case.json and the card module, as harness/repro/bundle.py writes them."""
    folder = soc_folder / "repro" / case.id
    if not folder.exists():
        module_file = Path(sys.modules[case.card.module].__file__)
        (folder / "card").mkdir(parents=True)
        shutil.copyfile(module_file, folder / "card" / module_file.name)
        record = {
            "case_id": case.id,
            "dtype": case.dtype,
            "mode": case.mode.value,
            "soc": case.soc,
            "steps": STEPS,
            "skip_mutable_buffer": case.skip_mutable_buffer,
            "share_mutable_buffers": case.share_mutable_buffers,
            "plan": case.card.step_methods(STEPS) if case.card.multi_method else [],
            "driver": case.driver,
            "card": card_record(case.card, module_file.name),
            "tolerance": TOLERANCES.get(case.dtype),
            "environment": {"device_kind": "emulated", "device_config_bridge": True},
            "lowering": {"ok": True, "error": ""},
            "checks": {},
        }
        (folder / "case.json").write_text(json.dumps(record, default=str))
    finding, _, upstream = entry.reference.partition(";")
    case_file = folder / "case.json"
    record = json.loads(case_file.read_text())
    record["checks"][check] = {"finding": finding.strip(), "upstream": upstream.strip(), "signature": entry.signature}
    case_file.write_text(json.dumps(record))
    return f"repro/{case.id}"


def _run(root: Path) -> tuple[Path, set[str]]:
    records, findings = [], set()
    soc_folder = root / "run" / SOC
    for case, check, entry in _expected_failures():
        findings.add(re.search(r"FINDINGS\.md#(F[0-9]+)", entry.reference).group(1))
        described = entry.describe()
        records.append(
            CheckRecord.from_dict(
                {
                    "nodeid": f"suites/test_{check}.py::test_{check}[{case.id}]",
                    "check": check,
                    "case_id": case.id,
                    "card": case.card.name,
                    "tags": [],
                    "dtype": case.dtype,
                    "mode": case.mode.value,
                    "soc": SOC,
                    "verdict": "xfailed",
                    "message": described,
                    "known_failure": described,
                    "signature": entry.signature,
                    "repro": _bundle(soc_folder, case, check, entry),
                }
            )
        )
    environment = {
        "soc": SOC,
        "executorch": "1.5.1",
        "torch": "2.13.0+cpu",
        "torchao": "0.18.0",
        "python": "3.11.7",
        "qnn_build_id": "v2.51.0.260929181845",
        "emulated": True,
        "bridge": "on",
        "qnn_api": "2.40.0",
        "executorch_qnn_api": "2.27.0",
    }
    columns = [{"name": spec.name, "short": spec.name[:2]} for spec in check_registry.specs()]
    writer.write_run(records, {SOC: environment}, root, "run", columns)
    return root / "run", findings


@pytest.mark.child_python
def test_every_finding_of_the_manifest_gets_a_script_and_every_script_runs_eager_only(tmp_path):
    run, findings = _run(tmp_path)
    completed = _cli("issues", run)
    assert completed.returncode == 0, completed.stderr
    written = {path.stem for path in (run / "issues").glob("*.md")}
    assert written == findings, written ^ findings  # one issue per finding, nothing else
    scripts = sorted((run / "issues").glob("*.py"))
    missing = sorted(findings - {script.stem for script in scripts})
    assert not missing, f"no script for {missing}: their issue falls back to a bundle's repro.py"
    failed = []
    for script in scripts:
        eager = subprocess.run(
            [sys.executable, str(script), "--eager-only"], capture_output=True, text=True, timeout=600
        )
        if eager.returncode != 0 or not eager.stdout.startswith("eager: 4 step(s)"):
            failed.append(f"{script.name}: exit {eager.returncode}: {(eager.stderr or eager.stdout)[-600:]}")
    assert not failed, "\n".join(failed)
    multi = (run / "issues" / "F15.py").read_text()
    assert "METHODS = ['prefill', 'decode']" in multi and "PLAN = ['prefill', 'decode'" in multi
    text = (run / "issues" / "F1.md").read_text()
    assert "x86_64 HTP simulator" in text and "HTP device-config ABI bridge" in text
    assert "tested\nagainst QNN API 2.27.0" in text or "tested against QNN API 2.27.0" in text.replace("\n", " ")
    assert "blob/v1.5.1/backends/qualcomm/scripts/qnn_config.sh" in text
    assert "\\" not in text.splitlines()[0]  # the title is plain text
