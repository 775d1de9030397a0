"""The suite's runner for phones: --executorch-android-build is checked at the start with one
line naming what it lacks; with a stand-in NDK (harness/emulator/phone.py write_ndk: the host compilers, as the
emulated phones run host binaries) the same suite_runner.cpp is built against the build folder, cached by
content, and a phone's payload carries it as `suite_runner` with the build's shared libraries."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from harness import options
from harness.device import kinds
from harness.device.device import DeviceError
from harness.device.payload import BACKEND_LIBRARY, SUITE_RUNNER_NAME
from harness.emulator import phone
from harness.runner import build as runner_build
from harness.tests.device.test_phone_payload import _build, _sdk, _touch, upstream_files
from harness.tests.emulator import test_phone_path as phone_path
from harness.tests.emulator.test_phone_path import SOCS, _context, _outcomes, _payload, _suite

served, cache = phone_path.served, phone_path.cache  # the emulated phones of the phone-path test, and its cache
X86_64_ELF = b"\x7fELF\x02\x01\x01" + bytes(11) + (62).to_bytes(2, "little") + bytes(44)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> tuple[Path, Path]:
    """A stand-in NDK and the build folder emulate --write-build makes (the host executorch's headers and
    libraries in an install tree)."""
    folder = tmp_path_factory.mktemp("android")
    return phone.write_ndk(folder / "ndk"), phone.write_build(folder / "build").parents[3]


def test_a_build_folder_without_headers_or_libraries_is_one_line_naming_each(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libexecutorch.a").write_bytes(b"!<arch>\n")
    with pytest.raises(runner_build.RunnerBuildError) as error:
        runner_build.check_android_build(tmp_path)
    line = str(error.value)
    assert "\n" not in line and line.startswith(f"--executorch-android-build {tmp_path} lacks the headers (")
    assert "include/executorch/extension/module/module.h" in line
    assert "executorch_backend_qnn (" in line and "libqnn_executorch_backend.so" in line
    assert "executorch (" not in line.replace("executorch_", ""), "libexecutorch.a is there: not named missing"
    assert line.endswith("(cmake --install, with EXECUTORCH_BUILD_QNN=ON and the module extension)")


def test_the_option_is_a_usage_error_without_an_ndk_or_with_a_bad_folder(tmp_path, stand_in):
    ndk, build = stand_in
    with pytest.raises(pytest.UsageError, match=r"needs an NDK .*: add --android-ndk PATH"):
        options._executorch_android_build(str(build), None)
    with pytest.raises(pytest.UsageError, match=r"is not a folder: pass the folder your executorch Android build"):
        options._executorch_android_build(str(tmp_path / "nowhere"), ndk)
    with pytest.raises(pytest.UsageError, match=r"lacks the headers"):
        options._executorch_android_build(str(tmp_path), ndk)
    assert options._executorch_android_build(str(build), ndk) == build.resolve()


@pytest.mark.build
def test_the_stand_in_ndk_builds_the_runner_once(stand_in):
    ndk, build = stand_in
    built = kinds.build_android_runner(ndk, build)
    assert built.binary.is_file() and os.access(built.binary, os.X_OK)
    assert built.binary.parent.parent.name == runner_build.ANDROID_CACHE_FOLDER
    host = built.binary.with_name(built.binary.read_text().split()[-2].rsplit("/", 1)[-1])
    assert host.read_bytes()[:4] == b"\x7fELF", "the stand-in compiled the real source with the host g++"
    names = {path.name for path in built.libraries}
    assert {"libexecutorch.so", "libexecutorch_backend_qnn.so", "libexecutorch_threadpool.so"} <= names
    modified = built.binary.stat().st_mtime_ns
    assert kinds.build_android_runner(ndk, build) == built and built.binary.stat().st_mtime_ns == modified


def test_a_failing_compiler_is_one_line(tmp_path, stand_in):
    _, build = stand_in
    ndk = phone.write_ndk(tmp_path / "ndk")
    clangxx = next((ndk / "toolchains").rglob("*-clang++"))
    clangxx.write_text('#!/bin/sh\necho "fatal error: module.h: no such API" >&2\nexit 1\n')
    with pytest.raises(DeviceError) as error:
        kinds.build_android_runner(ndk, build)
    assert "\n" not in str(error.value) and "fatal error: module.h: no such API" in str(error.value)
    assert str(error.value).startswith("building the suite's runner for Android with ")


@pytest.mark.build
def test_a_phone_payload_carries_the_suite_runner_and_its_libraries(tmp_path, stand_in):
    ndk, build = stand_in
    runner, sdk = _build(tmp_path / "user-build"), _sdk(tmp_path / "sdk", 75)
    given = kinds.payload_inputs(sdk, runner, None, ndk, build)
    files = {item.remote_name: item for item in kinds.of("phone").payload("arm64-v8a", 75, given)}
    built = kinds.build_android_runner(ndk, build)
    assert files[SUITE_RUNNER_NAME].local == built.binary and files[SUITE_RUNNER_NAME].mode == 0o755
    libraries = {path.name for path in built.libraries} - {BACKEND_LIBRARY}
    assert set(files) == upstream_files(75) | {"libQnnHtp.real.so", SUITE_RUNNER_NAME} | libraries
    without = kinds.payload_inputs(sdk, runner, None, ndk)
    assert SUITE_RUNNER_NAME not in {i.remote_name for i in kinds.of("phone").payload("arm64-v8a", 75, without)}


def test_a_suite_runner_for_another_abi_is_refused(tmp_path):
    runner, sdk = _build(tmp_path / "build"), _sdk(tmp_path / "sdk", 75)
    elf = tmp_path / "suite_runner"
    elf.write_bytes(X86_64_ELF)
    given = kinds.PayloadInputs(sdk, runner, android_runner=runner_build.AndroidRunner(elf, ()))
    with pytest.raises(DeviceError, match=r"is built for x86_64 but the device is arm64-v8a: pass an NDK"):
        kinds.of("phone").payload("arm64-v8a", 75, given)


def test_a_build_error_at_the_start_is_a_device_error_line(tmp_path, stand_in):
    ndk, _ = stand_in
    runner, sdk = _build(tmp_path / "build"), _sdk(tmp_path / "sdk", 75)
    _touch(tmp_path / "empty" / "lib" / "libnothing.so")
    with pytest.raises(DeviceError, match=r"--executorch-android-build .* lacks the headers"):
        kinds.payload_inputs(sdk, runner, None, ndk, tmp_path / "empty")


@pytest.mark.child_suite
@pytest.mark.qnn
def test_emulated_phones_run_the_android_build_and_agree_with_the_users_runner(served, tmp_path, cache):
    """The user's command with a (stand-in) NDK and the build folder: the phones get the suite's runner as
    `suite_runner`, run the case through it (its record's timing says so) and runner_parity compares it with
    the user's qnn_executor_runner on the same phone, bit-equal."""
    ndk = phone.write_ndk(tmp_path / "ndk")
    build = served.runner.parents[3]  # what emulate --write-build wrote
    completed, junit = _suite(
        served,
        tmp_path,
        cache,
        "--android-ndk",
        str(ndk),
        "--executorch-android-build",
        str(build),
        "-k",
        "kv_pair_gather_written and delegate_mutbuf and (runner_parity or test_state)",
    )
    output = completed.stdout[-4000:] + completed.stderr[-2000:]
    outcomes = _outcomes(junit)
    parity = {name: kind for name, (kind, _) in outcomes.items() if name.startswith("test_runner_parity")}
    assert sorted(parity.values()) == ["passed"] * len(SOCS), output
    assert completed.returncode == 0, output
    built = hashlib.sha256(kinds.build_android_runner(ndk, build).binary.read_bytes()).hexdigest()
    context = _context(tmp_path / "reports")
    for soc in SOCS:
        assert _payload(served, context, soc)[SUITE_RUNNER_NAME] == built, "the built runner is what phones run"
        document = json.loads((tmp_path / "reports" / "latest" / soc / "report.json").read_text())
        (case,) = document["cases"]
        assert case["timing"]["runner"] == SUITE_RUNNER_NAME and len(case["timing"]["steps_us"]) >= 1, case
        evidence = case["checks"]["runner_parity"]
        assert evidence["verdict"] == "passed", evidence


# A user's qnn_executor_runner that runs like the emulated one, then changes one output element of step 2:
# a reference runner whose outputs differ, on the real device path.
PERTURBING_RUNNER = """#!/bin/sh
# test runner: the emulated phone's qnn_executor_runner, then step 2's first output element changed
"${QNNSUITE_PYTHON:?emulated phones only}" -m harness.emulator.runner_client "$@" || exit $?
exec "$QNNSUITE_PYTHON" -c "
import numpy as np
import os
path = 'outputs/output_2_0.raw'
if os.path.exists(path):  # a plan of three steps or more (the health check's has fewer)
    values = np.fromfile(path, dtype=np.float32)
    values[0] += 1.0
    values.tofile(path)
"
"""


@pytest.mark.child_suite
@pytest.mark.qnn
def test_runner_parity_names_the_step_output_and_runners_where_the_reference_differs(served, tmp_path, cache):
    """The same run with a user's runner that changes one element of step 2: runner_parity fails with its
    own signature and names step 2, output 0, the difference of 1 and both runners; the state check, which
    reads the suite's runner, still passes."""
    ndk = phone.write_ndk(tmp_path / "ndk")
    build = served.runner.parents[3]
    runner = tmp_path / "user" / "qnn_executor_runner"
    runner.parent.mkdir()
    runner.write_text(PERTURBING_RUNNER)
    runner.chmod(0o755)
    completed, junit = _suite(
        dataclasses.replace(served, runner=runner),
        tmp_path,
        cache,
        "--backend-lib",
        str(build / "backends" / "qualcomm" / BACKEND_LIBRARY),
        "--android-ndk",
        str(ndk),
        "--executorch-android-build",
        str(build),
        "--soc",
        "SM8650",
        "-k",
        "kv_pair_gather_written and delegate_mutbuf and (runner_parity or test_state)",
    )
    output = completed.stdout[-4000:] + completed.stderr[-2000:]
    outcomes = _outcomes(junit)
    (parity,) = [value for name, value in outcomes.items() if name.startswith("test_runner_parity")]
    assert parity[0] == "failed", output
    assert "[signature: runner_outputs_differ]" in parity[1] or "runner_outputs_differ" in parity[1], parity
    assert "step 2 output 0: suite_runner (compiled, on " in parity[1], parity
    assert "qnn_executor_runner (reference, on " in parity[1] and "max abs difference 1 " in parity[1], parity
    state = [kind for name, (kind, _) in outcomes.items() if name.startswith("test_state[")]
    assert state == ["passed"], output


def test_an_ndk_without_clang_is_one_line(tmp_path, stand_in):
    _, build = stand_in
    (tmp_path / "ndk").mkdir()
    with pytest.raises(DeviceError, match=r"has no .*aarch64-linux-android<API>-clang for API 30 or newer .*: pass"):
        kinds.build_android_runner(tmp_path / "ndk", build)
