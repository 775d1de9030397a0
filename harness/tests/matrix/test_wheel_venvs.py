"""`bisect --wheels`: a venv belongs to a wheel's content, never to the path it was found at."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.matrix import environments


def _fake_tools(monkeypatch) -> list[list[str]]:
    """venv and pip stand-ins: `-m venv ROOT` makes ROOT/bin/python, pip succeeds; no real install."""
    calls: list[list[str]] = []

    def run(argv, **_):
        calls.append(list(argv))
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
            (Path(argv[3]) / "bin" / "python").write_text("")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(environments.subprocess, "run", run)
    return calls


def test_two_different_wheels_at_one_path_get_two_venvs(tmp_path, monkeypatch):
    """The attack: bisect made a venv for the wheel at DIR/executorch-1.5.1-...whl; another file put at that
    path (a rebuilt or a planted wheel) was served that venv, so its verdicts were the first wheel's."""
    calls = _fake_tools(monkeypatch)
    wheel = tmp_path / "wheels" / "executorch-1.5.1-cp312-cp312-linux_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"first build")
    first = environments.ensure_venv("1.5.1", tmp_path / "home", wheel=wheel)
    wheel.write_bytes(b"second build, same path")
    second = environments.ensure_venv("1.5.1", tmp_path / "home", wheel=wheel)
    assert first.root != second.root and not second.reused
    installs = [argv for argv in calls if "pip" in argv]
    assert len(installs) == 2
    again = environments.ensure_venv("1.5.1", tmp_path / "home", wheel=wheel)
    assert again.root == second.root and again.reused, "the same content reuses its venv"


def test_pip_installs_the_copy_that_was_hashed(tmp_path, monkeypatch):
    """The file pip reads is the hashed copy under the matrix's home, so a swap of the original after the
    hash cannot slip another wheel into the venv."""
    _fake_tools(monkeypatch)
    wheel = tmp_path / "executorch-1.5.1-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"the wheel")
    env = environments.ensure_venv("1.5.1", tmp_path / "home", wheel=wheel)
    listing = (env.root / ".matrix-requirements.txt").read_text()
    kept, digest = environments.kept_wheel(wheel, tmp_path / "home")
    assert kept.as_uri() in listing and str(wheel.as_uri()) not in listing
    assert kept.read_bytes() == b"the wheel" and digest[:16] in env.root.name
