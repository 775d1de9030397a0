"""A bundle's repro.py runs only the modules whose sha256 suite/manifest.json records."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the checks the bundle carries)
from harness.repro import bundle, standalone

CARD = Path(__file__).resolve().parents[3] / "fixtures" / "zoo.py"


def _bundle(tmp_path: Path, reference: str) -> Path:
    """What repro.py needs to import the suite: itself, case.json, card/ and suite/ with the manifest, as
    the suite writes them; and a QNN SDK stand-in (only its host library's presence is looked at first)."""
    folder = tmp_path / "bundle"
    for directory in ("card", "suite"):
        (folder / directory).mkdir(parents=True)
    shutil.copyfile(standalone.__file__, folder / "repro.py")
    shutil.copyfile(CARD, folder / "card" / CARD.name)
    bundle._write_suite(folder, "fixtures.zoo", CARD)
    (folder / "case.json").write_text(json.dumps({"card": {"module": "fixtures.zoo", "reference": reference}}))
    library = tmp_path / "sdk" / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    return folder


def _repro(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(folder / "repro.py"), "--qnn-sdk", str(tmp_path / "sdk"), "--out", str(tmp_path / "out")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_tampered_module_is_refused_before_it_runs(tmp_path):
    """The attack: a bundle passed around (a CI artifact, an issue attachment) gets one carried module
    changed; repro.py imported it as it was. Now the module's sha256 must be the manifest's: one line,
    exit 2, and the added code never ran."""
    folder = _bundle(tmp_path, "fixtures.zoo:no_such_card")
    marker = tmp_path / "ran"
    with (folder / "suite" / "harness.vocabulary.py").open("a") as module:
        module.write(f"\nopen({str(marker)!r}, 'w').write('tampered')\n")
    completed = _repro(folder, tmp_path)
    assert completed.returncode == 2, completed.stderr
    (line,) = completed.stderr.strip().splitlines()
    assert "suite/harness.vocabulary.py is not the module the run carried" in line and "could not run" in line
    assert not marker.exists()


@pytest.mark.child_python
def test_an_intact_bundle_gets_past_the_check(tmp_path):
    """The counterpart: the same bundle untouched imports every carried module; it stops later, at the card
    its case.json names (made up here, so that nothing is lowered), never at a sha256."""
    folder = _bundle(tmp_path, "fixtures.zoo:no_such_card")
    completed = _repro(folder, tmp_path)
    assert completed.returncode == 2 and "sha256" not in completed.stderr, completed.stderr
    assert "no_such_card" in completed.stderr


def test_a_manifest_without_a_digest_is_refused(tmp_path, monkeypatch):
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    monkeypatch.setattr(standalone, "BUNDLE", tmp_path)
    with pytest.raises(standalone.ReproError, match="records no sha256"):
        standalone.manifest_modules({"modules": {"m": {"file": "m.py"}}})
    digest = hashlib.sha256(module.read_bytes()).hexdigest()
    assert standalone.manifest_modules({"modules": {"m": {"file": "m.py", "sha256": digest}}}) == {
        "m": (module.resolve(), digest)
    }
    assert standalone.carried_source(module, digest) == b"x = 1\n"
    with pytest.raises(standalone.ReproError, match="not the module the run carried"):
        standalone.carried_source(module, "0" * 64)
