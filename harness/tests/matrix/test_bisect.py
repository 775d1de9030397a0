"""bisect finds the first release or wheel where a selection's verdicts change, through the matrix's own
combination runner; the per-release steps are faked at the Steps protocol (as the matrix's tests do), so
no release is downloaded: the fake writes, with the suite's report writer, a report whose verdict turns
at a version the test chooses (the injected change)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from harness.matrix import bisect
from harness.matrix.environments import MatrixSetupError, PythonEnv, QnnTree
from harness.matrix.layout import Combination
from harness.paths import REPO_ROOT
from harness.record import CheckRecord
from harness.report.render import writer

CASE = "counter_add-fp16-delegate_mutbuf-SM8650"
WHEELS = ("1.4.0", "1.4.1", "1.5.0", "1.5.1", "1.6.0.dev20261201")


class SwitchSteps:
    """state fails from `switch` on (the injected change); partitions from `also` on (a second change)."""

    def __init__(self, switch: str, also: str | None = None, broken: frozenset[str] = frozenset()) -> None:
        self.switch, self.also, self.broken = Version(switch), Version(also) if also else None, broken
        self.envs: list[tuple[str, Path | None]] = []

    def python_env(self, executorch: str) -> PythonEnv:
        if executorch in self.broken:
            raise MatrixSetupError(f"pip cannot install executorch=={executorch}: no matching distribution")
        self.envs.append((executorch, None))
        return PythonEnv(executorch, Path("/nonexistent"), reused=True)

    def qnn_tree(self, wheel: str) -> QnnTree:
        return QnnTree(wheel, Path("/nonexistent"), "v2.51.0.260929181845")

    def setup(self, env: PythonEnv, tree: QnnTree) -> str:
        return "on"

    def suite(self, env: PythonEnv, tree: QnnTree, combination: Combination, folder: Path) -> int:
        version = Version(env.executorch)
        verdicts = {
            "state": "failed" if version >= self.switch else "passed",
            "partitions": "failed" if self.also and version >= self.also else "passed",
            "export": "passed",
        }
        records = [
            CheckRecord.from_dict(
                {
                    "nodeid": f"suites/test_{check}.py::test_{check}[{CASE}]",
                    "check": check,
                    "case_id": CASE,
                    "card": "counter_add",
                    "tags": [],
                    "dtype": "fp16",
                    "mode": "delegate_mutbuf",
                    "soc": "SM8650",
                    "verdict": verdict,
                    "message": f"{check} differs from eager <b>" if verdict == "failed" else "",
                }
            )
            for check, verdict in verdicts.items()
        ]
        columns = [{"name": c, "short": c} for c in verdicts]
        writer.write_run(records, {"SM8650": {"soc": "SM8650", "executorch": env.executorch}}, folder, "run", columns)
        return 1 if "failed" in verdicts.values() else 0


def _wheels(folder: Path) -> Path:
    folder.mkdir()
    for version in WHEELS:
        (folder / f"executorch-{version}-cp311-cp311-linux_x86_64.whl").write_bytes(b"not a real wheel")
    (folder / "executorch-9.9.9-cp311-cp311-linux_x86_64.whl").symlink_to("/etc/passwd")  # a link: never a candidate
    return folder


def _bisect(tmp_path: Path, steps, *options: str) -> tuple[int, Path]:
    argv = [*options, "--report-root", str(tmp_path / "reports"), "--id", "t", "--", "-k", "counter_add"]
    return bisect.main(argv, steps=steps), tmp_path / "reports" / "bisect-t"


def test_bisect_over_wheels_finds_the_injected_change(tmp_path, capsys):
    wheels = _wheels(tmp_path / "wheels")
    steps = SwitchSteps("1.5.0")
    code, out = _bisect(tmp_path, steps, "--good", "1.4.0", "--bad", "1.6.0.dev20261201", "--wheels", str(wheels))
    assert code == 0, capsys.readouterr().err
    result = (out / "bisect.md").read_text()
    assert "first change in executorch-1.5.0-cp311-cp311-linux_x86_64.whl" in result
    assert "| SM8650 | counter_add-fp16-delegate_mutbuf-SM8650 | state | passed | failed | state differs" in result
    assert "&lt;b&gt;" not in result and "\\<b\\>" in result  # a message is Markdown text, not markup
    printed = capsys.readouterr().out
    assert f"  SM8650 {CASE} state: passed -> failed" in printed
    assert "last good executorch-1.4.1" in printed
    assert len(steps.envs) <= 4  # both ends and log2 of the three between
    assert [c.version for c in bisect.wheel_candidates(wheels, Version("1.4.0"), Version("1.6.0.dev20261201"))] == [
        *WHEELS
    ]


def test_the_wheel_reaches_the_environment(tmp_path, monkeypatch):
    wheels = _wheels(tmp_path / "wheels")
    seen = {}

    def fake_venv(executorch, home, wheel=None):
        seen[executorch] = wheel
        raise MatrixSetupError("stop here")

    steps = bisect.BisectSteps({"1.5.0": wheels / "executorch-1.5.0-cp311-cp311-linux_x86_64.whl"}, tmp_path)
    monkeypatch.setattr(bisect, "ensure_venv", fake_venv)
    with pytest.raises(MatrixSetupError):
        steps.python_env("1.5.0")
    assert seen["1.5.0"].name == "executorch-1.5.0-cp311-cp311-linux_x86_64.whl"


def test_a_candidate_that_cannot_run_is_skipped_and_a_mix_is_named(tmp_path):
    steps = SwitchSteps("1.5.0", also="1.5.1", broken=frozenset({"1.4.1"}))
    code, out = _bisect(
        tmp_path, steps, "--good", "1.4.0", "--bad", "1.6.0", "--releases", "1.4.0,1.4.1,1.5.0,1.5.1,1.6.0"
    )
    assert code == 0
    result = (out / "bisect.md").read_text()
    assert (
        "first change in executorch 1.5.0" in result and "| executorch 1.4.1 | skipped | pip cannot install" in result
    )
    assert "| executorch 1.5.0 | changed |" in result  # state changed there, partitions only later


def test_the_same_verdicts_at_both_ends_is_one_line(tmp_path, capsys):
    code, _ = _bisect(tmp_path, SwitchSteps("2.0"), "--good", "1.4.0", "--bad", "1.5.0", "--releases", "1.4.0,1.5.0")
    error = capsys.readouterr().err
    assert code == 1 and error.count("\n") == 1 and "give the same verdicts" in error


@pytest.mark.parametrize(
    "options, words",
    [
        (("--good", "1.5.0", "--bad", "1.4.0", "--releases", "1.4.0,1.5.0"), "is not before --bad"),
        (("--good", "1.4.0", "--bad", "1.5.0", "--wheels", "nowhere"), "is not a folder"),
        (("--good", "1.3.0", "--bad", "1.5.0", "--wheels", "WHEELS"), "must hold the wheels of --good 1.3.0"),
        (("--good", "one", "--bad", "1.5.0", "--releases", "1.4.0"), "is not a version"),
    ],
)
def test_bad_arguments_are_one_line(tmp_path, capsys, options, words):
    wheels = _wheels(tmp_path / "wheels")
    options = tuple(str(wheels) if o == "WHEELS" else str(tmp_path / o) if o == "nowhere" else o for o in options)
    code, _ = _bisect(tmp_path, SwitchSteps("1.5.0"), *options)
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and words in error, error


def test_a_wheels_requirement_is_the_file_and_its_venv_its_own(tmp_path):
    from harness.matrix.environments import requirements_for

    wheel = tmp_path / "executorch-1.5.0-cp311-cp311-linux_x86_64.whl"
    assert requirements_for("1.5.0", wheel=wheel)[-2] == f"executorch @ {wheel.resolve().as_uri()}"
    assert requirements_for("1.5.0")[-2] == "executorch==1.5.0"  # the release, as the matrix has it


def test_harness_help_lists_every_subcommand_bisect_and_matrix_included():
    completed = subprocess.run(
        [sys.executable, "-m", "harness", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    listed = completed.stdout.split("positional arguments:")[1]
    for command in ("matrix", "bisect", "setup", "doctor", "repro", "emulate"):
        assert f"\n    {command} " in listed, command
