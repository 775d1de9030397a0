"""Lab faults and their bounds: a full or read-only report folder, a runner that floods its
output, an output file far larger than its program's, a wedged adb server, the run's adb server killed or
replaced on its socket, torn state files and a card's helper module that changes. Each test breaks one thing and asserts the one line, the exit code or verdict,
what is written and that nothing is left running; and a healthy input the defence must leave alone.
docs/FAULTS.md is the table of every fault the harness tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import run_records
from harness.device import shell_v2
from harness.device.adb import AdbClient
from harness.device.device import Device, DeviceError
from harness.device.execute import DeviceRunRequest, RunnerFailed, Workspace, run_case
from harness.device.payload import RUNNER_NAME
from harness.emulator.launcher import EmulatorFleet
from harness.files import say
from harness.tests.child_suite import run_suite, start_suite
from harness.tests.waiting import is_gone, wait_for

# --- device output and adb calls are bounded ------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, toolchain):
    device_env = {**toolchain.child_env(), "QNNSUITE_PYTHON": sys.executable}
    with EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("fleet"), device_env=device_env) as started:
        yield started


@pytest.fixture
def device(fleet) -> Device:
    return Device(fleet.devices[0].serial, AdbClient(server=fleet.server))


def _fake_runner(device: Device, tmp_path: Path, name: str, script: str) -> Workspace:
    """A workspace whose qnn_executor_runner is this shell script (the runner's contract, its fault)."""
    workspace = device.workspace(name)
    runner = tmp_path / RUNNER_NAME
    runner.write_text("#!/bin/sh\n" + script + "\n")
    device.push_files([(runner, f"{workspace}/{RUNNER_NAME}")], mode=0o755)
    return Workspace(workspace, workspace)


def _pte(tmp_path: Path) -> Path:
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"read by no one: the fake runner ignores it")
    return pte


def test_a_runner_flooding_stderr_keeps_the_last_bytes_and_counts_the_rest(device, tmp_path, monkeypatch):
    monkeypatch.setattr(shell_v2, "OUTPUT_KEEP_BYTES", 1 << 20)
    flood = len("runner: noise\n") * (4 << 20)  # whole lines, 56 MiB
    workspace = _fake_runner(
        device,
        tmp_path,
        "flood",
        f"yes runner: noise | head -c {flood} >&2\necho 'runner: flooded, giving up' >&2\nexit 3",
    )
    with pytest.raises(RunnerFailed) as failure:
        run_case(
            device,
            workspace,
            DeviceRunRequest("case", _pte(tmp_path), [()], tmp_path / "local", output_count=1, timeout_s=60),
        )
    assert "exited 3 (last words: runner: flooded, giving up)" in str(failure.value)
    log = (tmp_path / "local" / "runner.log").read_bytes()
    assert len(log) < (1 << 20) + 200, "the runner's log keeps the last OUTPUT_KEEP_BYTES"
    first, _, rest = log.partition(b"\n")
    dropped = int(first.split()[1])
    assert first.startswith(b"... ") and b"bytes dropped" in first and dropped + len(rest) == flood + 27
    device.remove_workspaces()


def test_output_within_the_bound_is_kept_whole(device):
    result = device.run(
        ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' y; echo; echo end >&2"], cwd="/data/local/tmp", timeout_s=30
    )
    assert result.exit_code == 0 and "dropped" not in result.output
    assert result.output.count("y") == 100000 and result.stderr == "end\n"


def test_an_output_file_larger_than_its_program_s_fails_the_case_unpulled(device, tmp_path):
    workspace = _fake_runner(device, tmp_path, "oversized", "truncate -s 2147483648 outputs/output_0_0.raw; exit 0")
    started = time.monotonic()
    with pytest.raises(RunnerFailed) as failure:
        run_case(
            device,
            workspace,
            DeviceRunRequest(
                "case", _pte(tmp_path), [()], tmp_path / "local", output_count=1, timeout_s=60, output_bytes=[[64]]
            ),
        )
    assert time.monotonic() - started < 30
    assert "wrote too much: output_0_0.raw is 2147483648 bytes, expected 64 (not pulled)" in str(failure.value)
    assert not (tmp_path / "local" / "outputs" / "output_0_0.raw").exists()
    device.remove_workspaces()


def test_an_output_file_of_its_program_s_size_is_pulled(device, tmp_path):
    workspace = _fake_runner(
        device,
        tmp_path,
        "exact",
        "head -c 64 /dev/zero > outputs/output_0_0.raw; head -c 9 /dev/zero > outputs/stray.bin; exit 0",
    )
    run = run_case(
        device,
        workspace,
        DeviceRunRequest(
            "case", _pte(tmp_path), [()], tmp_path / "local", output_count=1, timeout_s=60, output_bytes=[[64]]
        ),
    )
    assert [array.nbytes for array in run.outputs[0]] == [64]
    assert not (tmp_path / "local" / "outputs" / "stray.bin").exists(), "only the expected files are pulled"
    device.remove_workspaces()


class WedgedServer:
    """An adb server that accepts connections and never answers (wedged)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


def test_a_wedged_server_costs_a_first_shell_seconds_not_ten_minutes(monkeypatch):
    """adbutils asks the device's features before a first shell v2, with a 600 s default timeout."""
    from harness.device import adb as adb_module

    monkeypatch.setattr(adb_module, "CONNECT_TIMEOUT_S", 1.0)
    server = WedgedServer()
    client = AdbClient(host="127.0.0.1", port=server.port)
    client._server_version = 41  # the version request is a host request, bounded already
    started = time.monotonic()
    try:
        with pytest.raises(DeviceError) as failure:
            Device("emulator-5554", client).shell("echo ok", timeout_s=5)
    finally:
        server.close()
    assert time.monotonic() - started < 15, "bounded by the connection timeout, not adbutils' 600 s"
    assert str(failure.value).startswith("device emulator-5554 ") and "\n" not in str(failure.value)
    print(f"wedged server: {time.monotonic() - started:.1f} s: {failure.value}")


def test_the_bounded_read_keeps_output_whole_when_it_fits():
    tail = shell_v2.Tail(10)
    tail.write(b"abc")
    assert tail.value() == b"abc"
    for _ in range(5):
        tail.write(b"0123456789")
    assert tail.value() == b"... 43 bytes dropped (only the last 10 are kept)\n0123456789"


# --- torn state files are treated as missing, with one line ----------------------------------------------


def _probe_cache(tmp_path: Path, monkeypatch) -> tuple[object, list, callable]:
    from types import SimpleNamespace

    from harness.qnn import toolchain as toolchain_module

    probes = []
    fresh = toolchain_module.Probe("build-1", False, None, None, "ok", None)
    monkeypatch.setattr(toolchain_module, "state_dir", lambda: tmp_path / "state")
    monkeypatch.setattr(toolchain_module, "_measure", lambda overlay: probes.append(overlay) or fresh)
    library = tmp_path / "libQnnHtp.so"
    library.write_bytes(b"\x7fELF")
    sdk = SimpleNamespace(htp_library=library)
    return fresh, probes, lambda: toolchain_module._cached_probe(sdk, tmp_path, library)


def test_a_torn_probe_cache_is_probed_again_with_one_line(tmp_path, monkeypatch, capsys):
    fresh, probes, cached_probe = _probe_cache(tmp_path, monkeypatch)
    assert cached_probe() == fresh and len(probes) == 1
    (entry,) = (tmp_path / "state" / "probe").iterdir()
    entry.write_text(entry.read_text()[:20])  # torn, as a run killed mid-write by an older suite left it
    assert cached_probe() == fresh and len(probes) == 2, "probed again, not a JSONDecodeError for every later run"
    (said,) = capsys.readouterr().err.splitlines()
    assert said.startswith(f"qnnsuite: probe cache {entry} is unreadable (JSONDecodeError: ") and said.endswith(
        "treated as missing"
    )
    assert cached_probe() == fresh and len(probes) == 2, "the entry was rewritten whole"
    assert [p.name for p in entry.parent.iterdir()] == [entry.name], "no temporary file left beside it"


def test_a_sound_probe_cache_is_served_silently(tmp_path, monkeypatch, capsys):
    fresh, probes, cached_probe = _probe_cache(tmp_path, monkeypatch)
    cached_probe()
    assert cached_probe() == fresh and len(probes) == 1 and capsys.readouterr().err == ""


def _lowering_entry(tmp_path: Path, facts) -> Path:
    directory = tmp_path / "entry"
    directory.mkdir()
    facts.write(directory / "facts.json")
    (directory / "lower.log").write_text("")
    return directory


def test_a_non_cacheable_facts_json_left_by_a_killed_run_is_not_served(tmp_path, capsys):
    """A machine failure's facts.json is removed by the run that wrote it; killed in between, it stays."""
    from types import SimpleNamespace

    from harness.pipeline.facts import LoweringFacts
    from harness.pipeline.lowering_cache import served as served_from_cache

    directory = _lowering_entry(tmp_path, LoweringFacts.crashed("lowering process was killed by SIGKILL"))
    assert served_from_cache(SimpleNamespace(id="counter_add-fp16"), directory) is None
    (said,) = capsys.readouterr().err.splitlines()
    assert (
        "cached lowering of counter_add-fp16 is damaged (" in said
        and "records a failure of the machine (LoweringCrashed), never served from the cache); lowering it again"
        in said
    )


def test_a_case_s_own_lowering_failure_is_served_from_the_cache(tmp_path, capsys):
    from types import SimpleNamespace

    from harness.pipeline.facts import LoweringError, LoweringFacts
    from harness.pipeline.lowering_cache import served as served_from_cache

    directory = _lowering_entry(tmp_path, LoweringFacts(error=LoweringError("RuntimeError", "unsupported op")))
    served = served_from_cache(SimpleNamespace(id="counter_add-fp16"), directory)
    assert served is not None and served.facts.error.message == "unsupported op" and capsys.readouterr().err == ""


def test_a_torn_facts_json_is_lowered_again(tmp_path, capsys):
    from types import SimpleNamespace

    from harness.pipeline.facts import LoweringError, LoweringFacts
    from harness.pipeline.lowering_cache import served as served_from_cache

    directory = _lowering_entry(tmp_path, LoweringFacts(error=LoweringError("RuntimeError", "unsupported op")))
    (directory / "facts.json").write_text('{"timings_s": {}, "err')
    assert served_from_cache(SimpleNamespace(id="c"), directory) is None
    assert "unreadable facts (JSONDecodeError" in capsys.readouterr().err


# --- the lowering key covers a card's helper modules ------------------------------------------------------


def _user_tree(tmp_path: Path, monkeypatch, request, package: str) -> Path:
    """A user's tree: a cards module importing a helper of its package (relatively, inside a function too)
    and a sibling top-level module; an installed package it imports stays out of the key."""
    tree = tmp_path / "tree"
    (tree / package).mkdir(parents=True)
    (tree / package / "__init__.py").write_text("")
    (tree / package / "cards.py").write_text(
        f"import json\nfrom . import helpers\nimport {package}_shared\n\ndef build():\n"
        "    from .lazy import WIDTH\n    return helpers.SCALE * WIDTH\n"
    )
    (tree / package / "helpers.py").write_text("SCALE = 2\n")
    (tree / package / "lazy.py").write_text("WIDTH = 4\n")
    (tree / package / "unrelated.py").write_text("NOT_IMPORTED = 1\n")
    (tree / f"{package}_shared.py").write_text("import pytest\nOFFSET = 1\n")
    monkeypatch.syspath_prepend(str(tree))
    loaded = set(sys.modules)
    __import__(f"{package}.cards")
    request.addfinalizer(lambda: [sys.modules.pop(name, None) for name in set(sys.modules) - loaded])
    return tree


@pytest.mark.parametrize(
    "edited, changes",
    [
        ("{p}/helpers.py", True),
        ("{p}/lazy.py", True),
        ("{p}_shared.py", True),
        ("{p}/cards.py", True),
        ("{p}/unrelated.py", False),
    ],
)
def test_the_lowering_key_covers_the_modules_a_card_imports_from_the_user_s_tree(
    tmp_path, monkeypatch, request, edited, changes
):
    from types import SimpleNamespace

    from harness.pipeline import cache

    package = f"labcards_{abs(hash((edited, str(tmp_path)))) % 10**8}"
    tree = _user_tree(tmp_path, monkeypatch, request, package)
    case = SimpleNamespace(card=SimpleNamespace(name="helper_card", module=f"{package}.cards"))
    cache._card_sources.cache_clear()
    before = cache.eager_key(case, 4), cache.exported_key(case, 4)
    path = tree / edited.format(p=package)
    path.write_text(path.read_text() + "# edited\n")
    cache._card_sources.cache_clear()  # a new run
    after = cache.eager_key(case, 4), cache.exported_key(case, 4)
    assert (before != after) == changes, edited
    cache._card_sources.cache_clear()


# --- reports on a full or read-only filesystem ----------------------------------------------------------

PAGE = 4096


@contextlib.contextmanager
def _tmpfs(where: Path, size: int, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of `size` bytes (a whole number of pages) at where; skips where this account cannot mount."""
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def _reporter(report_dir: Path, work_dir: Path):
    from types import SimpleNamespace

    from harness.context import RunContext
    from harness.reporter import ConformanceReporter
    from harness.tests.report.test_report import make_records, typed

    options = SimpleNamespace(qnn_sdk=None, report_dir=report_dir, baseline=None, allow_missing=False, shard=None)
    work_dir.mkdir(parents=True, exist_ok=True)
    reporter = ConformanceReporter(options, RunContext("run1", (), {}, (), work_dir), None)
    reporter.records = typed(make_records(cards={"counter_add": ("counter",)}, socs=("SM8650",)))
    return reporter


def _report_json_bytes(tmp_path: Path, monkeypatch) -> int:
    from harness import reporter as reporter_module

    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: None)
    probe = _reporter(tmp_path / "measure", tmp_path / "measure-work")
    probe.pytest_sessionfinish(SimpleNamespace(exitstatus=0))
    return (tmp_path / "measure" / "run1" / "SM8650" / "report.json").stat().st_size


class _Terminal:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_a_disk_full_at_report_time_keeps_report_json_and_the_records_and_exits_6(tmp_path, monkeypatch, capfd):
    """Room for report.json and no more: it is written first, the rest fails in one line, the records go to
    the work folder (another filesystem), `latest` stays at the last complete run, exit 6."""
    from harness import reporter as reporter_module

    pages = -(-_report_json_bytes(tmp_path, monkeypatch) // PAGE)
    with _tmpfs(tmp_path / "full", pages * PAGE) as mount:
        (mount / "run0").mkdir()
        (mount / "latest").symlink_to("run0")
        reporter = _reporter(mount, tmp_path / "work")
        session = SimpleNamespace(exitstatus=0)
        reporter.pytest_sessionfinish(session)
        terminal = _Terminal()
        reporter.write_summary(terminal)
        assert session.exitstatus == reporter_module.REPORTS_NOT_WRITTEN == 6 and reporter.failed
        (line,) = terminal.lines[1:]
        assert (
            line.startswith("reports not written: No space left on device (")
            and "report.json written for SM8650" in line
        )
        assert f"the records are in {tmp_path / 'work' / 'records.json'}" in line and "(exit 6)" in line
        kept = json.loads((tmp_path / "work" / "records.json").read_text())
        assert [r["verdict"] for r in kept] == [r.verdict for r in reporter.records]
        assert json.loads((mount / "run1" / "SM8650" / "report.json").read_text())["summary"]["total"] == len(kept)
        assert os.readlink(mount / "latest") == "run0", "latest names the last complete run"
        assert sorted(p.name for p in mount.iterdir()) == ["latest", "run0", "run1"], "no staging link left"
    assert "Traceback" not in capfd.readouterr().err


def test_with_every_folder_full_the_records_are_printed_compactly(tmp_path, monkeypatch):
    from harness import reporter as reporter_module

    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: None)
    with _tmpfs(tmp_path / "full", PAGE) as mount:
        (mount / "filler").write_bytes(b"x" * PAGE)
        reporter = _reporter(mount / "reports", mount / "work")
        monkeypatch.setattr(reporter_module, "state_dir", lambda name: mount / "state")
        session = SimpleNamespace(exitstatus=0)
        reporter.pytest_sessionfinish(session)
        terminal = _Terminal()
        reporter.write_summary(terminal)
    assert session.exitstatus == 6
    assert (
        "report.json written for no SoC" in terminal.lines[1]
        and "they follow, one JSON line per check" in terminal.lines[1]
    )
    printed = [json.loads(line) for line in terminal.lines[2:]]
    assert [r["nodeid"] for r in printed] == [r.nodeid for r in reporter.records]


def test_a_disk_with_room_gets_every_report_and_moves_latest(tmp_path, monkeypatch):
    pages = -(-_report_json_bytes(tmp_path, monkeypatch) // PAGE)
    with _tmpfs(tmp_path / "roomy", (pages + 64) * PAGE) as mount:
        reporter = _reporter(mount, tmp_path / "work")
        session = SimpleNamespace(exitstatus=0)
        reporter.pytest_sessionfinish(session)
        assert session.exitstatus == 0 and not reporter.failed
        assert os.readlink(mount / "latest") == "run1"
        assert {p.name for p in (mount / "run1" / "SM8650").iterdir()} >= {
            "report.json",
            "junit.xml",
            "summary.md",
            "report.html",
        }


def test_a_broken_stderr_cannot_turn_a_diagnostic_line_into_an_error(monkeypatch):
    class Full:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def flush(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sys, "stderr", Full())
    say("qnnsuite: no reproduction bundle for c (OSError: No space left on device)")  # does not raise


@pytest.mark.child_suite
def test_a_read_only_report_dir_is_a_usage_error_before_anything_starts(tmp_path):
    with _tmpfs(tmp_path / "ro", PAGE, read_only=True) as mount:
        completed = run_suite("--emulate", "SM8650", "--report-dir", str(mount / "reports"), timeout=300)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 4, output[-2000:]
    assert "INTERNALERROR" not in output and "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.strip()]
    assert (
        line == f"ERROR: --report-dir {mount / 'reports'}: {mount} is on a read-only filesystem: pass a folder "
        f"this user can write to"
    )
    assert "health check" not in output, "refused before any device or lowering starts"


@pytest.mark.child_suite
def test_a_report_dir_full_before_the_run_is_one_line_and_exit_6_before_anything_starts(tmp_path):
    """A report folder whose disk is full when the run starts: the run's first file there (run-context.json)
    failed as some 30 INTERNALERROR lines, exit 3, after the devices had started. Now one line, the reports'
    own exit code (6), before any device or lowering starts; a disk with room is not refused (the roomy run
    of test_a_suite_run_whose_report_disk_fills_up_exits_6_with_its_verdicts_kept starts on 1 MiB)."""
    from harness.files import REPORT_ROOM_BYTES, no_room_reason

    with _tmpfs(tmp_path / "full", PAGE) as mount:
        (mount / "filler").write_bytes(b"x" * PAGE)
        completed = run_suite("--emulate", "SM8650", "--report-dir", str(mount / "reports"), timeout=300)
        assert not (mount / "reports").exists(), "nothing was written"
    output = completed.stdout + completed.stderr
    assert completed.returncode == 6, output[-2000:]
    assert "INTERNALERROR" not in output and "Traceback" not in output
    (line,) = [line for line in output.splitlines() if line.strip()]
    assert f"--report-dir {mount / 'reports'}: the disk holding {mount} is full" in line and "(nothing was run)" in line
    assert "health check" not in output, "refused before any device or lowering starts"
    with _tmpfs(tmp_path / "roomy", REPORT_ROOM_BYTES + 16 * PAGE) as mount:
        assert no_room_reason(mount / "reports") is None


def _suite(report_dir: Path, cache_dir: Path, **popen: object) -> subprocess.Popen:
    arguments = (
        "-W",
        "ignore",
        "-rfE",
        "--emulate",
        "SM8650",
        "--dtype",
        "fp16",
        "-k",
        "counter_add",
        "--cache-dir",
        str(cache_dir),
        "--report-dir",
        str(report_dir),
    )
    return start_suite(
        *arguments,
        env={**os.environ, "COLUMNS": "400"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


# A bound, not an expectation: a small suite run takes 1-3 min on a quiet 2-core machine, and took over 15 at
# load 25 (a default run and other tests beside it: bench/stress_tests.py), which a 900 s bound failed.
SUITE_RUN_BOUND_S = 2400


def _fill(folder: Path) -> None:
    """Write until the filesystem is full."""
    try:
        with open(folder / "filler", "wb", buffering=0) as filler:
            while True:
                filler.write(b"\0" * 65536)
    except OSError as error:
        assert error.errno == errno.ENOSPC, error


@pytest.mark.child_suite
def test_a_suite_run_whose_report_disk_fills_up_exits_6_with_its_verdicts_kept(tmp_path):
    """A real run on an emulated device; its report folder's disk fills while the cases run. The healthy
    run before it (same cache, a roomy folder) exits 0 and moves `latest`."""
    from harness.context import RunContext

    cache_dir = tmp_path / "cache"
    healthy = _suite(tmp_path / "roomy", cache_dir)
    output = healthy.communicate(timeout=SUITE_RUN_BOUND_S)[0]
    assert healthy.returncode == 0, output[-3000:]
    assert (tmp_path / "roomy" / "latest" / "SM8650" / "report.html").is_file()
    with _tmpfs(tmp_path / "full", 256 * PAGE) as mount:
        (mount / "run0").mkdir()
        (mount / "latest").symlink_to("run0")
        run = _suite(mount, cache_dir)
        try:
            deadline = time.monotonic() + SUITE_RUN_BOUND_S
            while not list(mount.glob("*/run-context.json")) and run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            (published,) = mount.glob("*/run-context.json")
            context = RunContext.from_json(published.read_text())
            _fill(mount)
            output = run.communicate(timeout=SUITE_RUN_BOUND_S)[0]
        finally:
            run.kill()  # only when the test failed before the run ended: it must not outlive the test
            run.wait()
        try:
            assert run.returncode == 6, output[-3000:]
            assert "Traceback" not in output and "INTERNALERROR" not in output and " ERROR " not in output, output[
                -3000:
            ]
            (line,) = [line for line in output.splitlines() if line.startswith("reports not written: ")]
            assert (
                "No space left on device" in line and f"the records are in {context.work_dir / 'records.json'}" in line
            )
            kept = json.loads((context.work_dir / "records.json").read_text())
            healthy_report = json.loads((tmp_path / "roomy" / "latest" / "SM8650" / "report.json").read_text())
            expected = {
                (case["case_id"], name): check["verdict"]
                for case in healthy_report["cases"]
                for name, check in case["checks"].items()
            }
            assert kept and {(r["case_id"], r["check"]): r["verdict"] for r in kept} == expected, (
                "the cases' verdicts are kept, as the healthy run found them"
            )
            assert os.readlink(mount / "latest") == "run0"
            alive = [pid for pid in context.started_pids if run_records.start_time(pid) is not None]
            assert alive == [], f"processes left running: {alive}"
            stray = subprocess.run(
                ["pgrep", "-f", str(context.work_dir)], capture_output=True, text=True
            ).stdout.split()
            assert stray == [], stray
        finally:
            shutil.rmtree(context.work_dir, ignore_errors=True)


@pytest.mark.parametrize("bundled", [False, True])
def test_a_failing_check_whose_bundle_could_not_be_written_is_a_line_in_the_summary(tmp_path, monkeypatch, bundled):
    from dataclasses import replace

    from harness import reporter as reporter_module

    monkeypatch.setattr(reporter_module, "prepare", lambda sdk: None)
    reporter = _reporter(tmp_path / "reports", tmp_path / "work")
    failed = replace(
        reporter.records[0],
        verdict="failed",
        message="state differs at step 2",
        repro=f"repro/{reporter.records[0].case_id}" if bundled else "",
    )
    reporter.records[0] = failed
    reporter.pytest_sessionfinish(SimpleNamespace(exitstatus=0))
    lines = [line for line in reporter._lines if "no reproduction bundle" in line]
    assert lines == (
        []
        if bundled
        else [
            f"1 check(s) have no reproduction bundle (it could not be written; stderr says why), "
            f"e.g. {failed.case_id} {failed.check}"
        ]
    )


# --- the run's adb server restarted or replaced mid-run ----------------------------------------------------


@pytest.fixture(scope="module")
def reconnect_cache(tmp_path_factory) -> Path:
    """One artifact cache for the two runs below: the second lowers nothing, so its bound is the device layer's."""
    return tmp_path_factory.mktemp("reconnect-cache")


def _run_killing_its_server(tmp_path: Path, cache_dir: Path, replace: Path | None):
    """A suite run (one emulated SM8650, no xdist, -s so that the device layer's lines reach the output) whose
    private adb server is SIGKILLed once the health check is done; with `replace`, another server is started on
    the same socket a second later, the way another tool would: the stock adb with `-L localfilesystem:PATH
    server nodaemon` and the adb home of the fleet whose work folder `replace` is (launcher.server_environment;
    the run's own, context.work_dir / "emulator", is the key the devices trust; any other a key of its own).
    Returns (the run's output, its exit code, the run context, (seconds from the kill to the run's end, seconds
    from the launch to the kill), the replacement server's process or None)."""
    import adbutils

    from harness.context import RunContext
    from harness.emulator.launcher import server_environment

    reports = tmp_path / "reports"
    arguments = ("-s", "-W", "ignore", "--emulate", "SM8650", "--dtype", "fp16", "-k", "counter_add")
    arguments += ("--runner-timeout", "60", "--cache-dir", str(cache_dir), "--report-dir", str(reports))
    launched = time.monotonic()
    run = start_suite(
        *arguments,
        env={**os.environ, "COLUMNS": "400"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    replacement = None
    try:
        deadline, context = time.monotonic() + SUITE_RUN_BOUND_S, None
        while time.monotonic() < deadline and run.poll() is None:
            published = list(reports.glob("*/run-context.json"))
            context = RunContext.from_json(published[0].read_text()) if published else None
            if context and (context.provenance or context.quarantined):  # the health check is done
                break
            time.sleep(0.2)
        assert context and context.provenance, "the run published no checked context"
        servers = [pid for pid in context.started_pids if _argv(pid)[1:2] == [b"-L"]]  # adb -L ADDRESS server
        assert len(servers) == 1, f"one private adb server among {context.started_pids}"
        server = servers[0]
        os.kill(server, signal.SIGKILL)
        killed = time.monotonic()
        if replace is not None:  # once the killed server is gone, so the replacement does not race its exit
            wait_for(lambda: is_gone(server), timeout_s=30, what=f"the killed adb server {server} to exit")
            replace = context.work_dir / "emulator" if replace == Path("run") else replace
            (replace / "adb-home").mkdir(parents=True, exist_ok=True)
            address = context.devices[0].server
            replacement = subprocess.Popen(
                [adbutils.adb_path(), "-L", address, "server", "nodaemon"],
                env=server_environment(replace),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        output = run.communicate(timeout=SUITE_RUN_BOUND_S)[0]
        return output, run.returncode, context, (time.monotonic() - killed, killed - launched), replacement
    finally:
        run.kill()  # only when the test failed before the run ended: it must not outlive the test
        run.wait()


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _verdicts(reports: Path) -> dict[tuple[str, str], dict]:
    report = json.loads((reports / "latest" / "SM8650" / "report.json").read_text())
    return {(case["case_id"], name): check for case in report["cases"] for name, check in case["checks"].items()}


def _assert_nothing_left(context) -> None:
    alive = [pid for pid in context.started_pids if run_records.start_time(pid) is not None]
    assert alive == [], f"processes left running: {alive}"
    stray = subprocess.run(["pgrep", "-f", str(context.work_dir)], capture_output=True, text=True).stdout.split()
    assert stray == [], stray


@pytest.mark.child_suite
def test_an_adb_server_replaced_on_the_run_s_socket_gets_the_devices_back_and_the_cases_pass(tmp_path, reconnect_cache):
    output, code, context, _, replacement = _run_killing_its_server(tmp_path, reconnect_cache, replace=Path("run"))
    try:
        assert code == 0, output[-3000:]
        assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
        checks = _verdicts(tmp_path / "reports")
        device_checks = [check for check in checks.values() if check.get("retries")]
        assert device_checks, "the cases that met the dropped server were retried (the retry is in the report)"
        assert {check["verdict"] for check in checks.values()} <= {"passed", "xfailed", "skipped"}, checks
        restored = [line for line in output.splitlines() if line.startswith("adb server ")]
        assert len(restored) == 1 and " restored: 1 device(s) connected again after " in restored[0], restored
        assert replacement.wait(timeout=30) is not None, "the run's stop ended the server that replaced its own"
        _assert_nothing_left(context)
    finally:
        if replacement.poll() is None:
            replacement.kill()
        replacement.wait()
        shutil.rmtree(context.work_dir, ignore_errors=True)


@pytest.mark.child_suite
def test_an_adb_server_that_never_comes_back_still_gives_one_line_infrastructure_errors_in_bounded_time(
    tmp_path, reconnect_cache
):
    from harness.providers import RESTORE_EMULATED_S

    output, code, context, (after_kill_s, startup_s), _ = _run_killing_its_server(
        tmp_path, reconnect_cache, replace=None
    )
    try:
        assert code == pytest.ExitCode.TESTS_FAILED, output[-3000:]
        assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
        checks = _verdicts(tmp_path / "reports")
        lost = [check for check in checks.values() if check["verdict"] == "infra_error"]
        assert lost and all("\n" not in check["message"] and "lost" in check["message"] for check in lost), checks
        (line,) = [line for line in output.splitlines() if line.startswith("adb server ")]
        assert f"did not come back within {RESTORE_EMULATED_S:.0f} s" in line, line
        # One bounded wait per run (then the device is lost at once), plus the lowering-free run's own seconds,
        # which a loaded machine stretches as it stretched the run's start (a fixed 90 s failed at load 25).
        assert after_kill_s < RESTORE_EMULATED_S + max(90, 2 * startup_s), (after_kill_s, startup_s)
        _assert_nothing_left(context)
    finally:
        shutil.rmtree(context.work_dir, ignore_errors=True)


@pytest.mark.child_suite
def test_a_server_with_another_key_on_the_run_s_socket_gets_no_device_and_one_line(tmp_path, reconnect_cache):
    """Another tool's server with its own key (its own HOME): the emulated devices trust only the run's key and
    hang up on it (offline), so they are not handed to it; one line names the fix, the cases are
    infrastructure errors."""
    output, code, context, _, replacement = _run_killing_its_server(
        tmp_path, reconnect_cache, replace=tmp_path / "another-tool"
    )
    try:
        assert code == pytest.ExitCode.TESTS_FAILED, output[-3000:]
        assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
        verdicts = {check["verdict"] for check in _verdicts(tmp_path / "reports").values()}
        assert "infra_error" in verdicts and "passed" in verdicts, verdicts  # the compile-side checks still pass
        (line,) = [line for line in output.splitlines() if line.startswith("adb server ")]
        assert " is back but 127.0.0.1:" in line and "may sign with another key than the run's" in line, line
        assert replacement.wait(timeout=30) is not None, "the run's stop ended the server on its socket"
        _assert_nothing_left(context)
    finally:
        if replacement.poll() is None:
            replacement.kill()
        replacement.wait()
        shutil.rmtree(context.work_dir, ignore_errors=True)


def test_attached_phones_whose_server_is_gone_are_waited_for_within_the_bound_in_one_line(monkeypatch, capsys):
    from harness import providers
    from harness.device.pool import DeviceSpec

    monkeypatch.setattr(providers, "RESTORE_PHONES_S", 1.0)
    server = f"localfilesystem:/nonexistent-{os.getpid()}/adb.sock"
    phone = DeviceSpec("R5CT1234", "SM8650", 75, "arm64-v8a", "Phone", "phone", server)
    started = time.monotonic()
    assert providers.restore_server(server, [phone]) is False
    assert time.monotonic() - started < 5
    assert capsys.readouterr().err.splitlines() == [
        f"adb server {server} dropped: waiting up to 1 s for it and its devices to be back",
        f"adb server {server} did not come back within 1 s: its devices' cases are infrastructure errors; "
        f"start it again (emulated devices: with the run's adb home, see docs/FAULTS.md)",
    ]
