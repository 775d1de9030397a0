"""Attack through `python -m harness emulate --adb-port`: an adb server authenticates no client, so any local
account that can open its TCP port, loopback included, would get the emulated devices' root shells. Without
--allow-tcp-server the command refuses in one line and serves nothing (harness/emulator/serve.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import adbutils

from harness.emulator.launcher import ADB_SERVER_ENV, free_port, host_request
from harness.paths import REPO_ROOT
from harness.tests.test_security import as_other_account, listening_tcp_ports

ADB = os.environ.get("ADBUTILS_ADB_PATH") or adbutils.adb_path()


def test_emulate_refuses_a_loopback_tcp_server_without_the_flag(tmp_path: Path) -> None:
    """Attack: uid 65534 runs `adb -P PORT shell` against the loopback server `emulate --adb-port` served on."""
    port, home = free_port(), tmp_path / "home"
    home.mkdir()
    server = subprocess.Popen(
        [ADB, "-P", str(port), "server", "nodaemon"],
        env={**os.environ, **ADB_SERVER_ENV, "HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not listening_tcp_ports([server.pid]):
            assert time.monotonic() < deadline, "the loopback adb server did not start"
            time.sleep(0.1)
        refused = subprocess.run(
            [sys.executable, "-m", "harness", "emulate", "--soc", "SM8650", "--adb-port", str(port)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert host_request(port, "host:devices") == "", "nothing was served on it"
        theirs = as_other_account([ADB, "-P", str(port), "shell", "id"], tmp_path / "other-home")
        assert theirs.returncode != 0 and "uid=" not in theirs.stdout, theirs.stdout
    finally:
        with contextlib.suppress(OSError):
            host_request(port, "host:kill", timeout=5)
        server.wait(10)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"emulate: --adb-port {port}: any local account can use a TCP adb server")
    assert lines[0].endswith("or pass --allow-tcp-server if that is meant")
