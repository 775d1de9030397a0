"""Known-failure entries scoped to executorch and QAIRT versions.

A scoped entry must apply inside its scope and vanish outside it, in both directions; a bad scope is
one line at load time; scopes never measure a version nobody asked for; the QAIRT release is read from
the library file, and a library without a build id is one clear line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the checks whose signatures the manifests name)
from harness import known_failures
from harness.known_failures import VersionsUnderTest
from harness.qnn import qairt

NAME = "test_state[kv_arange_init-fp16-delegate_mutbuf-SM8650]"


def _manifest(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "known_failures.toml"
    path.write_text(
        "\n".join(
            f'[[known_failure]]\npattern = "test_state[*]"\nsignature = "state_mismatch"\nreason = "r{i}"\n{extra}\n'
            for i, extra in enumerate(entries)
        )
    )
    known_failures.load.cache_clear()
    return path


def _reasons(path: Path, executorch: str | None = None, qnn: str | None = None) -> list[str]:
    return [entry.reason for entry in known_failures.matching(NAME, VersionsUnderTest(executorch, qnn), path)]


@pytest.mark.parametrize(
    ("executorch", "expected"), [("1.3.1", []), ("1.4.0", ["r0"]), ("1.5.1", ["r0"]), ("1.6.0.dev20261129", ["r0"])]
)
def test_executorch_scope_applies_inside_and_not_outside(tmp_path, executorch, expected):
    path = _manifest(tmp_path, 'executorch = ">=1.4"')
    assert _reasons(path, executorch=executorch) == expected


@pytest.mark.parametrize(
    ("build_id", "expected"),
    [
        ("v2.47.0.260601114230", ["r0"]),
        ("v2.50.40.260831140417", ["r0"]),
        ("v2.51.0.260929181845", []),
        ("v2.52.0.261101000000", []),
    ],
)
def test_qnn_scope_compares_the_qairt_release_not_the_build_stamp(tmp_path, build_id, expected):
    path = _manifest(tmp_path, 'qnn = "<2.51"')
    assert _reasons(path, qnn=build_id) == expected


def test_both_scopes_must_hold(tmp_path):
    path = _manifest(tmp_path, 'executorch = ">=1.5"\nqnn = ">=2.51"', "")
    assert _reasons(path, "1.5.1", "v2.51.0.1234567") == ["r0", "r1"]
    assert _reasons(path, "1.5.1", "v2.47.0.1234567") == ["r1"]
    assert _reasons(path, "1.4.1", "v2.51.0.1234567") == ["r1"]


class _Untouchable(VersionsUnderTest):
    def executorch(self):
        raise AssertionError("an unscoped manifest must not ask for the executorch version")

    def qnn(self):
        raise AssertionError("a manifest without qnn scopes must not read the QNN library")


def test_unscoped_entries_never_measure_versions(tmp_path):
    path = _manifest(tmp_path, "")
    assert [e.reason for e in known_failures.matching(NAME, _Untouchable(), path)] == ["r0"]


def test_executorch_scope_does_not_read_the_qnn_library(tmp_path):
    class OnlyExecutorch(_Untouchable):
        def executorch(self):
            return VersionsUnderTest("1.5.0").executorch()

    path = _manifest(tmp_path, 'executorch = "==1.5.0"')
    assert [e.reason for e in known_failures.matching(NAME, OnlyExecutorch(), path)] == ["r0"]


@pytest.mark.parametrize("scope", ['executorch = "1.4+"', 'qnn = "two fifty"', 'executorch = "=>1.4"'])
def test_bad_scope_is_one_line_naming_the_entry(tmp_path, scope):
    path = _manifest(tmp_path, scope)
    with pytest.raises(ValueError) as error:
        known_failures.load(path)
    message = str(error.value)
    assert "\n" not in message and "test_state[*]" in message and "specifier" in message


def test_the_real_manifest_loads_with_its_scopes():
    known_failures.load.cache_clear()
    entries = known_failures.load()
    assert entries and all(isinstance(entry.executorch, str) for entry in entries)


def test_qairt_build_id_is_read_from_the_library_file(tmp_path):
    library = tmp_path / "libQnnHtp.so"
    library.write_bytes(b"\x7fELF\0junk\0QNN v2.49.40.260810104044\0more v2.49 not a build id\0")
    assert qairt.build_id_of(library) == "v2.49.40.260810104044"
    assert str(qairt.release_of(qairt.build_id_of(library))) == "2.49.40"


@pytest.mark.parametrize("content", [b"\x7fELF no build id here v2.51", b"v2.47.0.260601114230 v2.51.0.260929181845"])
def test_library_without_exactly_one_build_id_is_one_clear_line(tmp_path, content):
    library = tmp_path / "libQnnHtp.so"
    library.write_bytes(content)
    with pytest.raises(qairt.QairtVersionError) as error:
        qairt.build_id_of(library)
    assert "\n" not in str(error.value) and str(library) in str(error.value)


def test_unknown_qairt_version_reaches_the_manifest_user_as_one_line(tmp_path, monkeypatch):
    lib_dir = tmp_path / "sdk" / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    for name in ("libQnnHtp.so", "libQnnSystem.so", "libHtpPrepare.so"):
        (lib_dir / name).write_bytes(b"not a QNN library")
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "sdk"))
    path = _manifest(tmp_path, 'qnn = "<2.51"')
    with pytest.raises(ValueError) as error:
        known_failures.matching(NAME, VersionsUnderTest(executorch="1.5.1"), path)
    assert "\n" not in str(error.value) and "QAIRT release is unknown" in str(error.value)


def test_qnn_scope_measured_from_qnn_sdk_root(tmp_path, monkeypatch):
    lib_dir = tmp_path / "sdk" / "lib" / "x86_64-linux-clang"
    lib_dir.mkdir(parents=True)
    (lib_dir / "libQnnHtp.so").write_bytes(b"\0v2.48.40.260702151143\0")
    for name in ("libQnnSystem.so", "libHtpPrepare.so"):
        (lib_dir / name).write_bytes(b"")
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "sdk"))
    path = _manifest(tmp_path, 'qnn = "<2.51"', 'qnn = ">=2.51"')
    assert [e.reason for e in known_failures.matching(NAME, VersionsUnderTest(executorch="1.5.1"), path)] == ["r0"]
