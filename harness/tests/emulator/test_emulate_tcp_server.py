"""Attack through `python -m harness emulate --adb-port`: an adb server authenticates no client, so any local
account that can open its TCP port, loopback included, would get the emulated devices' root shells. Without
--allow-tcp-server the command refuses in one line and serves nothing, and with it still refuses a server
that listens beyond loopback unless --allow-network-server says so (harness/emulator/serve.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from harness.emulator.launcher import ADB_SERVER_ENV, free_port, host_request
from harness.tests.security.test_security import ADB, _emulate, as_other_account, listening_tcp_ports


@contextlib.contextmanager
def adb_server_on(port: int, home: Path, *flags: str) -> Iterator[None]:
    """A user's own adb server on a TCP port (`flags`: e.g. -a), listening until the block ends."""
    home.mkdir(exist_ok=True)
    server = subprocess.Popen(
        [ADB, *flags, "-P", str(port), "server", "nodaemon"],
        env={**os.environ, **ADB_SERVER_ENV, "HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not listening_tcp_ports([server.pid]):
            assert time.monotonic() < deadline, "the adb server did not start"
            time.sleep(0.1)
        yield
    finally:
        with contextlib.suppress(OSError):
            host_request(port, "host:kill", timeout=5)
        server.wait(10)


def test_emulate_refuses_a_server_started_with_adb_a(tmp_path: Path) -> None:
    """Attack (by mistake): `emulate --adb-port` on a rack's `adb -a` server would serve root shells to the network."""
    port = free_port()
    with adb_server_on(port, tmp_path / "home", "-a"):
        refused = _emulate("--soc", "SM8650", "--adb-port", str(port), "--allow-tcp-server")
        assert host_request(port, "host:devices") == ""  # nothing was served on it
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert (
        lines[0].startswith(f"emulate: the adb server on port {port} listens on ")
        and "--allow-network-server" in lines[0]
    )


def test_emulate_refuses_a_loopback_tcp_server_without_the_flag(tmp_path: Path) -> None:
    """Attack: uid 65534 runs `adb -P PORT shell` against the loopback server `emulate --adb-port` served on."""
    port = free_port()
    with adb_server_on(port, tmp_path / "home"):
        refused = _emulate("--soc", "SM8650", "--adb-port", str(port))
        assert host_request(port, "host:devices") == "", "nothing was served on it"
        theirs = as_other_account([ADB, "-P", str(port), "shell", "id"], tmp_path / "other-home")
        assert theirs.returncode != 0 and "uid=" not in theirs.stdout, theirs.stdout
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"emulate: --adb-port {port}: any local account can use a TCP adb server")
    assert lines[0].endswith("or pass --allow-tcp-server if that is meant")
