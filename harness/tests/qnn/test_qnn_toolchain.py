"""The host QNN toolchain: SDK resolution and validation, the SoC table, the interposer and doctor.

Bad input must end in one line that names the problem and the fix; these tests pin that down.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.paths import REPO_ROOT
from harness.qnn import interposer, sdk, soc


def _one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text


def test_missing_sdk_path_is_one_clear_line(tmp_path):
    with pytest.raises(sdk.SdkError) as error:
        sdk.resolve(str(tmp_path / "absent"))
    message = _one_line(str(error.value))
    assert "does not exist" in message and "--qnn-sdk" in message


def test_sdk_without_libraries_names_each_missing_one(tmp_path):
    lib_dir = tmp_path / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libQnnHtp.so").write_bytes(b"")
    with pytest.raises(sdk.SdkError) as error:
        sdk.resolve(str(tmp_path))
    message = _one_line(str(error.value))
    assert "libQnnSystem.so" in message and "libHtpPrepare.so" in message and "libQnnHtp.so," not in message


def test_sdk_of_wrong_layout(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    with pytest.raises(sdk.SdkError) as error:
        sdk.resolve(None)
    assert "from QNN_SDK_ROOT" in _one_line(str(error.value)) and "x86_64-linux-clang" in str(error.value)


def test_overlay_stands_for_its_source(toolchain):
    """A child inherits the overlay as QNN_SDK_ROOT; resolving it must give back the real SDK."""
    again = sdk.resolve(str(toolchain.overlay_root))
    assert again.root == toolchain.sdk.root
    assert (toolchain.overlay_lib_dir / "libQnnHtp.so").resolve() == toolchain.interposer.resolve()
    assert (toolchain.overlay_lib_dir / interposer.REAL_LIBRARY_NAME).resolve() == toolchain.sdk.htp_library.resolve()


def test_soc_table_comes_from_executorch():
    assert soc.lookup("sm8650") == soc.Soc("SM8650", 57, 75, 8)
    assert soc.lookup("SM8750").htp_arch == 79


def test_unknown_soc_lists_known_ones():
    with pytest.raises(soc.UnknownSocError) as error:
        soc.lookup("SM0000")
    message = _one_line(str(error.value))
    assert "SM0000" in message and "SM8650" in message and "SM8750" in message


def test_interposer_compile_failure_is_one_line(tmp_path, monkeypatch):
    broken = tmp_path / "interposer.c"
    broken.write_text("this is not C;\n")
    monkeypatch.setattr(interposer, "SOURCE", broken)
    monkeypatch.setenv("QNNSUITE_HOME", str(tmp_path / "home"))
    with pytest.raises(interposer.InterposerBuildError) as error:
        interposer.build()
    assert "building the interposer" in _one_line(str(error.value))


def test_bridge_decision_was_measured(toolchain):
    """The bridge is on only because the backend failed to start without it (or off because it started)."""
    probe = toolchain.probe
    if probe.bridge_device_config:
        assert probe.without_bridge != "ok" and probe.with_bridge == "ok"
    else:
        assert probe.without_bridge == "ok"
    assert probe.build_id.startswith("v2.")


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", "doctor", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_doctor_reports_versions_and_bridge(toolchain):
    completed = _doctor()
    assert completed.returncode == 0, completed.stderr
    assert toolchain.probe.build_id in completed.stdout
    assert "bridge" in completed.stdout and "adb" in completed.stdout


def test_doctor_fails_with_one_line_for_bad_sdk(tmp_path):
    completed = _doctor("--qnn-sdk", str(tmp_path / "nowhere"))
    assert completed.returncode == 1
    problems = [line for line in completed.stderr.splitlines() if line.startswith("doctor:")]
    assert len(problems) == 1 and "does not exist" in problems[0]
