"""The phone's side of a run without a phone: what is pushed from a standard executorch build folder and a
QNN SDK (upstream's list), one start-up error naming every missing file, SoC detection over the
properties real phones report (a fake device object: no adb), and the pieces of an emulated phone
(its properties, its loader, the NDK build, the keys it trusts on the user's server)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import adbutils
import pytest

from harness.device import kinds
from harness.device.device import SOC_MACHINE_FILE, DeviceError, detect_soc
from harness.device.payload import BACKEND_LIBRARY, RUNNER_NAME
from harness.emulator import adb_auth
from harness.emulator.launcher import device_properties
from harness.emulator.phone_runtime import PHONE_ENV, REAL_LIBRARY_ENV, NoQnnLibrary, runner_environment
from harness.qnn import interposer
from harness.qnn.sdk import QnnSdk

# Upstream's push list for HTP (SimpleADB.push in executorch's backends/qualcomm/export_utils.py), less the .pte.
UPSTREAM_HTP_FILES = {
    RUNNER_NAME,
    "libQnnHtp.so",
    "libQnnHtpV{arch}Stub.so",
    "libQnnHtpV{arch}Skel.so",
    "libQnnHtpPrepare.so",
    "libQnnSystem.so",
    BACKEND_LIBRARY,
}


def upstream_files(arch: int) -> set[str]:
    return {name.format(arch=arch) for name in UPSTREAM_HTP_FILES}


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"#!/bin/sh\n")
    return path


def _sdk(root: Path, *archs: int) -> QnnSdk:
    for arch in archs:
        for name in ("libQnnHtp.so", f"libQnnHtpV{arch}Stub.so", "libQnnHtpPrepare.so", "libQnnSystem.so"):
            _touch(root / "lib" / "aarch64-android" / name)
        _touch(root / "lib" / f"hexagon-v{arch}" / "unsigned" / f"libQnnHtpV{arch}Skel.so")
    return QnnSdk(root, "--qnn-sdk")


def _build(root: Path, backend: bool = True) -> Path:
    runner = _touch(root / "examples" / "qualcomm" / "executor_runner" / RUNNER_NAME)
    if backend:
        _touch(root / "backends" / "qualcomm" / BACKEND_LIBRARY)
    return runner


def test_a_standard_build_folder_pushes_upstreams_list(tmp_path):
    runner, sdk = _build(tmp_path / "build"), _sdk(tmp_path / "sdk", 75)
    files = kinds.of("phone").payload("arm64-v8a", 75, kinds.PayloadInputs(sdk, runner))
    assert {item.remote_name for item in files} == upstream_files(75)
    backend = next(item.local for item in files if item.remote_name == BACKEND_LIBRARY)
    assert backend == tmp_path / "build" / "backends" / "qualcomm" / BACKEND_LIBRARY


def test_backend_library_beside_the_runner_and_backend_lib_override(tmp_path):
    runner, sdk = _build(tmp_path / "build"), _sdk(tmp_path / "sdk", 75)
    beside = _touch(runner.parent / BACKEND_LIBRARY)
    chosen = {
        i.remote_name: i.local for i in kinds.of("phone").payload("arm64-v8a", 75, kinds.PayloadInputs(sdk, runner))
    }
    assert chosen[BACKEND_LIBRARY] == beside
    override = _touch(tmp_path / "elsewhere" / "my_backend.so")
    given = kinds.PayloadInputs(sdk, runner, backend_lib=override)
    chosen = {i.remote_name: i.local for i in kinds.of("phone").payload("arm64-v8a", 75, given)}
    assert chosen[BACKEND_LIBRARY] == override, "--backend-lib wins, pushed under the name the runner loads"


def test_the_trace_interposer_goes_in_front_of_libqnnhtp(tmp_path):
    runner, sdk = _build(tmp_path / "build"), _sdk(tmp_path / "sdk", 79)
    interposer = _touch(tmp_path / "android-interposer" / "libQnnHtp.so")
    files = {
        i.remote_name: i.local
        for i in kinds.of("phone").payload(
            "arm64-v8a", 79, kinds.PayloadInputs(sdk, runner, trace_interposer=interposer)
        )
    }
    assert set(files) == upstream_files(79) | {"libQnnHtp.real.so"}
    assert (
        files["libQnnHtp.so"] == interposer
        and files["libQnnHtp.real.so"] == sdk.root / "lib/aarch64-android/libQnnHtp.so"
    )


def test_missing_files_are_one_error_at_start_naming_every_one(tmp_path):
    runner, sdk = _build(tmp_path / "build", backend=False), _sdk(tmp_path / "sdk", 75)  # no v79 libraries either
    devices = [
        ("phone", "arm64-v8a", 75),
        ("phone", "arm64-v8a", 79),
        ("phone", "arm64-v8a", 79),
        ("emulated", "x86_64", 73),
    ]
    with pytest.raises(DeviceError) as error:
        kinds.check_payloads(devices, kinds.PayloadInputs(sdk, runner))
    message = str(error.value)
    assert "\n" not in message and message.count(BACKEND_LIBRARY) >= 2  # where it was looked for, and the fix
    for missing in (
        "libQnnHtpV79Stub.so",
        "hexagon-v79/unsigned/libQnnHtpV79Skel.so",
        "build/backends/qualcomm/" + BACKEND_LIBRARY,
        "executor_runner/" + BACKEND_LIBRARY,
    ):
        assert missing in message
    assert "V75" not in message and "--backend-lib PATH" in message
    kinds.check_payloads(devices[:1], kinds.PayloadInputs(sdk, runner, backend_lib=_touch(tmp_path / "b.so")))
    kinds.check_payloads([("emulated", "x86_64", 73)], kinds.PayloadInputs(sdk, None))


class FakeDevice:
    """What SoC detection reads from a device: its properties and one kernel file."""

    def __init__(self, serial: str = "fake", machine: str = "", **props: str) -> None:
        self.serial, self.machine = serial, machine
        self.props = {name.replace("_", "."): value for name, value in props.items()}

    def getprop(self, name: str) -> str:
        return self.props.get(name, "")

    def read_text(self, path: str) -> str:
        assert path == SOC_MACHINE_FILE
        return self.machine


# Property sets as the phones report them (ro.soc.model from Android 12 on; older builds only the platform).
REAL_PHONES = [
    ("SM8350", FakeDevice(ro_board_platform="lahaina", ro_hardware="qcom")),  # Android 11, Snapdragon 888
    ("SM8450", FakeDevice(ro_soc_model="SM8450", ro_board_platform="taro", ro_hardware="qcom")),
    ("SM8475", FakeDevice(ro_soc_model="SM8475", ro_board_platform="taro", ro_hardware="qcom")),
    ("SM8475", FakeDevice(ro_board_platform="taro", machine="SM8475")),  # taro alone is not enough
    ("SM8550", FakeDevice(ro_soc_model="SM8550", ro_board_platform="kalama")),
    ("SM8550", FakeDevice(ro_hardware_chipname="SM8550", ro_board_platform="kalama")),
    ("SM8650", FakeDevice(ro_soc_model="SM8650-AB", ro_board_platform="pineapple")),
    ("SM8650", FakeDevice(ro_soc_model="sm8650", ro_hardware="qcom")),
    ("SM8650", FakeDevice(ro_board_platform="pineapple")),
    ("SM8750", FakeDevice(ro_soc_model="SM8750P", ro_board_platform="sun")),
    ("SM8750", FakeDevice(ro_hardware="sun")),
    ("SM8850", FakeDevice(ro_board_platform="canoe")),
    ("SM8850", FakeDevice(ro_soc_model="Tensor", machine="SM8850")),  # a value naming nothing: on to the next
    ("SM8650", FakeDevice(machine="PINEAPPLE")),
]


@pytest.mark.parametrize("expected, device", REAL_PHONES, ids=[f"{soc}-{i}" for i, (soc, _) in enumerate(REAL_PHONES)])
def test_soc_detection_over_real_phones_properties(expected, device):
    assert detect_soc(device) == expected


def test_soc_detection_says_what_it_read_when_nothing_matches():
    with pytest.raises(DeviceError) as error:
        detect_soc(FakeDevice("R5CT", ro_soc_model="Tensor G3", ro_board_platform="taro", ro_hardware="qcom"))
    message = str(error.value)
    assert "\n" not in message and message.startswith("device R5CT: cannot tell its SoC")
    for read in (
        "ro.soc.model='Tensor G3'",
        "ro.hardware.chipname=''",
        "ro.board.platform='taro'",
        "ro.hardware='qcom'",
        f"{SOC_MACHINE_FILE}=''",
    ):
        assert read in message


def test_emulated_phones_show_their_soc_only_as_phones_do():
    """At least one of three emulated phones has no ro.soc.model; detection finds every one's SoC."""
    shown = [
        device_properties(soc, soc.lower(), as_phone=True, index=i)
        for i, soc in enumerate(("SM8650", "SM8750", "SM8550"))
    ]
    assert [p["ro.product.cpu.abi"] for p in shown] == ["arm64-v8a"] * 3
    assert sum("ro.soc.model" not in p for p in shown) >= 2
    for soc, props in zip(("SM8650", "SM8750", "SM8550"), shown):
        assert detect_soc(FakeDevice(**{k.replace(".", "_"): v for k, v in props.items()})) == soc
    assert device_properties("SM8650", "x")["ro.product.cpu.abi"] == "x86_64"


def test_the_emulated_phone_loads_the_first_pushed_libqnnhtp(tmp_path):
    pushed = _touch(tmp_path / "payload" / "libQnnHtp.so").parent
    env = runner_environment({PHONE_ENV: "/bridge", "LD_LIBRARY_PATH": f"{tmp_path / 'empty'}:{pushed}:/system/lib64"})
    assert env["LD_LIBRARY_PATH"] == f"/bridge:{tmp_path / 'empty'}:{pushed}:/system/lib64"
    assert env[REAL_LIBRARY_ENV] == str(pushed / "libQnnHtp.so")
    with pytest.raises(NoQnnLibrary, match="cannot load libQnnHtp.so: it is in none of LD_LIBRARY_PATH="):
        runner_environment({PHONE_ENV: "/bridge", "LD_LIBRARY_PATH": str(tmp_path / "empty")})


def test_an_ndk_without_a_usable_clang_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("QNNSUITE_HOME", str(tmp_path / "home"))
    with pytest.raises(
        interposer.InterposerBuildError, match=r"has no .*aarch64-linux-android<API>-clang .*\(none is there\)"
    ):
        interposer.build_for_android(tmp_path / "empty-ndk")
    old = _touch(tmp_path / "ndk" / interposer.NDK_CLANG_DIR / "aarch64-linux-android21-clang")
    with pytest.raises(
        interposer.InterposerBuildError, match=r"it has API levels 21\): pass the root of an Android NDK"
    ):
        interposer.build_for_android(tmp_path / "ndk")
    broken = old.with_name(f"aarch64-linux-android{interposer.MIN_ANDROID_API}-clang")
    broken.write_text("#!/bin/sh\necho 'error: no target' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(interposer.InterposerBuildError) as error:
        interposer.build_for_android(tmp_path / "ndk")
    assert "\n" not in str(error.value) and str(error.value).endswith("failed: error: no target")
    assert interposer.android_clang(tmp_path / "ndk") == broken


def test_the_users_server_keys_are_the_ones_trusted(tmp_path):
    adb = adbutils.adb_path()
    home = tmp_path / "home"
    (home / ".android").mkdir(parents=True)
    subprocess.run([adb, "keygen", str(home / ".android" / "adbkey")], capture_output=True, check=True)
    subprocess.run([adb, "keygen", str(tmp_path / "vendor.adb_key")], capture_output=True, check=True)
    (tmp_path / "vendor.adb_key.pub").unlink()  # derived with `adb pubkey` then
    keys = adb_auth.user_server_keys(adb, {"HOME": str(home), "ADB_VENDOR_KEYS": str(tmp_path)})
    assert keys[0] == (home / ".android" / "adbkey.pub").read_text().strip() and len(keys) == 2
    assert [adb_auth.parse_public_key(key).size for key in keys] == [256, 256]
    with pytest.raises(adb_auth.AdbKeyError, match="the adb server has no key to trust: none of .*adbkey exists"):
        adb_auth.user_server_keys(adb, {"HOME": str(tmp_path / "nobody")})
    (home / ".android" / "adbkey.pub").write_text("garbage\n")
    with pytest.raises(adb_auth.AdbKeyError, match="adbkey.pub: not base64"):
        adb_auth.user_server_keys(adb, {"HOME": str(home)})


def test_the_host_runner_and_the_phone_loader_agree_on_the_phone_variable():
    """host_runner spells it itself (repro bundles run it without the harness): the two must not drift."""
    from harness.emulator import host_runner

    assert host_runner.PHONE_ENV == PHONE_ENV
