"""Attacks on the suite, one test each: the emulated device is no back door, and hostile input harms nothing.

Each test's docstring names the attack. Devices are real emulated ones behind a real adb server, so the
authentication, the jail and the quoting are exercised as a run uses them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from pathlib import Path

import adbutils
import pytest

from harness import known_failures, options as run_options, shard as sharding
from harness.device import device as device_module
from harness.device.adb import AdbClient
from harness.device.device import Device, DeviceError, safe_pull_name
from harness.device.execute import BEFORE_RUNNER, run_started
from harness.device.pool import DeviceSpec, remove_run_folders
from harness.device.sync import SyncSession
from harness.emulator import jail, shell_paths
from harness.emulator.adb_auth import PublicKey, load_keys
from harness.emulator.adbd import JAIL_ENV
from harness.emulator.adbd_transport import HEADER
from harness.emulator.launcher import ADB_SERVER_ENV, PROJECT_ROOT, EmulatorFleet, free_port, host_request
from harness.paths import REPO_ROOT
from harness.pipeline import card as card_registry, prepared
from harness.pipeline.facts import PreparedFacts, ProgramFacts, QuantizeFacts
from harness.report import write_run
from harness.report.gate import BaselineError, MalformedReport, load as load_reports
from harness.report.render.chart import error_chart
from harness.tests.child_suite import SUITES, run_suite
from harness.tests.report.test_report import COLUMNS, make_records, typed
from harness.tests.waiting import wait_for
from harness.text import ZERO_WIDTH_SPACE, markdown_text
from harness.user_state import UnsafeStateDir, base_dir, open_append, state_dir

ADB = os.environ.get("ADBUTILS_ADB_PATH") or adbutils.adb_path()
MODES = ("jailed", "path-checked")


@contextlib.contextmanager
def device_shells(mode: str) -> Iterator[None]:
    """Devices started inside get jailed shells, or the fallback without bubblewrap."""
    if mode == "jailed" and jail.unavailable_reason():
        pytest.skip(f"no jail on this machine: {jail.unavailable_reason()}")
    saved = os.environ.get(JAIL_ENV)
    os.environ[JAIL_ENV] = "off" if mode == "path-checked" else "on"
    try:
        yield
    finally:
        os.environ.pop(JAIL_ENV) if saved is None else os.environ.__setitem__(JAIL_ENV, saved)


@pytest.fixture(scope="module", params=MODES)
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorFleet]:
    with device_shells(request.param):
        running = EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("fleet")).start()
    try:
        yield running
    finally:
        running.stop()


def harness_device(fleet: EmulatorFleet) -> Device:
    return Device(fleet.devices[0].serial, AdbClient(server=fleet.server))


def packet(command: bytes, arg0: int = 0, arg1: int = 0, data: bytes = b"", magic: int | None = None) -> bytes:
    value = int.from_bytes(command, "little")
    return HEADER.pack(value, arg0, arg1, len(data), 0, value ^ 0xFFFFFFFF if magic is None else magic) + data


def read_until_closed(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    """Everything the device sends until it hangs up (TimeoutError if it never does)."""
    sock.settimeout(timeout_s)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def device_port(fleet: EmulatorFleet) -> int:
    return int(fleet.devices[0].serial.rpartition(":")[2])


def test_raw_client_without_cnxn_gets_no_shell(fleet: EmulatorFleet) -> None:
    """Attack: a local user connects to the device's loopback port and sends OPEN shell: without CNXN/AUTH."""
    marker = fleet.devices[0].root / "data/local/tmp/raw-client-was-here"
    opens = packet(b"OPEN", 1, 0, b"shell:touch /data/local/tmp/raw-client-was-here\0")
    with socket.create_connection(("127.0.0.1", device_port(fleet))) as sock:
        sock.sendall(opens)
        assert read_until_closed(sock) == b""
    with socket.create_connection(("127.0.0.1", device_port(fleet))) as sock:  # CNXN, then OPEN without AUTH
        sock.sendall(packet(b"CNXN", 0x01000001, 256 * 1024, b"host::\0"))
        sock.settimeout(5)
        command, kind, _, length, _, _ = HEADER.unpack(sock.recv(HEADER.size))
        assert (command.to_bytes(4, "little"), kind, length) == (b"AUTH", 1, 20)  # a token to sign
        sock.recv(20)
        sock.sendall(packet(b"AUTH", 2, 0, os.urandom(256)))  # a signature by no key: only a new token
        assert HEADER.unpack(sock.recv(HEADER.size))[:2] == (HEADER.unpack(packet(b"AUTH"))[0], 1)
        sock.recv(20)
        sock.sendall(opens)
        assert read_until_closed(sock) == b""
    assert not marker.exists()
    assert harness_device(fleet).shell("echo still here").output == "still here\n"


def foreign_server_attempt(serial: str, tmp_path: Path) -> tuple[str | None, int]:
    """Another adb server (another user's, with its own adbkey) connects to `serial` and tries a shell that
    touches /data/local/tmp/foreign: the state it sees the device in, and the shell's exit code."""
    home, port = tmp_path / "foreign-home", free_port()
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "ADB_VENDOR_KEYS"}
    server = subprocess.Popen(
        [ADB, "-P", str(port), "server", "nodaemon"],
        env={**env, **ADB_SERVER_ENV, "HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                host_request(port, "host:version", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "the foreign adb server did not start"
                time.sleep(0.1)
        with contextlib.suppress(Exception):
            host_request(port, f"host:connect:{serial}", timeout=10)
        # Settled: the foreign server has finished its handshake with the device (refused or let in).
        states = wait_for(
            lambda: _settled_states(port, serial), timeout_s=30, what=f"the foreign server's handshake with {serial}"
        )
        shell = subprocess.run(
            [ADB, "-P", str(port), "-s", serial, "shell", "touch /data/local/tmp/foreign"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (home / ".android" / "adbkey.pub").exists()  # it did have a key to offer: not the trusted one
        return states.get(serial), shell.returncode
    finally:
        with contextlib.suppress(OSError):
            host_request(port, "host:kill", timeout=5)
        server.wait(10)


def _settled_states(port: int, serial: str) -> dict[str, str] | None:
    """The foreign server's device states once serial's is no longer on its way (connecting, authorizing)."""
    states = dict(line.split("\t") for line in host_request(port, "host:devices").splitlines() if "\t" in line)
    return None if states.get(serial) in (None, "connecting", "authorizing") else states


def test_client_with_a_foreign_key_is_refused(fleet: EmulatorFleet, tmp_path: Path) -> None:
    """Attack: another adb server (another user's, with its own adbkey) connects to the emulated device."""
    serial = fleet.devices[0].serial
    state, shell_exit = foreign_server_attempt(serial, tmp_path)
    assert state != "device" and shell_exit != 0
    assert not (fleet.devices[0].root / "data/local/tmp/foreign").exists()
    assert fleet.device_states()[serial] == "device"  # the suite's own server is still in


def test_adb_key_file_and_signature_checks_reject_what_is_not_the_servers(fleet: EmulatorFleet, tmp_path: Path) -> None:
    """Attack: a garbled key file, or a signature that is not the token's, must not be taken for the server's key."""
    key = load_keys(fleet.server_public_key)[0]
    assert isinstance(key, PublicKey) and key.size == 256
    token = os.urandom(20)
    if shutil.which("openssl"):  # the server's private key signs as adb does: PKCS#1 v1.5 over the raw token
        signed = subprocess.run(
            [
                "openssl",
                "pkeyutl",
                "-sign",
                "-inkey",
                str(fleet.server_public_key.with_suffix("")),
                "-pkeyopt",
                "digest:sha1",
            ],
            input=token,
            capture_output=True,
            check=True,
        ).stdout
        assert key.verifies(token, signed)
        assert not key.verifies(bytes([token[0] ^ 1]) + token[1:], signed)
    assert not key.verifies(os.urandom(20), os.urandom(256))
    assert not key.verifies(os.urandom(20), b"\0" * 255 + b"\1")  # 1^e = 1: no padding, no digest
    broken = tmp_path / "adbkey.pub"
    broken.write_text("not-base64!! user@host\n")
    with pytest.raises(ValueError, match="adbkey.pub:1: not base64"):
        load_keys(broken)


def _writable_host_folder_outside_tmp() -> Path:
    """The checkout, or else the home folder: a host folder the suite can write that the jail binds read-only
    (a checkout under /tmp or /run is not one: the jail has a /tmp of its own, where the write lands)."""
    for folder in (PROJECT_ROOT, Path.home()):
        if folder.parts[1:2] not in (("tmp",), ("run",)) and os.access(folder, os.W_OK):
            return folder
    pytest.skip("no writable host folder outside /tmp and /run (checkout and home are in them, or read-only)")


def test_shell_command_cannot_write_a_host_path(fleet: EmulatorFleet, tmp_path: Path) -> None:
    """Attack: a device command names a host path outside the sandbox (`touch /tmp/.../x`, `cd /; rm ...`)."""
    target = tmp_path / "host-file"
    target.write_text("host data")
    device = harness_device(fleet)
    assert device.shell(f"echo pwned > {target}").exit_code != 0
    host_file = _writable_host_folder_outside_tmp() / f"written-by-a-device-{os.getpid()}"
    try:
        assert device.shell(f"touch {host_file}").exit_code != 0 and not host_file.exists()
    finally:
        host_file.unlink(missing_ok=True)
    for command in (
        f"rm -f {target}",
        f"cd / && rm -f {str(target).lstrip('/')}",
        f"cd /data/../{str(target.parent).lstrip('/')} && rm -f {target.name}",
    ):
        device.shell(command)  # refused, or run where the host's file is not (`rm -f` is content either way)
        assert target.read_text() == "host data", command
    assert device.shell("echo ok > /data/local/tmp/inside && cat /data/local/tmp/inside").output == "ok\n"


def test_shell_command_cannot_reach_a_host_socket(fleet: EmulatorFleet, tmp_path: Path) -> None:
    """Attack: a device command connects to a unix socket of the host (an ssh agent, docker) in /tmp or /run,
    which a read-only mount would not stop."""
    agent = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(agent))
        listener.listen()
        assert harness_device(fleet).shell(f"test -S {agent}").exit_code != 0
        assert harness_device(fleet).shell("test -S /data/local/tmp || ls -d /data/local/tmp").exit_code == 0


def test_path_check_refuses_host_paths_and_passes_device_ones() -> None:
    """Attack (no bubblewrap): host paths, also behind /data/.., in a command; device paths and /dev/null pass."""
    root = Path("/srv/dev root")
    assert shell_paths.refusal("cat /etc/passwd", root) is not None
    assert shell_paths.refusal("cd /data/../etc && ls", root) is not None
    assert shell_paths.refusal("cd /", root) is not None
    assert shell_paths.refusal("ls /data/local/tmp 2>/dev/null; getprop ro.soc.model", root) is None
    assert shell_paths.refusal("LD_LIBRARY_PATH=/data/x:/vendor/lib64 ./r", root) is None


@pytest.mark.device
@pytest.mark.parametrize("mode", MODES)
def test_tmpdir_with_space_quote_semicolon_and_command_substitution(mode: str, tmp_path: Path) -> None:
    """Attack: the sandbox lies under a TMPDIR holding a space, a quote, `;` and `$()`; end-of-run rm -rf."""
    victim = tmp_path / "x"  # where `rm -rf <root>/data/...` split at the space would strike
    victim.mkdir()
    (victim / "keep").write_text("host data")
    workdir = tmp_path / "x y'z;$(touch PWNED)\"q"
    with device_shells(mode):
        fleet = EmulatorFleet(["SM8650"], workdir).start()
    try:
        device = harness_device(fleet)
        assert device.shell("mkdir -p /data/local/tmp/qnnsuite/run1/gw0 && echo made").output == "made\n"
        spec = DeviceSpec(
            device.serial, "SM8650", 75, "x86_64", "Emulated SM8650", kind="emulated", server=fleet.server.address
        )
        assert remove_run_folders([spec], "run1") == []
        assert not (fleet.devices[0].root / "data/local/tmp/qnnsuite/run1").exists()  # it did remove
        assert device.shell("rm -rf /data/local/tmp/qnnsuite").exit_code == 0
    finally:
        fleet.stop()
    assert (victim / "keep").read_text() == "host data"
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


def test_rewriting_quotes_the_root_for_its_quoting_context() -> None:
    """Attack (no bubblewrap): a root with `'`, `"`, `$()` and a space lands unquoted, single- or double-quoted."""
    root = Path("/t/a b'c\"$(x)")
    command = "ls /data/a '/data/b' \"/data/c\""
    rewritten = shell_paths.rewrite_device_paths(command, root)
    words = subprocess.run(["/bin/sh", "-c", f"printf '%s\\n' {rewritten[3:]}"], capture_output=True, text=True).stdout
    assert words.splitlines() == [f"{root}/data/a", f"{root}/data/b", f"{root}/data/c"]


def test_card_name_with_shell_metacharacters_is_rejected() -> None:
    """Attack: a --models card named `x /data/local/tmp/victim y` (or with `;`, `$()`, a quote, `/`)."""
    build, steps = (lambda: None), (lambda n: [])
    for name in ("x /data/local/tmp/victim y", "a;rm -rf /", "$(id)", "it's", "../up", "..", ""):
        with pytest.raises(ValueError, match="model card .* may hold only letters, digits and _ . -") as raised:
            card_registry.register(card_registry.ModelCard(name, build, steps, (), module="hostile_cards"))
        assert repr(name) in str(raised.value)
    good = card_registry.register(card_registry.ModelCard("good_name-1.0", build, steps, (), module="fine_cards"))
    assert card_registry.find("fine_cards:good_name-1.0") is good
    card_registry._REGISTRY.pop("good_name-1.0")


def test_case_folder_with_spaces_stays_one_device_path(fleet: EmulatorFleet, tmp_path: Path) -> None:
    """Attack: a device path with spaces and a second path inside it (`x /data/local/tmp/victim y`) reaches the
    push, the cd and the rm -rf that clear a case's outputs."""
    device = harness_device(fleet)
    assert (
        device.shell(
            "mkdir -p /data/local/tmp/victim/outputs && touch /data/local/tmp/victim/keep "
            "/data/local/tmp/victim/outputs/keep"
        ).exit_code
        == 0
    )
    folder = "/data/local/tmp/qnnsuite/x /data/local/tmp/victim y"
    (tmp_path / "input.raw").write_bytes(b"1234")
    device.push_files([(tmp_path / "input.raw", f"{folder}/input.raw")])
    result = device.run(
        ["sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "$(id)", "c;d"], cwd=folder, timeout_s=30, first=BEFORE_RUNNER
    )
    assert result.output == "a b|$(id)|c;d|"
    root = fleet.devices[0].root
    assert (root / "data/local/tmp/victim/keep").exists() and (root / "data/local/tmp/victim/outputs/keep").exists()
    assert (root / folder.lstrip("/") / "outputs").is_dir() and (root / folder.lstrip("/") / "input.raw").is_file()
    assert run_started(device, folder) is not None


def test_symlinked_lock_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: another user plants /tmp/qnnsuite-<uid> (or the lock folder, or a log in it) as a symlink."""
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    monkeypatch.delenv("QNNSUITE_LOCK_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    (tmp_path / f"qnnsuite-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(UnsafeStateDir, match="is a symlink"):
        device_module.lock_dir()
    monkeypatch.setenv("QNNSUITE_LOCK_DIR", str(tmp_path / "open"))
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(UnsafeStateDir, match="has mode 777"):
        device_module.lock_dir()
    monkeypatch.setenv("QNNSUITE_LOCK_DIR", str(tmp_path / "mine"))
    locks = device_module.lock_dir()
    assert oct(locks.stat().st_mode & 0o777) == "0o700" and locks == state_dir("locks", str(tmp_path / "mine"))
    (locks / "serial.uses.jsonl").symlink_to(elsewhere / "stolen")
    with pytest.raises(OSError):
        open_append(locks / "serial.uses.jsonl")
    assert not (elsewhere / "stolen").exists()
    monkeypatch.delenv("QNNSUITE_LOCK_DIR")
    (tmp_path / f"qnnsuite-{os.getuid()}").unlink()
    assert device_module.lock_dir() == tmp_path / f"qnnsuite-{os.getuid()}" / "locks"


def test_list_name_with_dotdot_never_leaves_the_pull_folder(
    fleet: EmulatorFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a device answers LIST with `../escape` (or `/abs`, `a/b`) and the pull writes outside its folder."""
    device = harness_device(fleet)
    assert device.shell("mkdir -p /data/local/tmp/pulls && echo x > /data/local/tmp/pulls/ok.raw").exit_code == 0
    pulled = tmp_path / "pull" / "outputs"
    assert device.pull_files("/data/local/tmp/pulls", pulled) == ["ok.raw"]
    monkeypatch.setattr(SyncSession, "list_sizes", lambda self, remote: {"ok.raw": 2, "../escape": 2})
    with pytest.raises(DeviceError, match="listed a file named '../escape'"):
        device.pull_files("/data/local/tmp/pulls", pulled)
    assert not (tmp_path / "pull" / "escape").exists()
    assert [
        safe_pull_name(name) for name in ("ok.raw", "..", ".", "a/b", "/abs", "x\0y", "a\\b", "output_0_0.raw")
    ] == [True, False, False, False, False, False, False, True]


def test_100_idle_connections_under_a_low_open_file_limit(fleet: EmulatorFleet) -> None:
    """Attack: 100 idle connections to a device whose open-file limit is 48 (accept fails with EMFILE)."""
    info = fleet.add_device("SM8650")
    port = int(info.serial.rpartition(":")[2])
    try:
        resource.prlimit(info.pid, resource.RLIMIT_NOFILE, (48, 48))
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        log = info.root.parent / "adbd.log"
        wait_for(lambda: "Too many open files" in log.read_text(), timeout_s=30, what="the device to run out of files")
        for sock in idle:
            sock.close()
        host_request(fleet.server, f"host:disconnect:{info.serial}")
        host_request(fleet.server, f"host:connect:{info.serial}")
        deadline = time.monotonic() + 20
        while fleet.device_states().get(info.serial) != "device":
            assert time.monotonic() < deadline, fleet.device_states()
            time.sleep(0.2)
        device = Device(info.serial, AdbClient(server=fleet.server))
        assert device.shell("echo alive").output == "alive\n"
    finally:
        fleet.stop_device(info.serial)


def test_nul_and_malformed_input_end_only_their_own_stream(fleet: EmulatorFleet) -> None:
    """Attack: a NUL in a sync path (STAT, LIST, RECV), an oversized sync path, and packets with a bad magic."""
    serial = fleet.devices[0].serial
    adb = AdbClient(server=fleet.server).device(serial)
    with adb.open_transport(timeout=10) as connection:
        connection.send_command("sync:")
        connection.check_okay()

        def request(kind: bytes, path: bytes) -> None:
            connection.conn.sendall(struct.pack("<4sI", kind, len(path)) + path)

        request(b"STAT", b"/data/x\0y")
        assert struct.unpack("<4sIII", connection.read_exact(16)) == (b"STAT", 0, 0, 0)
        request(b"LIST", b"/data\0")
        assert connection.read_exact(20)[:4] == b"DONE"
        request(b"RECV", b"/data/\0x")
        kind, length = struct.unpack("<4sI", connection.read_exact(8))
        assert kind == b"FAIL" and b"NUL" in connection.read_exact(length)
        request(b"STAT", b"/data")
        kind, mode, _, _ = struct.unpack("<4sIII", connection.read_exact(16))
        assert kind == b"STAT" and mode & 0o040000  # the same session still serves
        request(b"STAT", b"/" * 5000)
        kind, length = struct.unpack("<4sI", connection.read_exact(8))
        assert kind == b"FAIL" and b"longer than" in connection.read_exact(length)
    for garbage in (
        packet(b"CNXN", 0x01000001, 4096, b"host::\0", magic=0),
        HEADER.pack(0x434E584E, 0x01000001, 4096, 1 << 30, 0, 0x434E584E ^ 0xFFFFFFFF),
        os.urandom(200),
    ):
        with socket.create_connection(("127.0.0.1", device_port(fleet))) as sock:
            sock.sendall(garbage)
            with contextlib.suppress(ConnectionResetError):
                assert read_until_closed(sock, timeout_s=15) == b""
    assert harness_device(fleet).shell("echo alive").output == "alive\n"


HOSTILE_NAME = "evil\x1b[31m<script>alert(1)</script>\x00\udc80"
HOSTILE_MESSAGE = "runner said \x07\x1b[0m <b>bold</b> & \ud800 lone, \x0b tab\x0c"


def test_control_characters_and_lone_surrogates_keep_reports_well_formed(tmp_path: Path) -> None:
    """Attack: control characters and a lone surrogate in a card name, a failure message and a QNN log."""
    records = make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    for record in records:
        record["card"] = HOSTILE_NAME
        record["case_id"] = f"{HOSTILE_NAME}-{record['dtype']}-{record['mode']}-SM8650"
    records[0].update(verdict="failed", message=HOSTILE_MESSAGE, evidence={"qnn_log": "QnnDsp \x1b[1m\udcff <err>"})
    folder = write_run(typed(records), {"SM8650": {"soc": "SM8650", "host": "h\x01"}}, tmp_path, "run-1", COLUMNS)[
        "SM8650"
    ]
    suite = ET.parse(folder / "junit.xml").getroot()
    failure = suite.find(".//failure")
    assert failure is not None and failure.get("message") == (
        "runner said \\x07\\x1b[0m <b>bold</b> & \\ud800 lone, \\x0b tab\\x0c"
    )
    assert "\\u001b[1m\\udcff <err>" in (failure.text or "")  # the evidence, as JSON escapes it
    names = {case.get("name") for case in suite.iter("testcase")}
    assert (
        f"evil\\x1b[31m<script>alert(1)</script>\\x00\\udc80-{records[0]['dtype']}-{records[0]['mode']}-SM8650" in names
    )
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
    assert not any(char in html for char in "\x00\x01\x07\x0b\x0c\x1b") and "\\x1b[31m" in html
    assert "\\ud800 lone" in html and "\\udc80" in html
    assert json.loads((folder / "report.json").read_text())["cases"]
    assert "\\ud800 lone" in (folder / "summary.md").read_text(encoding="utf-8")


# --- file attacks ---
# Files the suite did not write this run (a cache, report.json files, card modules, manifests) are handed to
# it crafted, as an attacker (or a broken CI job) would: each is refused, or made inert, in one line.

NOBODY = 65534


def _program(evil_marker: Path | None = None) -> bytes:
    """A torch.export archive of a one-layer module; with evil_marker, its weight is a pickle that creates
    that file when the archive is loaded (torch.export.load unpickles weights marked use_pickle)."""
    import torch

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)

    class Payload:
        def __reduce__(self):
            return (open, (str(evil_marker), "w"))

    saved = io.BytesIO()
    torch.export.save(torch.export.export(Layer(), (torch.ones(1, 2),)), saved)
    if evil_marker is None:
        return saved.getvalue()
    pickled = io.BytesIO()
    torch.save(Payload(), pickled)
    source, crafted = zipfile.ZipFile(io.BytesIO(saved.getvalue())), io.BytesIO()
    with zipfile.ZipFile(crafted, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("weights/model_weights_config.json"):
                config = json.loads(data)
                config["config"]["lin.weight"]["use_pickle"] = True
                data = json.dumps(config).encode()
            elif info.filename.endswith("weights/weight_0"):
                data = pickled.getvalue()
            target.writestr(info.filename, data)
    return crafted.getvalue()


PROGRAM = "forward.pt2"  # a single-method card's program in its prepared entry
SEAL = PROGRAM + ".hmac"
FORWARD = frozenset({PROGRAM})


def _prepared_entry(folder: Path, program: bytes, sealed: bool) -> Path:
    """A prepared entry as an attacker plants it: the program and facts that describe it exactly."""
    folder.mkdir(parents=True)
    (folder / PROGRAM).write_bytes(program)
    PreparedFacts(
        QuantizeFacts([], [], {}), {"forward": ProgramFacts(hashlib.sha256(program).hexdigest(), len(program))}
    ).write(folder / prepared.FACTS)
    if sealed:
        (folder / SEAL).write_text(prepared._seal(program))
    return folder


def test_planted_prepared_program_is_never_unpickled(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Attack: a forward.pt2 whose pickled weight runs code, planted in the cache with its matching prepared.json."""
    marker = tmp_path / "pwned"
    entry = _prepared_entry(tmp_path / "cache" / "prepared" / "counter_add-8a8w-0123", _program(marker), sealed=False)
    prepared._PRELOADED.clear()
    prepared.preload(entry)  # what the lowering server does before it forks a lowering
    assert not prepared._PRELOADED and not marker.exists()
    assert prepared._read_entry(entry, FORWARD) is None, "an unsealed entry is missing: it is made again"
    assert not marker.exists(), "the planted pickle ran"
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        f"qnnsuite: prepared program {entry.name} is damaged ({PROGRAM} is not sealed by this "
        f"user's key (made elsewhere, or planted): not read); preparing it again"
    ]
    forged = tmp_path / "forged"  # a seal made with another key does not pass either
    _prepared_entry(forged, _program(marker), sealed=False)
    (forged / SEAL).write_text(hashlib.sha256(b"another key" + (forged / PROGRAM).read_bytes()).hexdigest())
    assert prepared._read_entry(forged, FORWARD) is None and not marker.exists()
    import torch  # the payload is live: loaded the way the cache used to, it runs

    with pytest.raises(Exception):  # noqa: B017 - whatever the payload's pickle raises once it has run
        torch.export.load(io.BytesIO((entry / PROGRAM).read_bytes()))
    assert marker.exists()


def test_an_entry_this_user_sealed_is_read(tmp_path: Path) -> None:
    """Not an attack: the seal check must not refuse the entries the suite makes itself."""
    program = _program()
    entry = _prepared_entry(tmp_path / "prepared" / "layer-fp16-0", program, sealed=True)
    found = prepared._read_entry(entry, FORWARD)
    assert (
        found is not None
        and found[1] is not None
        and found[0].methods["forward"].sha256 == hashlib.sha256(program).hexdigest()
    )
    key_file = base_dir() / prepared.KEY_FILE
    info = os.lstat(key_file)
    assert len(prepared._key()) == prepared.KEY_BYTES and prepared._key() == key_file.read_bytes()
    assert info.st_uid == os.getuid() and (info.st_mode & 0o777) == 0o600


def _usage_line(error: pytest.ExceptionInfo[pytest.UsageError]) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_group_writable_cache_dir_is_refused(tmp_path: Path) -> None:
    """Attack: --cache-dir in a folder another account (a group member) can write entries into."""
    cache = tmp_path / "shared cache"
    cache.mkdir()
    for mode in (0o775, 0o757, 0o777):
        cache.chmod(mode)
        with pytest.raises(pytest.UsageError) as refused:
            run_options.trusted_cache_dir(cache)
        assert _usage_line(refused) == (
            f"--cache-dir {cache} has mode {mode:o} (writable by others): run "
            f"`chmod go-w '{cache}'`, or pass another folder with --cache-dir"
        )
    cache.chmod(0o755)
    assert run_options.trusted_cache_dir(cache) == cache.resolve()
    fresh = tmp_path / "new" / "cache"
    assert run_options.trusted_cache_dir(fresh) == fresh and (fresh.stat().st_mode & 0o777) == 0o700


@pytest.mark.child_suite
def test_cache_dir_owned_by_another_uid_is_refused_by_a_run(tmp_path: Path) -> None:
    """Attack: another account made the cache folder first (or owns it), as in a shared /tmp."""
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chown(cache, NOBODY, NOBODY)
    with pytest.raises(pytest.UsageError) as refused:
        run_options.trusted_cache_dir(cache)
    assert _usage_line(refused).startswith(f"--cache-dir {cache} belongs to uid {NOBODY}, not a folder of yours")
    completed = _pytest_run("--collect-only", "--cache-dir", str(cache))
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert _stderr_lines(completed) == [
        f"ERROR: --cache-dir {cache} belongs to uid {NOBODY}, not a folder of yours (uid 0): "
        f"someone else could plant entries there; pass a folder of your own with --cache-dir"
    ]


def _pytest_run(
    *args: str, env: dict[str, str] | None = None, targets: tuple[str, ...] = SUITES
) -> subprocess.CompletedProcess:
    """A suite run with a state folder of its own, as harness/tests/core/test_plugin.py runs them."""
    with tempfile.TemporaryDirectory() as runtime:
        environment = {**os.environ, "COLUMNS": "300", "XDG_RUNTIME_DIR": runtime, **(env or {})}
        return run_suite(*args, targets=targets, env=environment, timeout=600)


def _report_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.report", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def _stderr_lines(completed: subprocess.CompletedProcess) -> list[str]:
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert "Traceback" not in completed.stderr and "INTERNALERROR" not in completed.stdout + completed.stderr, (
        completed.stdout[-2000:] + completed.stderr[-3000:]
    )
    return lines


def _part(root: Path, name: str, records: list[dict] | None = None) -> Path:
    """A run folder as a shard writes it (reports/<run>/<SOC>/...), SM8650 only."""
    records = records if records is not None else make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    write_run(typed(records), {"SM8650": {"soc": "SM8650", "executorch": "1.0.0"}}, root, name, COLUMNS)
    return root / name


def _hostile_report(part: Path, change) -> Path:
    """The part's report.json rewritten by change(document)."""
    path = part / "SM8650" / "report.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.child_python
@pytest.mark.parametrize("soc", ["../../../x", "/tmp/qnnsuite-escape-{uid}"])
def test_merge_never_writes_outside_out_for_a_climbing_or_absolute_soc(tmp_path: Path, soc: str) -> None:
    """Attack: a part whose report.json says soc `../../../x` (or an absolute path), to make merge write there."""
    soc = soc.format(uid=os.getuid())
    part = _part(tmp_path / "parts", "run-a")
    _hostile_report(part, lambda document: [document.update(soc=soc)] + [c.update(soc=soc) for c in document["cases"]])
    out = tmp_path / "a" / "b" / "c" / "merged"
    before = set(tmp_path.rglob("*"))
    completed = _report_tool("merge", str(part), "--out", str(out))
    assert completed.returncode == 4 and completed.stdout == ""
    [line] = _stderr_lines(completed)
    assert line.startswith(f"merge: {part / 'SM8650' / 'report.json'} is not a valid report.json: at soc: ")
    assert set(tmp_path.rglob("*")) == before and not Path(soc).exists() and not (tmp_path / "x").exists()
    fine = _report_tool("merge", str(_part(tmp_path / "parts", "run-b")), "--out", str(out))
    assert fine.returncode == 0 and (out / "SM8650" / "report.html").is_file(), fine.stderr


def test_script_step_label_is_inert_in_merged_html_and_chart(tmp_path: Path) -> None:
    """Attack: a step label `<script>` in a part's evidence, which the chart drew raw into report.html."""
    script = "<script>alert(document.cookie)</script>"
    records = make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    state = next(r for r in records if r["check"] == "state")
    state["evidence"]["steps"][0]["step"] = script
    state["evidence"]["steps"][-1]["step"] = script
    chart = error_chart(state["evidence"]["steps"])
    assert "<script" not in chart and "step &lt;script&gt;alert(document.cookie)&lt;/script&gt;" in chart
    part = _part(tmp_path / "parts", "run-a", records)  # a run writes what its records hold; its page is inert
    assert "<script>alert" not in (part / "SM8650" / "report.html").read_text()
    completed = _report_tool("merge", str(part), "--out", str(tmp_path / "merged"))
    assert completed.returncode == 4 and not (tmp_path / "merged").exists()
    [line] = _stderr_lines(completed)
    assert re.fullmatch(
        r"merge: .*report\.json is not a valid report\.json: at cases/\d+/checks/state/evidence/"
        r"steps/\d+/step: .*is not of type 'integer'",
        line,
    ), line
    numbered = error_chart([{"step": 3, "max_abs_error": 0.5, "sqnr_db": 20, "mismatches": 0}])
    assert ">step 3</text>" in numbered, "a real step label is still drawn"


def test_symlinks_in_a_parts_repro_folder_are_not_copied(tmp_path: Path) -> None:
    """Attack: a part's repro folder holding symlinks to a private file and folder, to copy them into the merge."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_ed25519").write_text("PRIVATE KEY")
    part = _part(tmp_path / "parts", "run-a")
    bundle = part / "SM8650" / "repro" / "counter_add-fp16-delegate_mutbuf-SM8650"
    bundle.mkdir(parents=True)
    (bundle / "repro.py").write_text("print('repro')\n")
    (bundle / "key").symlink_to(secret / "id_ed25519")
    (bundle / "home").symlink_to(secret)
    os.mkfifo(bundle / "fifo")
    out = tmp_path / "merged"
    completed = _report_tool("merge", str(part), "--out", str(out))
    assert completed.returncode == 0, completed.stderr
    copied = out / "SM8650" / "repro" / bundle.name
    assert (copied / "repro.py").read_text() == "print('repro')\n"
    assert sorted(p.name for p in copied.iterdir()) == ["repro.py"]
    assert not any(p.is_symlink() for p in out.rglob("*")) and "PRIVATE KEY" not in "".join(
        p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()
    )
    assert sorted(_stderr_lines(completed)) == sorted(
        f"merge: skipped {bundle / name}: not a regular file (a symlink or a special file)"
        for name in ("fifo", "home", "key")
    )


def _deep(depth: int) -> str:
    return '{"schema_version": 1, "run_id": ' + "[" * depth + "]" * depth + "}"


MALFORMED = {
    "missing keys": lambda d: d.pop("cases"),
    "wrong types": lambda d: d["cases"][0].update(checks=["state"]),
    "deep nesting": None,  # 100000 levels: json's recursion
    "invalid JSON": None,
}
EXPECTED = {
    "missing keys": "is not a valid report.json: at the top level: 'cases' is a required property",
    "wrong types": "is not a valid report.json: at cases/0/checks: ['state'] is not of type 'object'",
    "deep nesting": "nests deeper than any report.json (32 levels at most)",
    "invalid JSON": "is not JSON (Expecting ':' delimiter at line 1 column 29)",
}


def _malformed(part: Path, kind: str) -> Path:
    path = part / "SM8650" / "report.json"
    if kind == "deep nesting":
        path.write_text(_deep(100_000))
    elif kind == "invalid JSON":
        path.write_text('{"schema_version": 1, "soc" "SM8650"}')
    else:
        _hostile_report(part, MALFORMED[kind])
    return path


@pytest.mark.child_python
@pytest.mark.parametrize("kind", list(MALFORMED))
@pytest.mark.parametrize("command", ["merge", "diff"])
def test_malformed_report_is_one_line_and_exit_4(tmp_path: Path, command: str, kind: str) -> None:
    """Attack: a report.json with missing keys, wrong types, 100000-deep nesting or broken JSON, handed to
    `python -m harness.report merge` / `diff`."""
    good, bad = _part(tmp_path / "parts", "run-good"), _part(tmp_path / "parts", "run-bad")
    path = _malformed(bad, kind)
    args = (
        ("merge", str(bad), "--out", str(tmp_path / "merged")) if command == "merge" else ("diff", str(good), str(bad))
    )
    completed = _report_tool(*args)
    assert completed.returncode == 4 and completed.stdout == ""
    assert _stderr_lines(completed) == [f"{command}: {path} {EXPECTED[kind]}"]
    if command == "diff":
        assert _report_tool("diff", str(good), str(good)).returncode == 0, "a valid report is still read"


def test_huge_or_special_report_file_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: report.json as a FIFO (a read that never ends) or a file bigger than any report."""
    from harness.report import intake

    part = _part(tmp_path / "parts", "run-a")
    path = part / "SM8650" / "report.json"
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(MalformedReport, match=f"^{re.escape(str(path))} is not a regular file"):
        load_reports(part)
    path.unlink()
    path.write_bytes(b" " * 2048)
    monkeypatch.setattr(intake, "MAX_BYTES", 1024)
    with pytest.raises(MalformedReport, match=f"^{re.escape(str(path))} is 2048 bytes, more than any report.json"):
        load_reports(path)


@pytest.mark.child_suite
@pytest.mark.parametrize("option", ["--baseline", "--shard-timings"])
def test_malformed_baseline_or_shard_timings_is_a_usage_line_before_the_run(tmp_path: Path, option: str) -> None:
    """Attack: `--baseline` / `--shard-timings` pointing at a 100000-deep (or key-less) report.json."""
    part = _part(tmp_path / "parts", "run-a")
    path = _malformed(part, "deep nesting")
    extra = ("--shard", "1/2") if option == "--shard-timings" else ()
    completed = _pytest_run("--collect-only", option, str(part), *extra, "--emulate", "SM8650")
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert _stderr_lines(completed) == [f"ERROR: {option}: {path} {EXPECTED['deep nesting']}"]
    keyless = _part(tmp_path / "parts", "run-keyless")
    _malformed(keyless, "missing keys")
    with pytest.raises((BaselineError, sharding.ShardError), match="'cases' is a required property"):
        load_reports(keyless) if option == "--baseline" else sharding.parse("1/2", keyless)
    assert sharding.parse("1/2", _part(tmp_path / "parts", "run-b")).durations_s, "a valid report's timings are read"


def test_markdown_injection_in_a_failure_message_renders_inert_in_summary_md(tmp_path: Path) -> None:
    """Attack: a failure message with `<img>`, a link, `@team`, `|`, backticks and a newline, in summary.md."""
    hostile = (
        "pwn <img src=https://evil.example/x.png> [click](https://evil.example) @qnn/team fixes #12 "
        "a|b `code` *bold*\n# heading\n- item"
    )
    records = make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    failed = next(r for r in records if r["check"] == "state")
    failed.update(verdict="failed", message=hostile)
    folder = write_run(typed(records), {"SM8650": {"soc": "SM8650"}}, tmp_path, "run-1", COLUMNS)["SM8650"]
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    [row] = [line for line in summary.splitlines() if "pwn" in line]
    assert row == f"- **failed** state: 1 check(s) in {failed['case_id']}; e.g. {markdown_text(hostile)}"
    unescaped = re.findall(r"(?<!\\)[<>\[\]`*#|@]", row.split("; e.g. ", 1)[1])
    assert unescaped == [], unescaped
    assert f"\\@{ZERO_WIDTH_SPACE}qnn" in row and f"\\#{ZERO_WIDTH_SPACE}12" in row, "no mention, no issue link"
    assert f"https:{ZERO_WIDTH_SPACE}//evil" in row, "no bare link either"
    assert "\n# heading" not in summary and "\n- item" not in summary
    assert markdown_text("state differs: 3 element(s) in step 1") == "state differs: 3 element\\(s\\) in step 1"
    assert markdown_text("kv_index_copy_dim1-16a4w-skip_mutbuf-SM8650") == "kv_index_copy_dim1-16a4w-skip_mutbuf-SM8650"
    assert [markdown_text(t) for t in ("- item", "1. item", "1.5.1")] == ["\\- item", "1\\. item", "1.5.1"], (
        "what would start a list when the text starts a line is escaped; a version is not"
    )


CARD_MODULES = {
    "raises": (
        'raise RuntimeError("card registry unavailable")\n',
        "model cards 'hostile_cards' ({file}) failed to import: RuntimeError: card registry unavailable",
    ),
    "syntax error": ("def broken(:\n    pass\n", "model cards 'hostile_cards' ({file}, line 1) are not valid Python: "),
    "sys.exit": (
        "import sys\nsys.exit(3)\n",
        "model cards 'hostile_cards' ({file}) failed to import: it called sys.exit(3): a card module must "
        "only register cards",
    ),
}


@pytest.mark.child_suite
@pytest.mark.parametrize("kind", list(CARD_MODULES))
def test_card_module_that_fails_to_import_is_one_usage_line(tmp_path: Path, kind: str) -> None:
    """Attack: `--models` naming a card module that raises, has a syntax error or calls sys.exit."""
    source, expected = CARD_MODULES[kind]
    module = tmp_path / "hostile_cards.py"
    module.write_text(source)
    completed = _pytest_run(
        "--collect-only",
        "--models",
        "hostile_cards",
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout[-2000:] + completed.stderr[-2000:]
    [line] = _stderr_lines(completed)
    assert line.startswith("ERROR: --models: " + expected.format(file=module)), line


def _manifest(tmp_path: Path, message: str) -> Path:
    path = tmp_path / "manifest.toml"
    path.write_text(
        f'[[known_failure]]\npattern = "test_state[counter_add-*]"\nsignature = "state_mismatch"\n'
        f'reason = "r"\nmessage = {json.dumps(message)}\n'
    )
    return path


@pytest.mark.child_suite
def test_manifest_with_an_invalid_regex_is_one_usage_line(tmp_path: Path) -> None:
    """Attack: --known-failures with an entry whose message is not a regular expression."""
    import harness.checks  # noqa: F401  (registers the signatures the manifest names)

    manifest = _manifest(tmp_path, "state (differs")
    with pytest.raises(ValueError) as refused:
        known_failures.load(manifest)
    assert str(refused.value) == (
        f"{manifest}: entry 'test_state[counter_add-*]' has message 'state (differs', not a "
        f"regular expression (missing ), unterminated subpattern at position 6): fix or escape it"
    )
    completed = _pytest_run(
        "--collect-only", "--known-failures", str(manifest), targets=("harness/tests/test_architecture.py",)
    )
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert _stderr_lines(completed) == [f"ERROR: {manifest}: {refused.value}"]


def test_manifest_pattern_that_backtracks_for_hours_is_refused_and_no_check_hangs(tmp_path: Path) -> None:
    """Attack: a manifest `message = "(a+)+$"`, which hangs every check whose failure it meets."""
    import harness.checks  # noqa: F401
    from harness.check_registry import CheckFailure

    for pattern, problem in (
        ("(a+)+$", "a quantifier inside a quantified group"),
        ("(a*)*b", "a quantifier inside a quantified group"),
        ("(ab|ab)*c", "an alternation inside a quantified group"),
        (".*a.*a.*b", "3 unbounded quantifiers"),
    ):
        known_failures.load.cache_clear()
        with pytest.raises(ValueError, match=re.escape(f"has message {pattern!r} with {problem}")):
            known_failures.load(_manifest(tmp_path, pattern))
    known_failures.load.cache_clear()
    [entry] = known_failures.load(_manifest(tmp_path, "^state .*a.*b"))  # allowed: two open quantifiers
    message = "state " + "a" * 200_000  # a long message cannot make even the allowed pattern run long
    started = time.monotonic()
    assert not entry.explains(CheckFailure(message, signature="state_mismatch"))
    assert time.monotonic() - started < 10
    assert entry.explains(CheckFailure("state a then b", signature="state_mismatch")), (
        "the entry still explains its failure"
    )
    known_failures.load.cache_clear()


# --- device attacks ---
# Run as they were found: from a second local account (`setpriv` to nobody; the tests run as root) with the
# stock adb client, or as a device shell.

OTHER_ACCOUNT = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def as_other_account(argv: list[str], home: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """argv run by uid 65534 (nobody), in a HOME of its own, with none of this run's environment."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as a second local account")
    home.mkdir(exist_ok=True)
    os.chown(home, 65534, 65534)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", **ADB_SERVER_ENV}
    return subprocess.run([*OTHER_ACCOUNT, *argv], env=env, capture_output=True, text=True, timeout=timeout)


def listening_tcp_ports(pids: list[int]) -> list[int]:
    """The TCP ports the processes `pids` listen on: their socket inodes matched with /proc/net/tcp{,6}."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports = set()
    for table in TCP_TABLES:
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return sorted(ports)


def test_another_account_reaches_no_device_on_any_port_or_socket_of_the_run(
    fleet: EmulatorFleet, tmp_path: Path
) -> None:
    """Attack: another local account runs `adb -P PORT devices` / `shell id` against every TCP port the
    fleet's processes listen on, and `adb -L localfilesystem:SOCKET` against the run's server."""
    home = tmp_path / "other-home"
    ports = listening_tcp_ports(fleet.started_pids)
    assert ports, "the emulated devices listen on loopback ports (adb connects to them)"
    serial = fleet.devices[0].serial
    for where in [["-P", str(port)] for port in ports] + [["-L", fleet.server.address]]:
        listing = as_other_account([ADB, *where, "devices"], home)
        shell = as_other_account([ADB, *where, "-s", serial, "shell", "id"], home)
        assert "\tdevice" not in listing.stdout and serial not in listing.stdout, (where, listing.stdout)
        assert shell.returncode != 0 and "uid=" not in shell.stdout, (where, shell.stdout)
    assert harness_device(fleet).shell("id").output.startswith("uid=")  # the run's own client still gets in


@pytest.mark.device
def test_a_fleet_in_a_deep_folder_listens_in_the_users_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A work folder too deep for a unix socket's address still gets a private socket: in the user's 0700
    state folder, removed when the fleet stops."""
    runtime = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short, as /run/user/UID is
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    try:
        with EmulatorFleet(["SM8650"], deep) as own:
            path = Path(own.server.path)
            assert path.is_relative_to(runtime / "qnnsuite" / "adb-servers") and path.is_socket()
            assert harness_device(own).shell("echo reached").output == "reached\n"
        assert not path.exists() and not path.parent.exists()
    finally:
        shutil.rmtree(runtime)


def test_the_runs_adb_server_listens_on_no_tcp_port_but_a_private_socket(fleet: EmulatorFleet) -> None:
    """Attack: another account looks for the run's adb server on a port (it listened on 127.0.0.1:PORT)."""
    assert fleet.server.path and fleet.server.address.startswith("localfilesystem:/")
    server_pid = fleet.started_pids[0]
    assert listening_tcp_ports([server_pid]) == []
    folder = os.lstat(Path(fleet.server.path).parent)
    assert folder.st_uid == os.getuid() and folder.st_mode & 0o077 == 0
    assert json.loads(json.dumps(fleet.describe()))["adb_server"] == fleet.server.address


def test_a_unix_server_device_label_cannot_be_confused_and_bad_ones_are_one_line() -> None:
    """Attack: a --device or ADB_SERVER_SOCKET value that smuggles a relative or dotted socket path."""
    from harness.device import discovery
    from harness.device.adb import AdbServer, split_label

    server = AdbServer.parse("localfilesystem:/run/user/0/qnnsuite/adb.sock", "--adb-server")
    assert split_label(f"{server.address}/127.0.0.1:4567") == (server.address, "127.0.0.1:4567")
    assert discovery._locate({server.address: {"127.0.0.1:4567": "device"}}, f"{server.address}/127.0.0.1:4567") == (
        server.address,
        "127.0.0.1:4567",
    )
    for bad in (
        "localfilesystem:adb.sock",
        "localfilesystem:/a/../etc/x",
        "localfilesystem:/a\nb",
        "localfilesystem:/" + "a" * 120,
    ):
        with pytest.raises(
            ValueError, match=r"^--adb-server localfilesystem:.*: write a unix socket server as "
        ) as error:
            AdbServer.parse(bad, "--adb-server")
        assert "\n" not in str(error.value)
    assert AdbServer.parse("127.0.0.1:5037", "--adb-server") == AdbServer("127.0.0.1", 5037)  # TCP still works


def test_an_output_file_planted_as_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    """Attack: a device shell plants output_0_0.raw as a symlink to a host file before the run writes it."""
    import numpy

    from harness.emulator import host_runner

    victim, outputs = tmp_path / "host-file", tmp_path / "outputs"
    victim.write_text("host data")
    outputs.mkdir()
    (outputs / "output_0_0.raw").symlink_to(victim)
    host_runner.write_new(outputs / "output_0_0.raw", numpy.zeros(2, dtype=numpy.float32))
    assert victim.read_text() == "host data"
    assert not (outputs / "output_0_0.raw").is_symlink() and (outputs / "output_0_0.raw").stat().st_size == 8


@pytest.mark.device
def test_a_device_shell_sees_none_of_the_runs_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a device shell prints its environment while the run holds a CI credential in its own."""
    monkeypatch.setenv("CI_SECRET_TOKEN", "hunter2-do-not-leak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-do-not-leak")
    with EmulatorFleet(["SM8650"], tmp_path / "fleet") as own:
        shown = harness_device(own).shell("env; echo HOME=$HOME").output
    assert "do-not-leak" not in shown and "CI_SECRET_TOKEN" not in shown and "AWS_SECRET" not in shown
    assert "ANDROID_DATA=/data" in shown and "PATH=" in shown  # a device's environment, and the shell works
    from harness.emulator.adbd import device_environment

    device = device_environment(
        {"CI_SECRET_TOKEN": "x", "QNNSUITE_PYTHON": "/py", "LD_LIBRARY_PATH": "/q", "HOME": "/root"}
    )
    assert "CI_SECRET_TOKEN" not in device and device["QNNSUITE_PYTHON"] == "/py" and device["HOME"] == "/data"


def test_network_listeners_are_told_from_loopback_ones() -> None:
    """What emulate's refusal reads: a socket on 0.0.0.0 or :: is beyond loopback, 127.0.0.1 and ::1 are not."""
    from harness.emulator.serve import network_listeners

    sockets = []
    try:
        for family, address in (
            (socket.AF_INET, "0.0.0.0"),
            (socket.AF_INET6, "::"),
            (socket.AF_INET, "127.0.0.1"),
            (socket.AF_INET6, "::1"),
        ):
            sock = socket.socket(family)
            sock.bind((address, 0))
            sock.listen()
            sockets.append(sock)
        found = [network_listeners(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert found == [["0.0.0.0"], ["::"], [], []]


def _emulate(*arguments: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "emulate", *arguments],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.device
def test_emulate_serves_on_a_private_socket_no_other_account_can_use(tmp_path: Path) -> None:
    """Attack: another account uses the server `python -m harness emulate` starts by default."""
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "emulate", "--soc", "SM8650"],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while (
            "emulate: serving; Ctrl-C stops" not in lines
            and time.monotonic() < deadline
            and (line := process.stdout.readline())
        ):
            lines.append(line.rstrip("\n"))
        exports = [line.removeprefix("emulate: export ") for line in lines if line.startswith("emulate: export ")]
        assert len(exports) == 1 and exports[0].startswith("ADB_SERVER_SOCKET=localfilesystem:/"), lines
        address = exports[0].partition("=")[2]
        serial = lines[0].split()[1]
        theirs = as_other_account([ADB, "-L", address, "-s", serial, "shell", "id"], tmp_path / "other-home")
        assert theirs.returncode != 0 and "uid=" not in theirs.stdout
        mine = subprocess.run(
            [ADB, "-s", serial, "shell", "id"],
            env={**os.environ, "ADB_SERVER_SOCKET": address},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert mine.stdout.startswith("uid=0"), mine.stderr
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    assert process.returncode == 0


@pytest.mark.parametrize("plant", ["foreign", "symlink", "non-empty", "foreign-parent"])
def test_write_sdk_refuses_a_folder_it_did_not_make_fresh(plant: str, tmp_path: Path) -> None:
    """Attack: another user prepares the --write-sdk/--write-build folder (theirs, a symlink to theirs, or
    holding their links), or the folder above it, before the user runs emulate."""
    from harness.emulator.phone import UnsafeDestination, fresh_folder

    target, elsewhere = tmp_path / "sdk", tmp_path / "elsewhere"
    elsewhere.mkdir()
    if plant == "foreign":
        target.mkdir()
        os.chown(target, 65534, 65534)
    elif plant == "symlink":
        target.symlink_to(elsewhere)
    elif plant == "non-empty":
        target.mkdir(mode=0o755)
        (target / "lib").symlink_to(elsewhere)
    else:
        parent = tmp_path / "shared"
        parent.mkdir()
        os.chown(parent, 65534, 65534)
        target = parent / "sdk"
    with pytest.raises(UnsafeDestination, match=r"^--write-sdk .*: name a new folder of yours") as error:
        fresh_folder(target, "--write-sdk")
    assert "\n" not in str(error.value) and list(elsewhere.iterdir()) == []
    fresh = fresh_folder(tmp_path / "new" / "sdk", "--write-sdk")  # the user's own new folder: made and used
    info = os.lstat(fresh)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o755 and list(fresh.iterdir()) == []


def test_emulate_write_build_into_a_symlink_is_one_line(tmp_path: Path) -> None:
    """Attack: --write-build names a symlink another user planted to their folder: emulate says so and ends."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "build").symlink_to(theirs)
    completed = _emulate("--write-build", str(tmp_path / "build"))
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == 1 and len(lines) == 1, completed.stderr
    assert lines[0] == (
        f"emulate: --write-build {tmp_path / 'build'} is a symlink: name a new folder of yours "
        f"(e.g. under $HOME) and it is created fresh"
    )
    assert list(theirs.iterdir()) == []
