"""Many hosts' adb servers in one run: `--adb-server HOST:PORT` (repeatable, default the local server as
adb itself finds it), devices known by server and serial, an unreachable server named in one line while
the run goes on with the others, and a serial on two servers that must be written SERVER/SERIAL.

The end-to-end test starts two private adb servers on loopback, each with one emulated device (each
device trusts only its own server's key), and runs one card in one dtype over both."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from harness.context import RunContext
from harness.device import discovery, kinds
from harness.device.adb import AdbServer, split_label
from harness.device.device import DeviceError
from harness.emulator.launcher import EmulatorFleet, free_port
from harness.tests.child_suite import run_suite

CARD = "kv_gather_written and not pair and delegate_mutbuf"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10.0.0.7:5037", AdbServer("10.0.0.7", 5037)),
        ("tcp:rack-3.lab:5038", AdbServer("rack-3.lab", 5038)),
        ("[::1]:5037", AdbServer("::1", 5037)),
        ("localfilesystem:/run/user/7/adb.sock", AdbServer("", 0, "/run/user/7/adb.sock")),
    ],
)
def test_a_server_is_host_and_port_or_a_unix_socket(text, expected):
    assert AdbServer.parse(text, "--adb-server") == expected
    assert AdbServer.parse(expected.address, "--adb-server") == expected


@pytest.mark.parametrize("text", ["5037", "host:", "host:99999", "ho st:5037", "host;rm -rf /:5037", ":5037"])
def test_a_bad_server_is_refused_naming_the_form(text):
    with pytest.raises(ValueError, match=r"^--adb-server .*: write the adb server as HOST:PORT, e.g. "):
        AdbServer.parse(text, "--adb-server")


def test_the_default_server_is_the_one_adb_would_use(monkeypatch):
    monkeypatch.delenv("ADB_SERVER_SOCKET", raising=False)
    monkeypatch.delenv("ANDROID_ADB_SERVER_PORT", raising=False)
    assert discovery.default_server() == AdbServer("127.0.0.1", 5037)
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", "5099")
    assert discovery.default_server() == AdbServer("127.0.0.1", 5099)
    monkeypatch.setenv("ADB_SERVER_SOCKET", "tcp:10.1.2.3:6000")  # adb lets it win over the port
    assert discovery.default_server() == AdbServer("10.1.2.3", 6000)
    monkeypatch.setenv("ADB_SERVER_SOCKET", "localfilesystem:/tmp/adb")
    assert discovery.default_server() == AdbServer("", 0, "/tmp/adb")
    monkeypatch.setenv("ADB_SERVER_SOCKET", "localfilesystem:tmp/../adb")
    with pytest.raises(
        DeviceError,
        match=r"^ADB_SERVER_SOCKET localfilesystem:'tmp/../adb': write a unix socket server "
        r"as localfilesystem:/ABSOLUTE/PATH .*\(or unset it\)$",
    ):
        discovery.default_server()


@pytest.mark.parametrize(
    "label, parts",
    [
        ("localfilesystem:/run/a/adb.sock/127.0.0.1:4000", ("localfilesystem:/run/a/adb.sock", "127.0.0.1:4000")),
        ("10.0.0.1:5037/R5CW1", ("10.0.0.1:5037", "R5CW1")),
        ("R5CW1", ("", "R5CW1")),
    ],
)
def test_a_unix_server_label_ends_at_its_last_slash(label, parts):
    assert split_label(label) == parts


LISTINGS = {
    "10.0.0.1:5037": {"R5CW1": "device", "emulator-5554": "device"},
    "10.0.0.2:5037": {"R5CW2": "device", "emulator-5554": "device"},
}


def test_a_serial_on_two_servers_must_name_its_server():
    assert discovery._locate(LISTINGS, "R5CW2") == ("10.0.0.2:5037", "R5CW2")
    assert discovery._locate(LISTINGS, "10.0.0.2:5037/emulator-5554") == ("10.0.0.2:5037", "emulator-5554")
    with pytest.raises(
        DeviceError,
        match=r"^device emulator-5554 is on 2 adb servers \(10.0.0.1:5037, 10.0.0.2:5037\): "
        r"write it as 10.0.0.1:5037/emulator-5554 to say which$",
    ):
        discovery._locate(LISTINGS, "emulator-5554")
    with pytest.raises(
        DeviceError, match=r"^--device 10.0.0.9:5037/R5CW1: 10.0.0.9:5037 is not a reachable adb server"
    ):
        discovery._locate(LISTINGS, "10.0.0.9:5037/R5CW1")
    with pytest.raises(
        DeviceError, match=r"^unknown device serial R5CW9: attached are 10.0.0.1:5037/R5CW1 \(device\), "
    ):
        discovery._locate(LISTINGS, "R5CW9")


class _Server:
    """What select_across reads of an adb server: its address, its listing, a device handle."""

    def __init__(self, host: str, states: dict[str, str]) -> None:
        self.host, self.port, self._states = host, 5037, states

    def list(self):
        return [SimpleNamespace(serial=serial, state=state) for serial, state in self._states.items()]

    def device(self, serial: str):
        return SimpleNamespace(serial=serial)


def test_all_is_every_ready_device_of_every_server():
    servers = [_Server("10.0.0.1", {"R5CW1": "device", "R5CW3": "offline"}), _Server("10.0.0.2", {"R5CW2": "device"})]
    assert [d.label for d in discovery.select_across(servers, ["all"])] == [
        "10.0.0.1:5037/R5CW1",
        "10.0.0.2:5037/R5CW2",
    ]
    assert [d.label for d in discovery.select_across(servers, ["R5CW2"])] == ["10.0.0.2:5037/R5CW2"]
    idle = [_Server("10.0.0.1", {"R5CW3": "offline"}), _Server("10.0.0.2", {})]
    with pytest.raises(
        DeviceError, match=r"^--device all: no device is attached and ready on 10.0.0.1:5037, 10.0.0.2:5037: "
    ):
        discovery.select_across(idle, ["all"])
    with pytest.raises(DeviceError, match=r"^device R5CW3 is offline: reconnect it"):
        discovery.select_across(servers, ["R5CW3"])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child run's environment: wide lines, so a message is never wrapped."""
    return {**os.environ, "COLUMNS": "300", **(extra or {})}


@pytest.mark.child_suite
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--adb-server", "rack-3"], "ERROR: --adb-server 'rack-3': write the adb server as HOST:PORT"),
        (
            ["--adb-server", "10.0.0.1:5037", "--adb-server", "10.0.0.1:5037"],
            "ERROR: --adb-server: a server is given twice",
        ),
        (["--shard", "3/2"], "ERROR: --shard 3/2: INDEX must be between 1 and COUNT (2)"),
        (["--shard-timings", "reports/latest"], "ERROR: --shard-timings reports/latest without --shard: add --shard"),
        (["--shard", "1/2", "--shard-timings", "/nonexistent"], "ERROR: --shard-timings: /nonexistent does not exist"),
        # Under workers too: only they collect, so a bad -k used to crash each of them (INTERNALERROR, exit 3).
        (["-n", "2", "-k", "counter_add and"], "ERROR: -k 'counter_add and': expected not OR left parenthesis"),
        (["-m", "(slow"], "ERROR: -m '(slow': expected right parenthesis"),
    ],
)
def test_bad_host_and_shard_options_are_one_line(args, expected):
    completed = run_suite("--collect-only", *args, env=_env(), timeout=300)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout + completed.stderr
    assert len(lines) == 1 and lines[0].startswith(expected), completed.stderr


@pytest.mark.child_suite
def test_an_unreachable_server_alone_is_one_line():
    port = free_port()
    completed = run_suite("--collect-only", "--adb-server", f"127.0.0.1:{port}", env=_env(), timeout=300)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: no adb server answers on 127.0.0.1:{port}: start it"), lines


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory, toolchain):
    """Two private adb servers, one emulated device each (SM8650 on one, SM8750 on the other)."""
    device_env = {**kinds.EmulatedKind.heap_environment(toolchain.child_env()), "QNNSUITE_PYTHON": sys.executable}
    with (
        EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("host-a"), device_env=device_env) as a,
        EmulatorFleet(["SM8750"], tmp_path_factory.mktemp("host-b"), device_env=device_env) as b,
    ):
        yield a, b


@pytest.mark.child_suite
def test_one_run_uses_the_devices_of_two_servers_and_names_an_unreachable_one(two_servers, tmp_path):
    a, b = two_servers
    dead = free_port()
    server_a, server_b = a.server.address, b.server.address  # localfilesystem:PATH, as the run names its own
    label_a, label_b = f"{server_a}/{a.devices[0].serial}", f"{server_b}/{b.devices[0].serial}"
    reports, locks = tmp_path / "reports", tmp_path / "locks"
    run = run_suite(
        "-W",
        "ignore",
        "-n",
        "2",
        "--dtype",
        "fp16",
        "-k",
        CARD,
        "--adb-server",
        server_a,
        "--adb-server",
        f"127.0.0.1:{dead}",
        "--adb-server",
        server_b,
        "--device",
        label_a,
        "--device",
        b.devices[0].serial,
        "--report-dir",
        str(reports),
        env=_env({"QNNSUITE_LOCK_DIR": str(locks)}),
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    named = [line for line in run.stderr.splitlines() if str(dead) in line]
    assert named == [
        f"qnnsuite: no adb server answers on 127.0.0.1:{dead}: start it with `adb -P {dead} start-server` "
        f"(it listens on loopback only), or fix --adb-server 127.0.0.1:{dead}; going on without it"
    ]
    for soc, label in (("SM8650", label_a), ("SM8750", label_b)):
        report = json.loads((reports / "latest" / soc / "report.json").read_text())
        assert report["cases"] and {case["device_serial"] for case in report["cases"]} == {label}, (
            "each case on one device"
        )
        assert report["environment"]["device_serial"] == label
        serial = label.rsplit("/", 1)[-1]  # the terminal names it short; report.json keeps the address
        shown = f"emulated {soc} ({serial})" if report["environment"]["emulated"] else serial
        assert any(line.startswith(f"{soc}: ") and f" on {shown} -> " in line for line in run.stdout.splitlines())
    (folder,) = [p for p in reports.iterdir() if not p.is_symlink()]
    context = RunContext.from_json((folder / "run-context.json").read_text())
    assert sorted(spec.label for spec in context.devices) == sorted([label_a, label_b])
    used = sorted(p.name for p in locks.glob("*.uses.jsonl"))
    assert used == sorted(f"{label.replace(':', '_').replace('/', '_')}.uses.jsonl" for label in (label_a, label_b))
