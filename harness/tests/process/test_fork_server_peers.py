"""Attacks on a fork server, one test each: it serves only the run's own processes, and a request's
environment never reaches its child.

The server here is a real ForkServer process whose entry point writes the child's environment as JSON, so
each test sees exactly what a lowering's child would start with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.paths import REPO_ROOT
from harness.process import fork_client
from harness.process.fork_server import PARENT_ENV, stop_server, wait_until_serving, write_key

SERVER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from harness.process.fork_client import key_file_of
    from harness.process.fork_server import ForkServer
    path = Path(sys.argv[1])
    def entry(argv):
        print(json.dumps(dict(os.environ)))
    ForkServer(path, entry, "x", secret=Path(key_file_of(str(path))).read_text().strip()).serve()
    """
)
# A client in a pid and mount namespace of its own, as a jailed device command is, that can still name the
# socket (and read the secret): the namespaces alone must turn it away.
NAMESPACED = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    """A fork server started as the run starts one: its secret beside the socket, this process its parent;
    in a 0700 folder of its own directly in /tmp, which a test may open to other accounts."""
    folder = Path(tempfile.mkdtemp(prefix="qnnsuite-peers-", dir="/tmp"))
    path = folder / "env.sock"
    write_key(path)
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(path)],
        cwd=REPO_ROOT,
        env={**os.environ, "QNN_SDK_ROOT": "/server/sdk", PARENT_ENV: str(os.getpid())},
        stdout=open(folder / "server.log", "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_serving(process, path, timeout_s=60)
        yield path
    finally:
        stop_server(process)
        shutil.copy(folder / "server.log", tmp_path / "server.log")
        shutil.rmtree(folder)


def _child_environment(server: Path, tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    out = tmp_path / "child-env.json"
    with open(out, "wb") as stdout:
        status = fork_client.request(str(server), [], str(tmp_path), env, {1: stdout.fileno()})
    assert status == 0
    return json.loads(out.read_text())


def _client(server: Path, secret: str | None) -> str:
    """Python source of a client that sends one request, `secret` in place of the key file's when given."""
    override = f"fork_client.read_key = lambda path: {secret!r}\n" if secret is not None else ""
    return (
        "from harness.process import fork_client\n"
        + override
        + "try:\n"
        + f"    print('served', fork_client.request({str(server)!r}, [], '/', {{}}, {{}}))\n"
        + "except fork_client.NotStarted as refused:\n"
        + "    print('refused', refused.refusal)\n"
    )


def _refusals(server: Path) -> list[str]:
    return [line for line in (server.parent / "server.log").read_text().splitlines() if "refused a request" in line]


def test_a_request_without_the_secret_or_with_a_wrong_one_is_refused(server: Path, tmp_path: Path) -> None:
    """Attack: a process that reached the socket (not the run's key file) asks the server to run a lowering."""
    for secret in ("", "0" * 64):
        asked = subprocess.run(
            [sys.executable, "-c", _client(server, secret)], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert asked.stdout.strip() == "refused not a request of this run", asked.stdout + asked.stderr
    assert len(_refusals(server)) == 2 and "sent no or a wrong secret" in _refusals(server)[0]
    assert _child_environment(server, tmp_path, {}), "the run's own client, with the key, is served"


def test_a_jailed_or_foreign_peer_is_refused_even_with_the_secret(server: Path, tmp_path: Path) -> None:
    """Attack: a device command (own pid and mount namespaces) or a process outside the run (re-parented to
    init by a double fork) sends a request with the secret; uid 65534 sends one through an open socket."""
    if os.getuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a namespaced client")
    client = _client(server, None)
    jailed = subprocess.run(
        [*NAMESPACED, sys.executable, "-c", client], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert jailed.stdout.strip() == "refused not a request of this run", jailed.stdout + jailed.stderr
    orphan_code = f"import os, sys\nif os.fork():\n    os._exit(0)\nimport time; time.sleep(0.2)\n{client}"
    orphan = subprocess.run(
        [sys.executable, "-c", orphan_code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert orphan.returncode == 0 and orphan.stdout.strip() == "refused not a request of this run", orphan.stderr
    os.chmod(server.parent, 0o755)  # let uid 65534 reach the socket, as a wrongly opened folder would
    os.chmod(server, 0o777)
    other = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", client],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.stdout.strip() == "refused not a request of this run", other.stdout + other.stderr
    reasons = " | ".join(_refusals(server))
    assert "another pid and mnt namespace" in reasons and "uid 65534" in reasons, reasons
    assert "is not a process of the run" in reasons, reasons


def test_a_requests_environment_never_reaches_the_child(server: Path, tmp_path: Path) -> None:
    """Attack: a request names its own QNN_SDK_ROOT, PYTHONPATH and LD_PRELOAD (the quantizer imports
    $QNN_SDK_ROOT/lib/python/qti; a device's folder there would run as the suite's user)."""
    hostile = {
        "QNN_SDK_ROOT": "/data/local/tmp/sdk",
        "PYTHONPATH": "/data/local/tmp",
        "LD_PRELOAD": "/data/local/tmp/evil.so",
        "PYTHONSTARTUP": "/data/local/tmp/start.py",
    }
    child = _child_environment(server, tmp_path, {**os.environ, **hostile})
    assert child["QNN_SDK_ROOT"] == "/server/sdk"
    assert "LD_PRELOAD" not in child and "PYTHONSTARTUP" not in child
    assert child.get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    assert PARENT_ENV not in child
