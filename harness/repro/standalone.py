"""repro.py of a reproduction bundle: re-creates one case of the QNN mutable-buffer conformance suite
without the suite, and says whether its failure still shows.

    python repro.py [--qnn-sdk DIR] [--serial SERIAL --device-dir DIR] [--pte FILE] [--out DIR]

Needs executorch, torch, torchao and numpy, and the host QNN libraries (x86_64): `--qnn-sdk DIR`, or
QNN_SDK_ROOT and LD_LIBRARY_PATH already set (with the suite's interposer overlay, also its bridge
variables: `python -m harness doctor` prints the lines to export). It rebuilds the model from the card's
source (card/), exports, quantizes and lowers it in a child process with the suite's own settings, runs
the steps on the HTP simulator or, with --serial, with your qnn_executor_runner on a phone through adb (a
multi-method card's plan, a method per step, in one loaded program: on a phone with suite_runner), and judges every check the run judged for this case with the suite's own check code (suite/: copies of
the suite's modules and of any module that declared one of those checks, listed in suite/manifest.json,
imported under their suite names; the card registry is a small shim so the card source runs unchanged).

Exit status, one verdict line before it:
  1  REPRODUCED: every failure the run recorded recurs with its recorded signature, and nothing else fails;
  0  NOT REPRODUCED: no check fails;
  3  DIFFERENT FAILURE: something fails, but not as recorded (another signature, a lowering error, a crash,
     or a recorded failure that passes now while another recurs);
  2  the script could not run (a missing module, no QNN libraries, any error of its own): one line says why.
This file is the suite's harness/repro/standalone.py, copied unchanged into every bundle; it imports nothing
of the suite but what the bundle carries.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent
# The suite modules every bundle carries (suite/<name>.py): the lowering pipeline, the simulator's runner,
# and the checks with what they import (harness/tests/repro/test_repro.py keeps this set closed under imports).
# A check declared in another module (a user's @check) is carried beside them: suite/manifest.json lists all.
SUITE_MODULES = (
    "harness.vocabulary",
    "harness.user_state",
    "harness.files",
    "harness.pipeline.facts",
    "harness.pipeline.eager",
    "harness.numerics",
    "harness.pipeline.stages",
    "harness.pipeline.prepared",
    "harness.pipeline.mutbuf",
    "harness.pipeline.meta_llama",
    "harness.pipeline.structure",
    "harness.pipeline.lower_job",
    "harness.pipeline.cases",
    "harness.qnn.soc",
    "harness.check_registry",
    "harness.record",
    "harness.outcome",
    "harness.checks.common",
    "harness.checks.lowering",
    "harness.checks.device_state",
    "harness.checks.meta_llama_partitions",
    "harness.checks.runner_parity",
    "harness.checks.cross_method",
    "harness.checks.driving",
    "harness.pipeline.drivers",
    "harness.horizon",  # the horizon check's judgement of a long run (pure: numpy)
    "harness.emulator.host_runner",
    "harness.paths",
    "harness.runner.build",
    "harness.runner.contract",
    "harness.runner.run",
)
# The suite's compiled runner: its source beside harness.runner.build's copy (build.SOURCE), built by that
# module's build() into the bundle's own .qnn/ folder (harness.paths.state_dir, here the bundle's).
RUNNER_SOURCE = "suite/suite_runner.cpp"
SUITE_RUNNER = "suite_runner"
REFERENCE_RUNNER = "qnn_executor_runner"  # upstream's runner; on the simulator the bundle's host_runner
# What runs a plan of several methods where the suite's runner cannot be built (plan_child).
PYTHON_RUNTIME = "executorch.runtime"
SHIM = "harness.pipeline.card"  # what card modules import ModelCard and register from
MANIFEST = "suite/manifest.json"
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
HOST_LIBRARY = "libQnnHtp.so"
HOST_LIB_SUBDIR = ("lib", "x86_64-linux-clang")
RECORDED_FAILURES = ("failed", "xfailed")  # an xpassed check passed (its manifest entry expected a failure)
EXIT = {"NOT REPRODUCED": 0, "REPRODUCED": 1, "DIFFERENT FAILURE": 3}


class ReproError(RuntimeError):
    """The script cannot do its work; the message is one line naming the fix."""


# --- importing the suite's modules and the card from the bundle -----------------------------------------
def manifest_modules(manifest: dict) -> dict[str, tuple[Path, str]]:
    """Module name -> (its file in the bundle, the sha256 the run recorded for it), from suite/manifest.json;
    names, paths and digests are checked (the bundle may come from elsewhere: nothing outside it is imported)."""
    modules = {}
    for name, entry in manifest.get("modules", {}).items():
        path = (BUNDLE / str(entry.get("file", ""))).resolve()
        if not MODULE_NAME.match(name) or not path.is_relative_to(BUNDLE) or not path.is_file():
            raise ReproError(
                f"{MANIFEST}: module {name!r} -> {entry.get('file')!r} is not a module file in this bundle"
            )
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise ReproError(
                f"could not run: {MANIFEST} records no sha256 for module {name!r}: make the bundle again with the suite"
            )
        modules[name] = (path, digest)
    return modules


def carried_source(path: Path, digest: str) -> bytes:
    """A carried module's source, if its sha256 is the one the run recorded; else ReproError (one line). Read
    once: the bytes checked are the bytes run, so a file swapped after the check is never imported."""
    source = path.read_bytes()
    if hashlib.sha256(source).hexdigest() != digest:
        shown = path.relative_to(BUNDLE) if path.is_relative_to(BUNDLE) else path
        raise ReproError(
            f"could not run: {shown} is not the module the run carried (its sha256 differs from {MANIFEST}'s): "
            f"the bundle was changed after the suite wrote it; make it again with the suite"
        )
    return source


class _CarriedLoader(importlib.abc.InspectLoader):
    """A module the bundle carries, run from the source whose sha256 the manifest records."""

    def __init__(self, path: Path, digest: str) -> None:
        self.path, self.digest = path, digest

    def create_module(self, spec):
        return None

    def get_source(self, fullname: str) -> str:
        return carried_source(self.path, self.digest).decode("utf-8")

    def exec_module(self, module) -> None:
        code = compile(carried_source(self.path, self.digest), str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102  the bytes whose sha256 the run recorded, just checked


class _PackageLoader(importlib.abc.Loader):
    """An empty package (harness, harness.pipeline, a card module's package): its modules come from the bundle."""

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        return None


class _ShimLoader(importlib.abc.Loader):
    """Stands in for the suite's card registry: card modules call register(ModelCard(...))."""

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        from harness.vocabulary import ModelCard

        registry: dict = {}

        def register(card):
            registry[card.name] = card
            return card

        module.ModelCard, module.register, module.cards = ModelCard, register, lambda: list(registry.values())
        module.find = lambda reference: registry[reference.partition(":")[2]]
        module.load_module = lambda name: None  # the bundle's one card module is imported up front


class BundleFinder(importlib.abc.MetaPathFinder):
    """Finds the bundle's modules by their suite names, ahead of anything installed (a harness on the path
    must not stand in for the copies the run used)."""

    def __init__(self, modules: dict[str, tuple[Path, str]]) -> None:
        self.modules = modules
        self.packages = {
            name.rsplit(".", depth)[0] for name in [*modules, SHIM] for depth in range(1, name.count(".") + 1)
        }

    def find_spec(self, name, path=None, target=None):
        if name == SHIM:
            return importlib.machinery.ModuleSpec(name, _ShimLoader())
        if name in self.modules:
            path, digest = self.modules[name]
            return importlib.util.spec_from_file_location(name, path, loader=_CarriedLoader(path, digest))
        if name in self.packages:
            return importlib.machinery.ModuleSpec(name, _PackageLoader(), is_package=True)
        return None


def load_suite(case: dict) -> dict:
    """Make the bundle's modules importable, import the card's module and every check's; the manifest."""
    manifest = json.loads((BUNDLE / MANIFEST).read_text())
    modules = manifest_modules(manifest)
    wanted = [case["card"]["module"], *dict.fromkeys(manifest.get("checks", {}).values())]
    strays = [name for name in wanted if name not in modules]
    if strays:
        raise ReproError(f"{MANIFEST} lists no file for {', '.join(map(repr, strays))}: the bundle is incomplete")
    sys.meta_path.insert(0, BundleFinder(modules))
    for name in ("harness.vocabulary", "harness.pipeline.facts", "harness.pipeline.eager", "harness.outcome", *wanted):
        importlib.import_module(name)
    return manifest


# --- the QNN host environment ------------------------------------------------------------------------
def qnn_environment(qnn_sdk: str | None) -> dict[str, str]:
    """The environment of the lowering and running children: --qnn-sdk, else what the caller set."""
    env = dict(os.environ)
    if qnn_sdk:
        lib_dir = Path(qnn_sdk).resolve().joinpath(*HOST_LIB_SUBDIR)
        if not (lib_dir / HOST_LIBRARY).is_file():
            raise ReproError(
                f"--qnn-sdk {qnn_sdk}: no {'/'.join(HOST_LIB_SUBDIR)}/{HOST_LIBRARY} there; "
                f"pass the root of a QNN SDK (QAIRT) with its x86_64 host libraries"
            )
        env["QNN_SDK_ROOT"] = str(Path(qnn_sdk).resolve())
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(lib_dir), *filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
        )
    places = [Path(p) for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if env.get("QNN_SDK_ROOT"):
        places.append(Path(env["QNN_SDK_ROOT"]).joinpath(*HOST_LIB_SUBDIR))
    if not any((place / HOST_LIBRARY).is_file() for place in places):
        raise ReproError(
            f"no host QNN library ({HOST_LIBRARY}) in LD_LIBRARY_PATH or QNN_SDK_ROOT: pass "
            f"--qnn-sdk DIR (a QNN SDK root), or set both as issue.md's 'Steps' says"
        )
    env.pop("PYTHONPATH", None)  # the children load the suite from this bundle, never from elsewhere
    return env


# --- lowering, in a child process (running a program in the process that lowered it crashed) ----------
def lower(case: dict, out: Path, env: dict[str, str]) -> tuple[Path | None, object]:
    """Export, quantize and lower as the suite does; returns (model.pte or None, the lowering facts)."""
    facts_module, vocabulary = sys.modules["harness.pipeline.facts"], sys.modules["harness.vocabulary"]
    lowering = out / "lowering"
    lowering.mkdir(parents=True, exist_ok=True)
    request = lowering / "request.json"
    facts_module.LoweringRequest(
        case["card"]["reference"],
        case["dtype"],
        vocabulary.Mode(case["mode"]),
        case["soc"],
        case["steps"],
        str(lowering),
        share_mutable_buffers=bool(case.get("share_mutable_buffers", False)),
    ).write(request)
    for stale in ("model.pte", "facts.json"):
        (lowering / stale).unlink(missing_ok=True)
    with open(lowering / "lower.log", "wb") as log:
        completed = subprocess.run(
            [sys.executable, str(BUNDLE / "repro.py"), "--lowering-child", str(request)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        facts = facts_module.LoweringFacts.read(lowering / "facts.json")
    except facts_module.FactsError:
        facts = facts_module.LoweringFacts.crashed(
            f"lowering process exited {completed.returncode} without facts; see {lowering / 'lower.log'}"
        )
    pte = lowering / "model.pte"
    return (pte if facts.error is None and pte.is_file() else None), facts


def lowering_child(request: str) -> int:
    case = json.loads((BUNDLE / "case.json").read_text())
    load_suite(case)
    return importlib.import_module("harness.pipeline.lower_job").main([request])


# --- running the steps ---------------------------------------------------------------------------------
def contract():
    """The runner contract the bundle carries (harness/runner/contract.py): file names, flags, heap environment."""
    return importlib.import_module("harness.runner.contract")


def write_inputs(steps: list[tuple], directory: Path) -> Path:
    """One raw file per input per step and the runner's input list (one line per step)."""
    rows = contract().write_inputs(steps, directory)
    return contract().write_input_list([[path.name for path in row] for row in rows], directory / "input_list.txt")


def heap_environment(env: dict[str, str], pattern: int | None) -> dict[str, str]:
    """env plus glibc's settings that make fresh heap allocations hold `pattern`, as on the suite's device
    (the runner contract's one body)."""
    return contract().heap_environment(env, pattern)


def compiled_runner() -> Path | None:
    """The suite's runner built for this machine from the bundle's source (cached in the bundle's .qnn/), or
    None, with one line saying why and what runs instead, when it cannot be built (e.g. no g++)."""
    build = importlib.import_module("harness.runner.build")
    try:
        return build.build()
    except build.RunnerBuildError as error:
        print(
            f"repro.py: the steps run with the pybindings runner: the suite's runner cannot be built: {error}",
            file=sys.stderr,
        )
        return None


def write_plan(inputs: Path, methods: list[str], reloads: tuple[int, ...] = ()) -> Path:
    """The compiled runner's plan beside the inputs: a step per input_list.txt line, each running its method,
    the program loaded again before the steps in reloads (a driver's fresh-load reset)."""
    rows = contract().read_input_list(inputs / "input_list.txt")
    return importlib.import_module("harness.runner.run").write_plan(
        list(zip(methods, rows)), inputs / "plan.txt", reloads
    )


def run_compiled(
    binary: Path,
    pte: Path,
    inputs: Path,
    outputs: Path,
    env: dict[str, str],
    heap_pattern: int | None,
    methods: list[str],
    reloads: tuple[int, ...] = (),
) -> tuple[int, str]:
    """The suite's compiled runner, as the emulated device runs it: the steps as a plan in one process (each
    step its method, state crossing methods, the program loaded again before the steps in reloads), on the
    HTP simulator, with the interposer's trace in outputs/trace.jsonl."""
    terms = contract()
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / terms.TRACE_NAME).unlink(missing_ok=True)
    env = {**heap_environment(env, heap_pattern), terms.TRACE_VARIABLE: str(outputs / terms.TRACE_NAME)}
    run = importlib.import_module("harness.runner.run")
    plan = write_plan(inputs, methods, reloads)
    done = run.run_plan(binary, pte, plan, outputs, env, timeout_s=None, methods=methods)
    return done.exit_code, done.stdout + done.stderr


def run_on_simulator(
    pte: Path, inputs: Path, outputs: Path, env: dict[str, str], heap_pattern: int | None = None, method_index: int = 0
) -> tuple[int, str]:
    """The suite's emulated qnn_executor_runner (the pybindings runner, the bundle's copy of
    harness/emulator/host_runner.py in a child: runner_child): every step on one loaded method, on the HTP
    simulator."""
    argv = contract().executor_runner_argv(str(pte), "input_list.txt", str(outputs), method_index)
    completed = subprocess.run(
        [sys.executable, str(BUNDLE / "repro.py"), "--runner-child", *argv],
        cwd=inputs,
        env=heap_environment(env, heap_pattern),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    return completed.returncode, completed.stdout + completed.stderr


def runner_child(argv: list[str]) -> int:
    """The bundle's pybindings runner with the bundle's modules importable (it reads the runner contract)."""
    sys.meta_path.insert(0, BundleFinder(manifest_modules(json.loads((BUNDLE / MANIFEST).read_text()))))
    return importlib.import_module("harness.emulator.host_runner").main(argv)


def run_plan_on_simulator(
    pte: Path, inputs: Path, outputs: Path, env: dict[str, str], heap_pattern: int | None = None
) -> tuple[int, str]:
    """A plan of several methods without the suite's runner: executorch's Python runtime in a child process
    (plan_child), every step on its method of ONE loaded program, on the HTP simulator."""
    terms = contract()
    outputs.mkdir(parents=True, exist_ok=True)
    (outputs / terms.TRACE_NAME).unlink(missing_ok=True)
    completed = subprocess.run(
        [sys.executable, str(BUNDLE / "repro.py"), "--plan-child", str(pte), str(inputs), str(outputs)],
        cwd=inputs,
        env={**heap_environment(env, heap_pattern), terms.TRACE_VARIABLE: str(outputs / terms.TRACE_NAME)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    return completed.returncode, completed.stdout + completed.stderr


def plan_child(pte: str, inputs: str, outputs: str) -> int:
    """Runs the case's plan through executorch.runtime: one Program, each step on program.load_method(its
    method) (the Program keeps every method it loaded), so what one method writes to a shared buffer the next
    one reads, as in an application holding the program. executorch's Python runtime has no
    share_memory_arenas switch: its host-only methods share one set of planned arenas (what suite_runner's
    --share_memory_arenas asks of Module), a method with buffers placed on an accelerator gets its own
    (executorch/runtime/__init__.py, Program.load_method). Output files and the heap pattern line are
    harness.emulator.host_runner's, so the parent reads them as it reads every runner's."""
    case = json.loads((BUNDLE / "case.json").read_text())
    load_suite(case)
    host_runner = importlib.import_module("harness.emulator.host_runner")
    pattern = host_runner.heap_pattern()  # the byte fresh allocations hold here (the checks try it as a start)
    print(f"runner: heap pattern {'none' if pattern is None else f'0x{pattern:02x}'}", flush=True)
    import numpy as np
    import torch
    from executorch.runtime import Runtime

    card = sys.modules[SHIM].find(case["card"]["reference"])
    methods = card.step_methods(case["steps"])
    rows = contract().read_input_list(Path(inputs) / "input_list.txt")
    program = Runtime.get().load_program(Path(pte))
    for step, (name, files) in enumerate(zip(methods, rows)):
        meta = program.metadata(name)
        tensors = []
        for index, file in enumerate(files):
            info = meta.input_tensor_meta(index)
            array = np.fromfile(Path(inputs) / file, dtype=host_runner.SCALAR_TYPES[int(info.dtype())])
            tensors.append(torch.from_numpy(array.reshape(tuple(info.sizes()))))
        for index, output in enumerate(program.load_method(name).execute(tensors)):
            host_runner.write_new(
                Path(outputs) / contract().output_name(step, index), output.detach().contiguous().numpy()
            )
    print(f"runner: {len(rows)} step(s) of {', '.join(dict.fromkeys(methods))} on one executorch.runtime Program")
    return 0


def run_on_phone(
    args: argparse.Namespace, case_id: str, pte: Path, inputs: Path, outputs: Path, methods: list[str]
) -> tuple[int, str, str]:
    """Your qnn_executor_runner and QNN libraries in --device-dir on the phone; files over adb. A plan of
    several methods runs in one process, which qnn_executor_runner cannot do: the suite's runner built for
    Android (suite_runner, with the libraries it links) must be in --device-dir, as the suite pushes it to
    phones. Returns (exit status, log, the runner that ran)."""
    adb = [args.adb, "-s", args.serial]
    remote = "/data/local/tmp/qnnsuite-repro/" + (re.sub(r"[^A-Za-z0-9_.-]", "_", case_id).strip(".") or "case")
    device_dir = shlex.quote(args.device_dir)

    def adb_run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*adb, *command], stdin=subprocess.DEVNULL, capture_output=True, text=True)

    several = len(set(methods)) > 1
    if several:
        probe = adb_run("shell", f"test -x {shlex.quote(args.device_dir + '/' + SUITE_RUNNER)} && echo present")
        if "present" not in probe.stdout:
            raise ReproError(
                f"the plan runs {', '.join(dict.fromkeys(methods))} in one process, which qnn_executor_runner "
                f"cannot (one method per process), and {args.device_dir}/{SUITE_RUNNER} is not an executable on "
                f"{args.serial}: build the suite's runner for Android ({RUNNER_SOURCE}; the suite's "
                f"--android-ndk does it) and push it with its libraries to --device-dir, or run without --serial"
            )
    terms, method_index = contract(), int(methods[0][1:]) if methods[0].startswith("@") else 0
    if several:
        argv = terms.suite_runner_argv(terms.MODEL_NAME, write_plan(inputs, methods).name, terms.OUTPUTS_DIR, methods)
    else:
        argv = terms.executor_runner_argv(terms.MODEL_NAME, terms.INPUT_LIST_NAME, terms.OUTPUTS_DIR, method_index)
    runner = " ".join([f"{device_dir}/{SUITE_RUNNER if several else 'qnn_executor_runner'}", *map(shlex.quote, argv)])
    steps = [
        adb_run("shell", f"rm -rf {shlex.quote(remote)} && mkdir -p {shlex.quote(remote + '/outputs')}"),
        adb_run("push", str(pte), f"{remote}/model.pte"),
        adb_run("push", *(str(path) for path in sorted(inputs.iterdir())), f"{remote}/"),
    ]
    failed = next((step for step in steps if step.returncode != 0), None)
    if failed is not None:
        raise ReproError(
            f"adb {' '.join(failed.args[3:5])} on {args.serial} failed: {(failed.stderr or failed.stdout).strip()[:200]}"
        )
    command = (
        f"cd {shlex.quote(remote)} && LD_LIBRARY_PATH={device_dir}:$LD_LIBRARY_PATH ADSP_LIBRARY_PATH={device_dir} "
        f'{runner}; echo "exit=$?"'
    )
    ran = adb_run("shell", command)
    log = ran.stdout + ran.stderr
    status = int(log.rsplit("exit=", 1)[1].split()[0]) if "exit=" in log else ran.returncode
    outputs.mkdir(parents=True, exist_ok=True)
    pulled = adb_run("pull", f"{remote}/outputs/.", str(outputs))
    if pulled.returncode != 0 and status == 0:
        raise ReproError(f"adb pull from {args.serial} failed: {(pulled.stderr or pulled.stdout).strip()[:200]}")
    return status, log, SUITE_RUNNER if several else "qnn_executor_runner"


def read_outputs(outputs: Path, reference: list[list]) -> tuple[list[list], str]:
    """The runner's raw files as flat byte arrays, as a device run holds them (the outcome shapes them);
    ([], why) when one is missing."""
    raw, missing = contract().read_outputs(outputs, [len(row) for row in reference])
    return raw, f"the runner wrote no {missing[0]}; see {outputs.parent / 'runner.log'}" if missing else ""


# --- the outcome the suite's checks read (harness/outcome.py's protocols) --------------------------------
@dataclass
class BundleLowering:
    """This run's lowering: its facts and program."""

    facts: object  # harness.pipeline.facts.LoweringFacts
    pte: Path | None

    @property
    def ok(self) -> bool:
        return self.facts.error is None and self.pte is not None and self.pte.is_file()

    @property
    def failure(self) -> str:
        error = self.facts.error
        return f"lowering failed: {error.type}: {error.message}" if error else "lowering produced no model.pte"


@dataclass
class BundleRun:
    outputs: list[list]
    trace: Path | None
    heap_pattern: int | None
    runner: str = "qnn_executor_runner"  # the outcome protocol's (harness/outcome.py DeviceOutputs)
    step_times_us: list[int] = field(default_factory=list)
    peak_rss_kb: int | None = None
    io_memory: str | None = None
    step_rss_kb: list[int] = field(default_factory=list)
    step_registrations: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class BundleDevice:
    name: str
    has_execute_trace: bool
    heap_pattern: int | None
    suite_runner_hint: str = ""


@dataclass
class Judgement:
    verdict: str  # passed, failed, skipped, not_measured, infra_error, error
    signature: str = ""
    line: str = ""

    @property
    def fails(self) -> bool:
        return self.verdict in ("failed", "error")


def judge(spec, outcome) -> Judgement:
    """One check on the outcome, its exception read by the suite's own mapping (check_registry.raised_verdict,
    what the suite's verdicts.decide applies its manifest on); a failure that is no assertion (a check that
    breaks on this outcome) is told apart as `error`: not the recorded failure."""
    try:
        spec.function(outcome)
    except Exception as raised:
        error = raised
    else:
        return Judgement("passed")
    verdict = str(sys.modules["harness.check_registry"].raised_verdict(error))
    if verdict != "failed":
        return Judgement(verdict, "", str(error))
    if isinstance(error, AssertionError):  # CheckFailure, or a check's plain assert (no signature, as in the suite)
        return Judgement("failed", getattr(error, "signature", ""), str(error).partition("\n")[0])
    return Judgement("error", type(error).__name__, f"{type(error).__name__}: {error}".partition("\n")[0])


def now_of(names, judged: dict[str, Judgement]) -> str:
    """What recorded failures came to now, grouped: "a, b pass now; c not measured" (a check this run could
    not feed, e.g. runner_parity without a second runner, is never said to pass)."""
    words = {"passed": "pass now", "not_measured": "not measured"}
    said: dict[str, list[str]] = {}
    for name in names:
        verdict = judged[name].verdict if name in judged else "not_measured"
        said.setdefault(words.get(verdict, f"{verdict} now"), []).append(name)
    return "; ".join(f"{', '.join(found)} {word}" for word, found in said.items())


def _now(judged: Judgement | None) -> str:
    """A recorded failure's verdict now, in a DIFFERENT FAILURE line ("passed now", "not measured")."""
    return "not measured" if judged is None or judged.verdict == "not_measured" else f"{judged.verdict} now"


def verdict_of(recorded: dict, judged: dict[str, Judgement]) -> tuple[str, str]:
    """(REPRODUCED | NOT REPRODUCED | DIFFERENT FAILURE, the rest of the verdict line)."""
    failing = {name: j for name, j in judged.items() if j.fails}
    expected = {name: entry for name, entry in recorded.items() if entry.get("verdict") in RECORDED_FAILURES}
    if not failing:
        said = [now_of(expected, judged)] if expected else []
        unfed = [name for name, now in judged.items() if now.verdict == "not_measured" and name not in expected]
        said += [f"{', '.join(unfed)} not measured"] if unfed else []
        return "NOT REPRODUCED", f"({'; '.join(said)})" if said else "(every check passes)"
    # A recorded failure that fails otherwise is named first: its recorded line is the one to compare with.
    for name, now in sorted(failing.items(), key=lambda item: item[0] not in expected):
        was = recorded.get(name, {})
        if was.get("verdict") not in RECORDED_FAILURES or now.signature != was.get("signature", ""):
            what = (
                f"recorded {was['signature']}: {was.get('message', '')}"
                if was.get("signature")
                else f"recorded {was.get('verdict', 'nothing')}" + (f": {was['message']}" if was.get("message") else "")
            )
            return "DIFFERENT FAILURE", f"{name} {now.signature or now.verdict}: {now.line}; {what}"
    passing = [name for name in expected if name not in failing]
    if passing:
        was = expected[passing[0]]
        return (
            "DIFFERENT FAILURE",
            f"{passing[0]} {_now(judged.get(passing[0]))}; recorded {was.get('signature') or was.get('verdict')}: {was.get('message', '')}",
        )
    return "REPRODUCED", f"({', '.join(failing)} fail as recorded)"


# --- the report ------------------------------------------------------------------------------------------
def report(case: dict, judged: dict[str, Judgement], steps: list[dict], facts, out: Path) -> int:
    recorded = case["checks"]
    if facts is not None and facts.error is not None:
        print(f"lowering: lowering failed: {facts.error.type}: {facts.error.message}")
        print(f"  (its log, with the QNN messages: {out / 'lowering' / 'lower.log'})")
    elif facts is not None and facts.partitions is not None:
        print(
            f"lowering: ok, {len(facts.partitions.delegates)} delegate(s), buffers outside the delegates: "
            f"{', '.join(facts.partitions.buffers_outside) or 'none'}"
        )
    for name, now in judged.items():
        was = recorded.get(name, {})
        note = (
            "as recorded"
            if (now.verdict, now.signature) == (was.get("verdict"), was.get("signature", ""))
            or (now.fails and was.get("verdict") in RECORDED_FAILURES and now.signature == was.get("signature"))
            else f"recorded: {was.get('verdict', 'not recorded')}"
            + (f" [{was['signature']}]" if was.get("signature") else "")
        )
        line = (
            "(the lowering above)"
            if now.signature == "lowering_failed" and facts is not None and facts.error
            else now.line
        )
        print(
            f"{name}: {now.verdict.upper()}{f' [{now.signature}]' if now.signature else ''} {line}".rstrip()
            + f"  ({note})"
        )
    for step in steps:
        print(
            f"  step {step['step']}: max abs error {step['max_abs_error']!r}, SQNR {step['sqnr_db']:.2f} dB, "
            f"{step['mismatches']} element(s) out of tolerance"
        )
    word, rest = verdict_of(recorded, judged)
    print(f"verdict: {word}: {rest}" if word == "DIFFERENT FAILURE" else f"verdict: {word} {rest}")
    (out / "result.json").write_text(
        json.dumps(
            {
                "case_id": case["case_id"],
                "verdict": word,
                "reproduced": word == "REPRODUCED",
                "steps": steps,
                "checks": {
                    name: {"verdict": j.verdict, "signature": j.signature, "message": j.line}
                    for name, j in judged.items()
                },
            },
            indent=1,
            default=str,
        )
    )
    return EXIT[word]


def reproduce(args: argparse.Namespace) -> int:
    case = json.loads((BUNDLE / "case.json").read_text())
    env = qnn_environment(args.qnn_sdk)
    manifest = load_suite(case)
    registry, vocabulary = sys.modules["harness.check_registry"], sys.modules["harness.vocabulary"]
    facts_module, eager = sys.modules["harness.pipeline.facts"], sys.modules["harness.pipeline.eager"]
    outcome_module = sys.modules["harness.outcome"]
    card = sys.modules[SHIM].find(case["card"]["reference"])
    # Every check the run judged for this case (the bundle records each, passes too), by the run's own code.
    names = [name for name in case["checks"] if name in manifest.get("checks", {})]
    missing = [name for name in case["checks"] if name not in names]
    if missing:
        raise ReproError(
            f"the run judged {', '.join(missing)}, but {MANIFEST} names no module declaring it: "
            f"make the bundle again with the suite that declares it"
        )
    specs = [registry.get(name) for name in names]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    where = f"phone {args.serial}" if args.serial else "the HTP simulator"
    print(
        f"{case['case_id']}: {case['card']['name']}, {case['dtype']}, {case['mode']}, {case['steps']} step(s), on {where}"
    )
    if card.multi_method:
        print(f"plan (one loaded program, a method per step): {', '.join(card.step_methods(case['steps']))}")
    the_case = vocabulary.Case(
        card,
        case["dtype"],
        vocabulary.Mode(case["mode"]),
        case["soc"],
        share_mutable_buffers=bool(case.get("share_mutable_buffers", False)),
        driver=str(case.get("driver") or ""),
    )
    driven = driven_plan(case, the_case)
    if driven is not None:
        print(
            f"driver {the_case.driver}: {', '.join(driven.methods)}"
            + (f"; reload before steps {list(driven.reloads)}" if driven.reloads else "")
        )
    if args.pte:
        pte, facts = Path(args.pte).resolve(), facts_module.LoweringFacts.read(BUNDLE / "lowering" / "facts.json")
    else:
        pte, facts = lower(case, out, env)
    if driven is not None:
        drivers = importlib.import_module("harness.pipeline.drivers")
        steps, reference = driven.inputs(card.drive), drivers.run_eager(card, driven)
    else:
        steps = card.steps(case["steps"])
        reference = eager.run_steps(card, steps)
    outcome = outcome_module.CaseOutcome(the_case, steps, BundleLowering(facts, pte), reference)
    if outcome.artifact.ok and any(spec.needs_device for spec in specs):
        references = {spec.reference_runner for spec in specs if getattr(spec, "reference_runner", None)}
        run_device(args, case, outcome, out, env, next(iter(references), None))
    judged = {spec.name: judge(spec, outcome) for spec in specs}
    numbers = []
    if outcome.run is not None:
        try:
            numbers = [dict(error.__dict__) for error in outcome.comparison.errors]
        except ValueError:  # outputs of the wrong size: the checks said so
            pass
    return report(case, judged, numbers, facts, out)


def driven_plan(case: dict, the_case):
    """A driven case's plan (harness/pipeline/drivers.py, as the suite drove it: case.json's step count is the
    long driver's horizon); None for a case run on its card's own steps."""
    if not the_case.driver:
        return None
    plan = importlib.import_module("harness.pipeline.drivers").of_run(the_case, case["steps"])
    if len(plan.chunks) != case["steps"]:
        raise ReproError(
            f"driver {the_case.driver} of {the_case.card.name} now makes {len(plan.chunks)} steps where the run "
            f"made {case['steps']}: the card's drive changed since; make the bundle again"
        )
    return plan


def plan_methods(case: dict, the_case) -> list[str]:
    """The method each step runs: a driven case's plan, a multi-method card's plan (card.step_methods, from the
    bundle's card source), else the program's method at case.json's method_index every step (@N, as the suite's
    devices run a single-method program)."""
    driven = driven_plan(case, the_case)
    if driven is not None:
        return driven.methods
    if the_case.card.multi_method:
        return the_case.card.step_methods(case["steps"])
    return [f"@{int(case.get('method_index', 0))}"] * case["steps"]


def run_device(
    args: argparse.Namespace, case: dict, outcome, out: Path, env: dict[str, str], reference_runner: str | None = None
) -> None:
    """Run the steps on the simulator or the phone; the outcome gets the run, or why there is none. With
    reference_runner (a check of the case compares runners: runner_parity), the steps run through it too,
    on the simulator, as the suite's device ran them before judging: outcome.reference_run."""
    inputs = out / "inputs"
    write_inputs(outcome.steps, inputs)
    status, log, runner, device = run_steps(args, case, outcome, inputs, out / "outputs", env)
    outcome.device_kind, outcome.device = device.name, device
    methods = plan_methods(case, outcome.case)
    outcome.run, outcome.run_error = bundle_run(status, log, runner, out / "outputs", outcome.reference, methods)
    feedable = not args.serial and not outcome.case.card.multi_method  # one method per process, on the host
    if outcome.run is None or reference_runner != REFERENCE_RUNNER or runner == REFERENCE_RUNNER or not feedable:
        return  # a check with nothing to compare says it was not measured
    started = time.perf_counter()
    pattern, index = case.get("heap_pattern"), case.get("method_index", 0)
    status, log = run_on_simulator(outcome.artifact.pte, inputs, out / "reference", env, pattern, index)
    run, error = bundle_run(status, log, REFERENCE_RUNNER, out / "reference", outcome.reference)
    outcome.reference_run = sys.modules["harness.outcome"].OtherRun(
        run, error, False, "the HTP simulator", time.perf_counter() - started
    )


def run_steps(args: argparse.Namespace, case: dict, outcome, inputs: Path, outputs: Path, env: dict[str, str]):
    """The steps through the runner the case ran with (the phone's, or on the simulator the suite's compiled
    runner where it builds): (exit status, log, the runner that ran, the device's traits)."""
    pte, methods = outcome.artifact.pte, plan_methods(case, outcome.case)
    driven = driven_plan(case, outcome.case)
    reloads = driven.reloads if driven is not None else ()
    if reloads and (args.serial or case.get("runner", {}).get("name") != SUITE_RUNNER):
        raise ReproError(
            f"driver {outcome.case.driver} loads the program again mid-plan, which only the suite's runner on the "
            f"HTP simulator does here: run without --serial, or rerun the case with the suite (harness repro "
            f"{case['case_id']} --run RUN)"
        )
    if args.serial:
        status, log, runner = run_on_phone(args, case["case_id"], pte, inputs, outputs, methods)
        return status, log, runner, BundleDevice("phone", False, None)
    binary = compiled_runner() if case.get("runner", {}).get("name") == SUITE_RUNNER else None
    pattern = case.get("heap_pattern")
    if binary is not None:
        runner = SUITE_RUNNER
        status, log = run_compiled(binary, pte, inputs, outputs, env, pattern, methods, reloads)
    elif reloads or (outcome.case.driver and len(set(methods)) > 1):
        raise ReproError(
            f"driver {outcome.case.driver} runs its own plan ({len(set(methods))} method(s)"
            + (", the program loaded again mid-plan" if reloads else "")
            + "), which only the suite's runner does, and it cannot be built here (the reason is above)"
        )
    elif (
        outcome.case.card.multi_method or len(set(methods)) > 1
    ):  # upstream's runner runs one method per process: the Python runtime
        runner = PYTHON_RUNTIME
        status, log = run_plan_on_simulator(pte, inputs, outputs, env, pattern)
    else:
        runner = REFERENCE_RUNNER
        status, log = run_on_simulator(pte, inputs, outputs, env, pattern, case.get("method_index", 0))
    return status, log, runner, BundleDevice("emulated", True, pattern)


def bundle_run(status: int, log: str, runner: str, outputs: Path, reference: list[list], methods=None):
    """What one runner process came to, as the outcome holds it: (BundleRun, None), or (None, why not); its
    log is kept beside its outputs folder (runner.log). methods: the method each step ran (its trace's
    registrations are split by them)."""
    log_file = outputs.parent / ("runner.log" if outputs.name == "outputs" else f"{outputs.name}.log")
    log_file.write_text(log)
    if status != 0:
        tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or ["nothing"]
        return None, f"the runner exited {status} (last words: {tail[0][:200]}); see {log_file}"
    raw, missing = read_outputs(outputs, reference)
    if missing:
        return None, missing
    measured = importlib.import_module("harness.runner.run").parse(status, log, "")
    trace, steps = contract().trace_of(outputs), [step.execute_us for step in measured.steps]
    registrations = contract().step_registrations(trace, len(reference), methods)
    run = BundleRun(raw, trace, measured.heap_pattern, runner, steps, measured.peak_rss_kb)
    run.step_rss_kb, run.step_registrations = measured.step_rss_kb, registrations
    return run, None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="repro.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--qnn-sdk",
        metavar="DIR",
        help="QNN SDK root with lib/x86_64-linux-clang (else QNN_SDK_ROOT / LD_LIBRARY_PATH)",
    )
    parser.add_argument("--serial", metavar="S", help="run on this adb device instead of the HTP simulator")
    parser.add_argument(
        "--device-dir",
        default="/data/local/tmp/qnn",
        metavar="DIR",
        help="with --serial: the device folder holding qnn_executor_runner and the QNN libraries of its HTP arch",
    )
    parser.add_argument("--adb", default="adb", metavar="PATH", help="with --serial: the adb to use")
    parser.add_argument(
        "--pte", metavar="FILE", help="run this program (e.g. the bundle's model.pte) instead of lowering again"
    )
    parser.add_argument(
        "--out", default="repro-out", metavar="DIR", help="where this run's files go (default ./repro-out)"
    )
    parser.add_argument("--lowering-child", metavar="REQUEST", help=argparse.SUPPRESS)
    parser.add_argument("--plan-child", nargs=3, metavar=("PTE", "INPUTS", "OUTPUTS"), help=argparse.SUPPRESS)
    if argv[:1] == ["--runner-child"]:  # the pybindings runner's own flags follow, never this script's
        return runner_child(argv[1:])
    args = parser.parse_args(argv)
    try:
        if args.lowering_child:
            return lowering_child(args.lowering_child)
        if args.plan_child:
            return plan_child(*args.plan_child)
        return reproduce(args)
    except ReproError as error:
        print(f"repro.py: {error}", file=sys.stderr)
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] in {name.partition(".")[0] for name in SUITE_MODULES}:
            print(
                f"repro.py: could not run: the bundle carries no module {error.name!r} (a carried module imports "
                f"it): make the bundle again with the suite",
                file=sys.stderr,
            )
            return 2
        print(
            f"repro.py: could not run: this Python ({sys.executable}) has no module {error.name!r}: run it with a "
            f"Python that has executorch, torch, torchao and numpy (case.json's environment lists the run's versions)",
            file=sys.stderr,
        )
    except Exception as error:  # anything else of this script's own: one line, never a traceback
        print(f"repro.py: could not run: {type(error).__name__}: {' '.join(str(error).split())[:300]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
