"""Command-line options of the suite, and their parsed, validated form.

Kept apart from the hooks (harness/plugin.py) as pytest does with its own plugins: this module only
declares options and turns them into a RunOptions value, with one clear line for each bad value.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import shard as sharding
from harness.device import adb
from harness.files import no_room_reason, unwritable_reason
from harness.known_failures import MANIFEST
from harness.paths import REPO_ROOT
from harness.qnn import soc as soc_table
from harness.runner import build as runner_build
from harness.user_state import ancestry_problem, folder_problem
from harness.vocabulary import DTYPES

DEFAULT_EMULATED = ("SM8650", "SM8750")
DEFAULT_STEPS = 4
DEFAULT_LLAMA_STEPS = 8
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "artifacts"


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("qnnsuite", "QNN mutable-buffer conformance")
    group.addoption(
        "--device",
        action="append",
        default=[],
        metavar="SERIAL",
        help="adb serial of a device to test (repeatable; 'all' = every attached device; HOST:PORT/SERIAL "
        "for a serial that two --adb-server list; ANDROID_SERIAL is honoured). Without it, "
        "emulated devices are used.",
    )
    group.addoption(
        "--adb-server",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="adb server whose devices --device selects from (repeatable; default the local one: "
        "ADB_SERVER_SOCKET=tcp:HOST:PORT, else ANDROID_ADB_SERVER_PORT, else 5037). "
        "Without --device, every ready device of the named servers is used.",
    )
    group.addoption(
        "--shard",
        default=None,
        metavar="INDEX/COUNT",
        help="run only this shard of the cases (e.g. 2/4; all checks of a case stay in one shard)",
    )
    group.addoption(
        "--shard-timings",
        default=None,
        metavar="REPORT",
        help="with --shard: balance the shards by the case durations of this report.json or run folder",
    )
    group.addoption("--soc", action="append", default=[], metavar="SOC", help="only run cases for these SoCs")
    group.addoption(
        "--emulate",
        default=None,
        metavar="SOC[,SOC]",
        help=f"emulated devices to start when no --device is given (default {','.join(DEFAULT_EMULATED)})",
    )
    group.addoption("--dtype", action="append", default=[], choices=DTYPES, help="only these dtypes (repeatable)")
    group.addoption(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help=f"steps per case (default {DEFAULT_STEPS}; llama cards {DEFAULT_LLAMA_STEPS})",
    )
    group.addoption(
        "--horizon",
        type=int,
        default=None,
        metavar="N",
        help="steps of the long driver (default and least 256: past every driven card's ring; docs/DRIVERS.md)",
    )
    group.addoption("--runner", default=None, metavar="PATH", help="Android qnn_executor_runner to push to phones")
    group.addoption(
        "--backend-lib",
        default=None,
        metavar="PATH",
        help="libqnn_executorch_backend.so to push to phones (default: beside the runner, else "
        "BUILD/backends/qualcomm/ of the runner's build folder BUILD)",
    )
    group.addoption(
        "--android-ndk",
        default=None,
        metavar="PATH",
        help="Android NDK (else ANDROID_NDK_ROOT): build the interposer for phones and push it, so "
        "address sharing is measured there too",
    )
    group.addoption(
        "--executorch-android-build",
        default=None,
        metavar="DIR",
        help="your executorch Android build's install folder (DIR/include, DIR/lib): with --android-ndk the "
        "suite's runner is built for phones and run there, qnn_executor_runner becoming the reference",
    )
    group.addoption(
        "--qnn-sdk",
        default=None,
        metavar="PATH",
        help="QNN SDK root (else QNN_SDK_ROOT, else the onnxruntime-qnn wheel's libraries)",
    )
    group.addoption(
        "--models",
        action="append",
        default=[],
        metavar="MODULE",
        help="also load model cards from this importable module (repeatable)",
    )
    group.addoption("--report-dir", default="reports", metavar="DIR", help="where reports/<run>/<SOC>/ are written")
    group.addoption(
        "--baseline",
        default=None,
        metavar="PATH",
        help="report.json (or a folder of them, or a nightly store: its newest night that passed) to gate against",
    )
    group.addoption(
        "--allow-missing",
        action="store_true",
        help="gate: a check of the baseline that this run lacks does not fail the gate (a narrowed run)",
    )
    group.addoption(
        "--perf-repeats",
        type=int,
        default=1,
        metavar="N",
        help="run each case's plan N times (a fresh runner each time) so the performance gate measures the noise "
        "(docs/PERFORMANCE.md); the checks read the first run",
    )
    group.addoption(
        "--perf-budget",
        type=float,
        default=10.0,
        metavar="PERCENT",
        help="performance gate: p50 step time may grow this much beyond the noise band before it is a FAIL (default 10)",
    )
    group.addoption(
        "--profile-level",
        default="off",
        metavar="LEVEL",
        help="off (default) or detailed: also lower each case with executorch's QNN profiling and run it once more "
        "with the runner's ETDump, so report.json has the QNN per-op profile per step (docs/PERFORMANCE.md)",
    )
    group.addoption(
        "--perf-gate",
        action="store_true",
        help="a performance FAIL against --baseline fails the run (without it, it is reported only)",
    )
    group.addoption(
        "--known-failures",
        default=str(MANIFEST),
        metavar="FILE",
        help="known-failures manifest to judge failures by (default fixtures/known_failures.toml)",
    )
    group.addoption("--compile-only", action="store_true", help="export, quantize and lower only; no device runs")
    group.addoption(
        "--runner-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="kill a device run after S seconds (default 300)",
    )
    group.addoption(
        "--cache-dir",
        default=str(DEFAULT_CACHE_DIR),
        metavar="DIR",
        help="lowered artifacts kept by content key across runs (default .cache/artifacts)",
    )
    group.addoption("--no-cache", action="store_true", help="lower every case afresh (this run only)")
    group.addoption("--keep-workspace", action="store_true", help="keep device workspaces and print their paths")
    group.addoption(
        "--repro-all",
        action="store_true",
        help="write reproduction bundles (reports/<run>/<SOC>/repro/) for passing cases too, not only failures",
    )


# The run's exit code when its reports cannot be written (disk full, read-only or foreign folder): at the end,
# with the records kept elsewhere (harness/reporter.py), or before anything starts, when the report folder's
# disk is already full. Not 1, which reads as "tests failed", nor pytest's own 0-5. docs/FAULTS.md lists it.
REPORTS_NOT_WRITTEN = 6


@dataclass(frozen=True)
class RunOptions:
    device_options: tuple[str, ...]
    soc_filter: tuple[str, ...]
    emulate: tuple[str, ...]
    dtypes: tuple[str, ...]
    steps: int | None
    runner: Path | None
    qnn_sdk: str | None
    models: tuple[str, ...]
    report_dir: Path
    baseline: Path | None
    allow_missing: bool
    known_failures: Path
    compile_only: bool
    keep_workspace: bool
    runner_timeout_s: float
    cache_dir: Path | None  # None with --no-cache
    repro_all: bool = False  # reproduction bundles for passes too
    backend_lib: Path | None = None  # --backend-lib
    perf_repeats: int = 1  # runs of each case's plan (the first one's outputs are checked)
    perf_budget: float = 10.0  # percent, beyond the noise band (harness/report/perf_gate.py)
    perf_gate: bool = False  # a performance FAIL fails the run
    profile_level: int = 0  # --profile-level as executorch's QNN profile_level (PROFILE_LEVELS); 0: off
    android_ndk: Path | None = None  # --android-ndk or ANDROID_NDK_ROOT
    executorch_android_build: Path | None = None  # --executorch-android-build (with an NDK)
    shard: sharding.Shard | None = None  # --shard: this run's part of the cases
    adb_servers: tuple[adb.AdbServer, ...] = ()  # --adb-server (empty: the local default)
    horizon: int = 256  # --horizon: the long driver's steps (harness/pipeline/drivers.py LONG_STEPS at least)
    wide_horizon: bool = False  # --horizon given: the long driver on every driven card and dtype (cases.py)

    def steps_for(self, tags: frozenset[str]) -> int:
        if self.steps is not None:
            return self.steps
        return DEFAULT_LLAMA_STEPS if "llama" in tags else DEFAULT_STEPS


def _profile_level(value: str) -> int:
    """--profile-level's word as executorch's profile_level (harness/runner/profile.py PROFILE_LEVELS)."""
    from harness.runner.profile import PROFILE_LEVELS

    if value == "basic":
        raise pytest.UsageError(
            "--profile-level basic: executorch's QNN backend no longer profiles at the basic level (its compiler "
            "spec turns it off): use --profile-level detailed"
        )
    if value not in PROFILE_LEVELS:
        raise pytest.UsageError(f"--profile-level {value!r}: give one of {', '.join(PROFILE_LEVELS)}")
    return PROFILE_LEVELS[value]


def _socs(values: list[str], option: str) -> tuple[str, ...]:
    names = [value.strip().upper() for raw in values for value in raw.split(",") if value.strip()]
    try:
        return tuple(soc_table.lookup(name).name for name in names)
    except soc_table.UnknownSocError as error:
        raise pytest.UsageError(f"{option}: {error}") from error


def _shard(spelling: str | None, timings: str | None) -> sharding.Shard | None:
    if spelling is None:
        if timings is not None:
            raise pytest.UsageError(f"--shard-timings {timings} without --shard: add --shard INDEX/COUNT or drop it")
        return None
    try:
        return sharding.parse(spelling, Path(timings) if timings is not None else None)
    except sharding.ShardError as error:
        raise pytest.UsageError(str(error)) from error


def _adb_servers(values: list[str]) -> tuple[adb.AdbServer, ...]:
    try:
        servers = tuple(adb.AdbServer.parse(value, "--adb-server") for value in values)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from error
    if len(set(servers)) != len(servers):
        raise pytest.UsageError("--adb-server: a server is given twice: pass each HOST:PORT once")
    return servers


def _check_selection_expressions(config: pytest.Config) -> None:
    """-k and -m read here, where the run starts: under xdist only the workers collect, and a bad expression
    then crashes every worker (a 56-line INTERNALERROR, exit 3) after the devices were started for nothing."""
    from _pytest.mark.expression import Expression

    for flag, expression in (("-k", config.getoption("keyword")), ("-m", config.getoption("markexpr"))):
        if expression and expression.strip():
            try:
                Expression.compile(expression.lstrip())
            except SyntaxError as error:
                raise pytest.UsageError(
                    f"{flag} {expression!r}: {error.msg} at column {error.offset}: join names with and, or, not and "
                    f'parentheses, e.g. {flag} "counter_add and fp16"'
                ) from None


def parse(config: pytest.Config) -> RunOptions:
    _check_selection_expressions(config)
    steps = config.getoption("--steps")
    if steps is not None and steps < 1:
        raise pytest.UsageError(f"--steps {steps}: give a step count of 1 or more")
    horizon = config.getoption("--horizon")
    if horizon is not None and horizon < 256:
        raise pytest.UsageError(f"--horizon {horizon}: give 256 steps or more (the long driver runs past every ring)")
    runner = config.getoption("--runner")
    if runner and not Path(runner).is_file():
        raise pytest.UsageError(f"--runner {runner} does not exist: pass the path of your Android qnn_executor_runner")
    manifest = Path(config.getoption("--known-failures")).resolve()
    if not manifest.is_file():
        raise pytest.UsageError(f"--known-failures {manifest} does not exist: pass a known-failures TOML file")
    baseline = config.getoption("--baseline")
    if baseline and not Path(baseline).exists():
        raise pytest.UsageError(
            f"--baseline {baseline} does not exist: pass a previous report.json or a folder of them"
        )
    if baseline:
        from harness.report.gate import BaselineError  # here: the option's only use of the report package
        from harness.report.nightly.promote import baseline_path

        try:
            baseline = str(baseline_path(Path(baseline)))  # a nightly store (promote --to): its newest night
        except BaselineError as error:
            raise pytest.UsageError(f"--baseline {error}") from None
    report_dir = Path(config.getoption("--report-dir"))
    if (problem := unwritable_reason(report_dir)) is not None:  # found now, not after an hour of running
        raise pytest.UsageError(f"--report-dir {report_dir}: {problem}: pass a folder this user can write to")
    worker = hasattr(config, "workerinput")  # an xdist worker writes no report; a disk filling later is the end's
    if not worker and (problem := no_room_reason(report_dir)) is not None:  # a lab fault: the reports' code
        pytest.exit(
            f"--report-dir {report_dir}: {problem}: free some space there or pass another folder (nothing was run)",
            returncode=REPORTS_NOT_WRITTEN,
        )
    emulate = config.getoption("--emulate")
    perf_repeats, perf_budget = config.getoption("--perf-repeats"), config.getoption("--perf-budget")
    if perf_repeats < 1:
        raise pytest.UsageError(f"--perf-repeats {perf_repeats}: give a count of 1 or more (3 measures the noise)")
    if not perf_budget >= 0 or perf_budget == float("inf"):
        raise pytest.UsageError(f"--perf-budget {perf_budget}: give a finite percentage of 0 or more, e.g. 10")
    backend_lib = config.getoption("--backend-lib")
    profile_level = _profile_level(config.getoption("--profile-level"))
    return RunOptions(
        shard=_shard(config.getoption("--shard"), config.getoption("--shard-timings")),
        adb_servers=_adb_servers(config.getoption("--adb-server")),
        device_options=tuple(config.getoption("--device")),
        soc_filter=_socs(config.getoption("--soc"), "--soc"),
        emulate=_socs([emulate], "--emulate") if emulate else DEFAULT_EMULATED,
        dtypes=tuple(config.getoption("--dtype")) or DTYPES,
        steps=steps,
        horizon=horizon or 256,
        wide_horizon=horizon is not None,
        runner=Path(runner).absolute() if runner else None,  # not resolved: a linked runner keeps its build folder
        qnn_sdk=config.getoption("--qnn-sdk"),
        models=tuple(config.getoption("--models")),
        report_dir=report_dir,
        baseline=Path(baseline) if baseline else None,
        allow_missing=config.getoption("--allow-missing"),
        known_failures=manifest,
        compile_only=config.getoption("--compile-only"),
        keep_workspace=config.getoption("--keep-workspace"),
        runner_timeout_s=config.getoption("--runner-timeout"),
        cache_dir=None if config.getoption("--no-cache") else trusted_cache_dir(Path(config.getoption("--cache-dir"))),
        repro_all=config.getoption("--repro-all"),
        backend_lib=Path(backend_lib).resolve() if backend_lib else None,
        perf_repeats=perf_repeats,
        perf_budget=perf_budget,
        perf_gate=config.getoption("--perf-gate"),
        profile_level=profile_level,
        android_ndk=(ndk := _android_ndk(config.getoption("--android-ndk"))),
        executorch_android_build=_executorch_android_build(config.getoption("--executorch-android-build"), ndk),
    )


CACHE_SUBFOLDERS = ("prepared", "eager")  # harness/case_store.py's shared entries, references.py's eager results


def trusted_cache_dir(given: Path) -> Path:
    """--cache-dir (or the default) resolved, created 0700 if missing, and refused (UsageError, one line with
    the fix) unless it is this user's own folder that nobody else may write, below parents that only this
    user or root may write (a writable parent could rename the checked folder away and put its own in its
    place): entries in it are lowered programs and quantized programs, which a lowering reads back, so a
    folder another account can write into is a way to plant them (harness/pipeline/prepared.py also
    authenticates what it unpickles; an entry another account owns is set aside, never served)."""
    path = given.resolve()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(path)
    except OSError as error:
        raise pytest.UsageError(
            f"--cache-dir {path} cannot be created ({error.strerror}): pass a folder of "
            f"your own with --cache-dir, or --no-cache"
        ) from None
    problem = folder_problem(info, forbidden_mode=stat.S_IWGRP | stat.S_IWOTH, mode_words="writable by others")
    if problem.startswith("has mode"):
        raise pytest.UsageError(
            f"--cache-dir {path} {problem}: run `chmod go-w {shlex.quote(str(path))}`, "
            f"or pass another folder with --cache-dir"
        )
    if problem:
        raise pytest.UsageError(
            f"--cache-dir {path} {problem}, not a folder of yours (uid {os.getuid()}): someone else could plant "
            f"entries there; pass a folder of your own with --cache-dir"
        )
    if problem := ancestry_problem(path):
        raise pytest.UsageError(
            f"--cache-dir {path}: {problem}, so another account could swap the cache for its own: pass a folder "
            f"whose parents only you or root may write, or --no-cache"
        )
    for shared in CACHE_SUBFOLDERS:  # one folder of entries each: theirs must be as much this user's own
        try:
            problem = folder_problem(os.lstat(path / shared), stat.S_IWGRP | stat.S_IWOTH, "writable by others")
        except FileNotFoundError:
            continue
        if problem:
            raise pytest.UsageError(
                f"--cache-dir {path / shared} {problem}: someone else could plant entries there; remove it "
                f"(it is made again) or pass another folder with --cache-dir"
            )
    return path


def _android_ndk(option: str | None) -> Path | None:
    """--android-ndk, else ANDROID_NDK_ROOT; a folder that is not there is a usage error now, not at the first case."""
    value, origin = (option, "--android-ndk") if option else (os.environ.get("ANDROID_NDK_ROOT"), "ANDROID_NDK_ROOT")
    if not value:
        return None
    if not Path(value).is_dir():
        raise pytest.UsageError(
            f"{origin} {value} is not a folder: pass the root of an Android NDK, or leave it "
            f"unset (address sharing is then not measured on phones)"
        )
    return Path(value).resolve()


def _executorch_android_build(option: str | None, ndk: Path | None) -> Path | None:
    """--executorch-android-build, checked now (one line naming every header and library it lacks), and only
    with an NDK to build the runner with."""
    if not option:
        return None
    folder = Path(option).resolve()
    if ndk is None:
        raise pytest.UsageError(
            f"--executorch-android-build {option} needs an NDK to build the suite's runner for phones: "
            f"add --android-ndk PATH (or set ANDROID_NDK_ROOT), or drop --executorch-android-build"
        )
    if not folder.is_dir():
        raise pytest.UsageError(
            f"--executorch-android-build {option} is not a folder: pass the folder your executorch Android "
            f"build installed into (it holds include/ and lib/)"
        )
    try:
        runner_build.check_android_build(folder)
    except runner_build.RunnerBuildError as error:
        raise pytest.UsageError(str(error)) from None
    return folder
