"""Attacks on the suite, one test each: the emulated device is no back door, and hostile input harms nothing.

Each test's docstring names the attack. Devices are real emulated ones behind a real adb server, so the
authentication, the jail and the quoting are exercised as a run uses them.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import adbutils
import pytest

from harness.device import device as device_module
from harness.device.adb import AdbClient
from harness.device.device import Device, DeviceError, safe_pull_name
from harness.device.execute import BEFORE_RUNNER, run_started
from harness.device.pool import DeviceSpec, remove_run_folders
from harness.device.sync import SyncSession
from harness.emulator import jail, runner_client, runner_confinement, shell_paths
from harness.emulator.adb_auth import PublicKey, load_keys
from harness.emulator.adbd import HEADER, JAIL_ENV
from harness.emulator.launcher import ADB_SERVER_ENV, PROJECT_ROOT, EmulatorFleet, free_port, host_request
from harness.pipeline import card as card_registry
from harness.report import write_run
from harness.tests.test_report import COLUMNS, make_records, typed
from harness.user_state import UnsafeStateDir, open_append, state_dir

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
    server = subprocess.Popen([ADB, "-P", str(port), "server", "nodaemon"], env={**env, **ADB_SERVER_ENV, "HOME": str(home)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        time.sleep(1)
        states = dict(line.split("\t") for line in host_request(port, "host:devices").splitlines() if "\t" in line)
        shell = subprocess.run([ADB, "-P", str(port), "-s", serial, "shell", "touch /data/local/tmp/foreign"],
                               capture_output=True, text=True, timeout=30)
        assert (home / ".android" / "adbkey.pub").exists()  # it did have a key to offer: not the trusted one
        return states.get(serial), shell.returncode
    finally:
        with contextlib.suppress(OSError):
            host_request(port, "host:kill", timeout=5)
        server.wait(10)


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
        signed = subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", str(fleet.server_public_key.with_suffix("")),
                                 "-pkeyopt", "digest:sha1"], input=token, capture_output=True, check=True).stdout
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
    for command in (f"rm -f {target}", f"cd / && rm -f {str(target).lstrip('/')}",
                    f"cd /data/../{str(target.parent).lstrip('/')} && rm -f {target.name}"):
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
        spec = DeviceSpec(device.serial, "SM8650", 75, "x86_64", "Emulated SM8650", kind="emulated",
                          server=fleet.server.address)
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
    assert device.shell("mkdir -p /data/local/tmp/victim/outputs && touch /data/local/tmp/victim/keep "
                        "/data/local/tmp/victim/outputs/keep").exit_code == 0
    folder = "/data/local/tmp/qnnsuite/x /data/local/tmp/victim y"
    (tmp_path / "input.raw").write_bytes(b"1234")
    device.push_files([(tmp_path / "input.raw", f"{folder}/input.raw")])
    result = device.run(["sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "$(id)", "c;d"], cwd=folder, timeout_s=30,
                        first=BEFORE_RUNNER)
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


def test_list_name_with_dotdot_never_leaves_the_pull_folder(fleet: EmulatorFleet, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a device answers LIST with `../escape` (or `/abs`, `a/b`) and the pull writes outside its folder."""
    device = harness_device(fleet)
    assert device.shell("mkdir -p /data/local/tmp/pulls && echo x > /data/local/tmp/pulls/ok.raw").exit_code == 0
    pulled = tmp_path / "pull" / "outputs"
    assert device.pull_files("/data/local/tmp/pulls", pulled) == ["ok.raw"]
    monkeypatch.setattr(SyncSession, "list_files", lambda self, remote: ["ok.raw", "../escape"])
    with pytest.raises(DeviceError, match="listed a file named '../escape'"):
        device.pull_files("/data/local/tmp/pulls", pulled)
    assert not (tmp_path / "pull" / "escape").exists()
    assert [safe_pull_name(name) for name in ("ok.raw", "..", ".", "a/b", "/abs", "x\0y", "a\\b", "output_0_0.raw")] == [
        True, False, False, False, False, False, False, True]


def test_100_idle_connections_under_a_low_open_file_limit(fleet: EmulatorFleet) -> None:
    """Attack: 100 idle connections to a device whose open-file limit is 48 (accept fails with EMFILE)."""
    info = fleet.add_device("SM8650")
    port = int(info.serial.rpartition(":")[2])
    try:
        resource.prlimit(info.pid, resource.RLIMIT_NOFILE, (48, 48))
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        time.sleep(1.5)
        for sock in idle:
            sock.close()
        assert (info.root.parent / "adbd.log").read_text().count("Too many open files") > 0  # it did run out
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
    for garbage in (packet(b"CNXN", 0x01000001, 4096, b"host::\0", magic=0),
                    HEADER.pack(0x434E584E, 0x01000001, 4096, 1 << 30, 0, 0x434E584E ^ 0xFFFFFFFF), os.urandom(200)):
        with socket.create_connection(("127.0.0.1", device_port(fleet))) as sock:
            sock.sendall(garbage)
            with contextlib.suppress(ConnectionResetError):
                assert read_until_closed(sock, timeout_s=15) == b""
    assert harness_device(fleet).shell("echo alive").output == "alive\n"


def test_runner_server_refuses_paths_outside_its_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: a device command talks to its runner server directly, asking it to write a host folder."""
    root = tmp_path / "root"
    case = root / "data/local/tmp/case"
    case.mkdir(parents=True)
    (case / "input_list.txt").write_text("input_0_0.raw\n")
    monkeypatch.chdir(case)
    inside = ["--model_path", "model.pte", "--input_list_path", "input_list.txt", "--output_folder_path", "outputs"]
    assert runner_confinement.paths_outside(inside, root.resolve()) == []
    outside = [*inside[:5], str(tmp_path / "host-outputs")]
    assert runner_confinement.paths_outside(outside, root.resolve()) == [str(tmp_path / "host-outputs")]
    (case / "input_list.txt").write_text("/etc/passwd\n")
    assert runner_confinement.paths_outside(inside, root.resolve()) == ["/etc/passwd"]
    assert runner_confinement.confined(root.resolve())(inside) == runner_confinement.REFUSED_EXIT


def test_jailed_runner_client_sends_the_sandbox_paths_of_device_paths() -> None:
    """What the confinement above relies on: a jailed device's /data/... reaches the host-side server as the
    sandbox's host path, other paths unchanged (so the server judges them as they are)."""
    env = {"ANDROID_ROOT_SANDBOX": "/srv/root", "LD_LIBRARY_PATH": "/data/p:/opt/qnn/lib", "HOME": "/data"}
    argv, _, sent = runner_client.for_host(["--model_path=/data/m.pte", "--output_folder_path", "/data/o",
                                            "rel.txt", "/etc/passwd", "/srv/root/data/x"], "/data/local/tmp", env)
    assert argv == ["--model_path=/srv/root/data/m.pte", "--output_folder_path", "/srv/root/data/o", "rel.txt",
                    "/etc/passwd", "/srv/root/data/x"]
    assert sent["LD_LIBRARY_PATH"] == "/srv/root/data/p:/opt/qnn/lib" and sent["HOME"] == "/data"
    assert runner_client.for_host(["/data/m"], "/data", {})[0] == ["/data/m"]  # not on an emulated device: as given


HOSTILE_NAME = "evil\x1b[31m<script>alert(1)</script>\x00\udc80"
HOSTILE_MESSAGE = "runner said \x07\x1b[0m <b>bold</b> & \ud800 lone, \x0b tab\x0c"


def test_control_characters_and_lone_surrogates_keep_reports_well_formed(tmp_path: Path) -> None:
    """Attack: control characters and a lone surrogate in a card name, a failure message and a QNN log."""
    records = make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",))
    for record in records:
        record["card"] = HOSTILE_NAME
        record["case_id"] = f"{HOSTILE_NAME}-{record['dtype']}-{record['mode']}-SM8650"
    records[0].update(verdict="failed", message=HOSTILE_MESSAGE, evidence={"qnn_log": "QnnDsp \x1b[1m\udcff <err>"})
    folder = write_run(typed(records), {"SM8650": {"soc": "SM8650", "host": "h\x01"}}, tmp_path, "run-1", COLUMNS)["SM8650"]
    suite = ET.parse(folder / "junit.xml").getroot()
    failure = suite.find(".//failure")
    assert failure is not None and failure.get("message") == (
        "runner said \\x07\\x1b[0m <b>bold</b> & \\ud800 lone, \\x0b tab\\x0c")
    assert "\\u001b[1m\\udcff <err>" in (failure.text or "")  # the evidence, as JSON escapes it
    names = {case.get("name") for case in suite.iter("testcase")}
    assert f"evil\\x1b[31m<script>alert(1)</script>\\x00\\udc80-{records[0]['dtype']}-{records[0]['mode']}-SM8650" in names
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
    assert not any(char in html for char in "\x00\x01\x07\x0b\x0c\x1b") and "\\x1b[31m" in html
    assert "\\ud800 lone" in html and "\\udc80" in html
    assert json.loads((folder / "report.json").read_text())["cases"]
    assert "\\ud800 lone" in (folder / "summary.md").read_text(encoding="utf-8")
