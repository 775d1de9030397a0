"""repro.py of a reproduction bundle: re-creates one case of the QNN mutable-buffer conformance suite
without the suite, and says whether its failure still shows.

    python repro.py [--qnn-sdk DIR] [--serial SERIAL --device-dir DIR] [--pte FILE] [--out DIR]

Needs executorch, torch, torchao and numpy, and the host QNN libraries (x86_64): `--qnn-sdk DIR`, or
QNN_SDK_ROOT and LD_LIBRARY_PATH already set. It rebuilds the model from the card's source (card/),
exports, quantizes and lowers it in a child process with the suite's own settings (suite/, copies of
the suite's pipeline modules, loaded under their suite names through a small shim so the card source
runs unchanged), runs the steps on the HTP simulator or, with --serial, with your qnn_executor_runner
on a phone through adb, compares with eager PyTorch by the suite's tolerances and prints the verdict
and the numbers per step.

Exit status: 1 the failure reproduces (a check fails), 0 it does not (every check passes), 2 the
script could not run (its one line says why). This file is the suite's harness/repro/standalone.py,
copied unchanged into every bundle; it imports nothing of the suite.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent
# The suite modules a bundle carries, by the name the copied code imports them with. The bundle's
# file is suite/<name>.py; the order is the order they are loaded in (each imports only earlier ones).
SUITE_MODULES = ("harness.vocabulary", "harness.files", "harness.pipeline.facts", "harness.pipeline.eager", "harness.numerics",
                 "harness.pipeline.stages", "harness.pipeline.prepared", "harness.pipeline.mutbuf",
                 "harness.pipeline.meta_llama", "harness.pipeline.lower_job",
                 "harness.emulator.host_runner")
SHIM = "harness.pipeline.card"  # what card modules import ModelCard and register from
HOST_LIBRARY = "libQnnHtp.so"
HOST_LIB_SUBDIR = ("lib", "x86_64-linux-clang")
QNN_BACKEND = "QnnBackend"
DEVICE_CHECKS = ("address_sharing", "state", "initial_state")


class ReproError(RuntimeError):
    """The script cannot do its work; the message is one line naming the fix."""


# --- loading the card and the suite's pipeline from the bundle ------------------------------------
def _package(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = sys.modules[name] = types.ModuleType(name)
        module.__path__ = []  # a namespace-like package: its children are put in sys.modules by hand
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_package(parent), child, module)
    return module


def _load(name: str, path: Path) -> types.ModuleType:
    parent, _, child = name.rpartition(".")
    if parent:
        _package(parent)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)
    spec.loader.exec_module(module)
    return module


def _card_shim(vocabulary: types.ModuleType) -> types.ModuleType:
    """Stands in for the suite's card registry: card modules call register(ModelCard(...))."""
    shim = types.ModuleType(SHIM)
    registry: dict = {}

    def register(card):
        registry[card.name] = card
        return card

    shim.ModelCard, shim.register, shim.cards = vocabulary.ModelCard, register, lambda: list(registry.values())
    shim.find = lambda reference: registry[reference.partition(":")[2]]
    shim.load_module = lambda module: None  # the bundle's one card module is loaded up front
    sys.modules[SHIM] = shim
    setattr(_package("harness.pipeline"), "card", shim)
    return shim


def load_suite(case: dict) -> dict[str, types.ModuleType]:
    """The suite's modules (from suite/) and the case's card module (from card/), importable by name."""
    modules = {"harness.vocabulary": _load("harness.vocabulary", BUNDLE / "suite" / "harness.vocabulary.py")}
    shim = _card_shim(modules["harness.vocabulary"])
    for name in SUITE_MODULES[1:]:
        modules[name] = _load(name, BUNDLE / "suite" / f"{name}.py")
    _load(case["card"]["module"], BUNDLE / case["card"]["file"])
    modules["card"] = shim.find(case["card"]["reference"])
    return modules


# --- the QNN host environment ------------------------------------------------------------------------
def qnn_environment(qnn_sdk: str | None) -> dict[str, str]:
    """The environment of the lowering and running children: --qnn-sdk, else what the caller set."""
    env = dict(os.environ)
    if qnn_sdk:
        lib_dir = Path(qnn_sdk).resolve().joinpath(*HOST_LIB_SUBDIR)
        if not (lib_dir / HOST_LIBRARY).is_file():
            raise ReproError(f"--qnn-sdk {qnn_sdk}: no {'/'.join(HOST_LIB_SUBDIR)}/{HOST_LIBRARY} there; "
                             f"pass the root of a QNN SDK (QAIRT) with its x86_64 host libraries")
        env["QNN_SDK_ROOT"] = str(Path(qnn_sdk).resolve())
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(lib_dir), *filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep))])
    places = [Path(p) for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if env.get("QNN_SDK_ROOT"):
        places.append(Path(env["QNN_SDK_ROOT"]).joinpath(*HOST_LIB_SUBDIR))
    if not any((place / HOST_LIBRARY).is_file() for place in places):
        raise ReproError(f"no host QNN library ({HOST_LIBRARY}) in LD_LIBRARY_PATH or QNN_SDK_ROOT: pass "
                         f"--qnn-sdk DIR (a QNN SDK root), or set both as issue.md's 'Steps' says")
    env.pop("PYTHONPATH", None)  # the children load the suite from this bundle, never from elsewhere
    return env


# --- lowering, in a child process (running a program in the process that lowered it crashed) ----------
def lower(case: dict, out: Path, env: dict[str, str]) -> tuple[Path | None, object]:
    """Export, quantize and lower as the suite does; returns (model.pte or None, the lowering facts)."""
    facts_module, vocabulary = sys.modules["harness.pipeline.facts"], sys.modules["harness.vocabulary"]
    lowering = out / "lowering"
    lowering.mkdir(parents=True, exist_ok=True)
    request = lowering / "request.json"
    facts_module.LoweringRequest(case["card"]["reference"], case["dtype"], vocabulary.Mode(case["mode"]), case["soc"],
                                 case["steps"], str(lowering)).write(request)
    for stale in ("model.pte", "facts.json"):
        (lowering / stale).unlink(missing_ok=True)
    with open(lowering / "lower.log", "wb") as log:
        completed = subprocess.run([sys.executable, str(BUNDLE / "repro.py"), "--lowering-child", str(request)],
                                   env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        facts = facts_module.LoweringFacts.read(lowering / "facts.json")
    except facts_module.FactsError:
        facts = facts_module.LoweringFacts.crashed(f"lowering process exited {completed.returncode} without facts; "
                                                   f"see {lowering / 'lower.log'}")
    pte = lowering / "model.pte"
    return (pte if facts.error is None and pte.is_file() else None), facts


def lowering_child(request: str) -> int:
    case = json.loads((BUNDLE / "case.json").read_text())
    load_suite(case)
    return sys.modules["harness.pipeline.lower_job"].main([request])


# --- running the steps --------------------------------------------------------------------------------
def write_inputs(steps: list[tuple], directory: Path) -> Path:
    """One raw file per input per step and the runner's input list (one line per step)."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, inputs in enumerate(steps):
        names = []
        for index, tensor in enumerate(inputs):
            names.append(f"input_{step}_{index}.raw")
            np.ascontiguousarray(tensor.detach().numpy()).tofile(directory / names[-1])
        lines.append(" ".join(names) + "\n")
    (directory / "input_list.txt").write_text("".join(lines))
    return directory / "input_list.txt"


def heap_environment(env: dict[str, str], pattern: int | None) -> dict[str, str]:
    """env plus glibc's settings that make fresh heap allocations hold `pattern`, as on the suite's device
    (MALLOC_PERTURB_ fills with its value ^ 0xff; the per-thread cache would hand out unfilled chunks)."""
    if pattern is None:
        return env
    return {**env, "MALLOC_PERTURB_": str(pattern ^ 0xFF), "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


def run_on_simulator(pte: Path, inputs: Path, outputs: Path, env: dict[str, str], heap_pattern: int | None = None,
                     method_index: int = 0) -> tuple[int, str]:
    """The suite's emulated qnn_executor_runner: every step on one loaded method, on the HTP simulator."""
    completed = subprocess.run([sys.executable, str(BUNDLE / "suite" / "harness.emulator.host_runner.py"),
                                "--model_path", str(pte), "--input_list_path", "input_list.txt",
                                "--output_folder_path", str(outputs), "--method_index", str(method_index)],
                               cwd=inputs, env=heap_environment(env, heap_pattern),
                               stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return completed.returncode, completed.stdout + completed.stderr


def run_on_phone(args: argparse.Namespace, case_id: str, pte: Path, inputs: Path, outputs: Path) -> tuple[int, str]:
    """Your qnn_executor_runner and QNN libraries in --device-dir on the phone; files over adb."""
    adb = [args.adb, "-s", args.serial]
    remote = "/data/local/tmp/qnnsuite-repro/" + (re.sub(r"[^A-Za-z0-9_.-]", "_", case_id).strip(".") or "case")
    device_dir = shlex.quote(args.device_dir)

    def adb_run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*adb, *command], stdin=subprocess.DEVNULL, capture_output=True, text=True)

    steps = [adb_run("shell", f"rm -rf {shlex.quote(remote)} && mkdir -p {shlex.quote(remote + '/outputs')}"),
             adb_run("push", str(pte), f"{remote}/model.pte"),
             adb_run("push", *(str(path) for path in sorted(inputs.iterdir())), f"{remote}/")]
    failed = next((step for step in steps if step.returncode != 0), None)
    if failed is not None:
        raise ReproError(f"adb {' '.join(failed.args[3:5])} on {args.serial} failed: {(failed.stderr or failed.stdout).strip()[:200]}")
    command = (f"cd {shlex.quote(remote)} && LD_LIBRARY_PATH={device_dir}:$LD_LIBRARY_PATH ADSP_LIBRARY_PATH={device_dir} "
               f"{device_dir}/qnn_executor_runner --model_path model.pte --input_list_path input_list.txt "
               f"--output_folder_path outputs; echo \"exit=$?\"")
    ran = adb_run("shell", command)
    log = ran.stdout + ran.stderr
    status = int(log.rsplit("exit=", 1)[1].split()[0]) if "exit=" in log else ran.returncode
    outputs.mkdir(parents=True, exist_ok=True)
    pulled = adb_run("pull", f"{remote}/outputs/.", str(outputs))
    if pulled.returncode != 0 and status == 0:
        raise ReproError(f"adb pull from {args.serial} failed: {(pulled.stderr or pulled.stdout).strip()[:200]}")
    return status, log


def read_outputs(outputs: Path, reference: list[list]) -> list[list]:
    """The runner's raw files, in the reference's dtypes and shapes."""
    import numpy as np

    shaped = []
    for step, row in enumerate(reference):
        shaped_row = []
        for index, expected in enumerate(row):
            path = outputs / f"output_{step}_{index}.raw"
            if not path.is_file():
                raise ReproError(f"the runner wrote no {path.name}; see {outputs.parent / 'runner.log'}")
            raw = np.fromfile(path, dtype=np.uint8)
            if raw.nbytes != expected.nbytes:
                raise ReproError(f"{path.name}: {raw.nbytes} bytes, eager has {expected.nbytes} ({expected.dtype}{list(expected.shape)})")
            shaped_row.append(raw.view(expected.dtype).reshape(expected.shape))
        shaped.append(shaped_row)
    return shaped


# --- the checks, as the suite words them ----------------------------------------------------------------
class Verdicts:
    """Each check's verdict in this run: ("passed" | "failed" | "skipped", signature, one line)."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[str, str, str]] = {}
        self.steps: list[dict] = []

    def passed(self, check: str, line: str = "") -> None:
        self.results[check] = ("passed", "", line)

    def failed(self, check: str, signature: str, line: str) -> None:
        self.results[check] = ("failed", signature, line)

    def skipped(self, check: str, why: str) -> None:
        self.results[check] = ("skipped", "", why)


def judge_lowering(case: dict, card, facts, verdicts: Verdicts, checks: list[str]) -> None:
    error = facts.error
    failure = f"lowering failed: {error.type}: {error.message}" if error else ""
    for check in checks:
        if check == "export" and facts.export is not None:
            found, expected = sorted(facts.export.buffers_to_mutate), sorted(card.mutated_buffers)
            if found != expected:
                verdicts.failed(check, "buffers_to_mutate_mismatch", f"exported buffers_to_mutate {found} != the card's {expected}")
            else:
                verdicts.passed(check, f"buffers_to_mutate {found}")
        elif check == "annotation" and case["dtype"] == "fp16":
            verdicts.skipped(check, "fp16 is not quantized")
        elif check == "annotation" and facts.quantize is not None:
            judge_annotation(facts.quantize, verdicts)
        elif error is not None and check in ("export", "annotation", "partitions", "meta_llama_partitions", *DEVICE_CHECKS):
            verdicts.failed(check, "lowering_failed", failure)
        elif check in ("partitions", "meta_llama_partitions"):
            judge_partitions(case, card, facts.partitions, verdicts, check)


def judge_annotation(quantize, verdicts: Verdicts) -> None:
    if quantize.annotated_buffer_inputs:
        first = quantize.annotated_buffer_inputs[0]
        verdicts.failed("annotation", "buffer_annotated", f"mutated buffer {first['buffer']} is annotated for "
                        f"quantization as an input of {first['op']}")
    elif quantize.qdq_around_buffers:
        first = quantize.qdq_around_buffers[0]
        verdicts.failed("annotation", "qdq_around_buffer", f"mutated buffer {first['buffer']} feeds {first['op']}")
    elif quantize.folded_buffer_reads:
        name = next(iter(quantize.folded_buffer_reads))
        verdicts.failed("annotation", "buffer_reads_folded", f"convert_pt2e folded reads of mutated buffer {name} into constants")
    else:
        verdicts.passed("annotation")


def judge_partitions(case: dict, card, partitions, verdicts: Verdicts, check: str) -> None:
    backends = sorted({d.backend for d in partitions.delegates})
    outside, buffers = sorted(partitions.buffers_outside), sorted(card.mutated_buffers)
    summary = f"{len(partitions.delegates)} delegate(s) {backends}; buffers outside: {outside or 'none'}"
    skip = case["mode"] != "delegate_mutbuf"
    if len(partitions.delegates) != card.expected_partitions or backends != [QNN_BACKEND]:
        verdicts.failed(check, "partition_count", f"{summary}; expected {card.expected_partitions} x {QNN_BACKEND}")
    elif skip and outside != buffers:
        verdicts.failed(check, "buffer_not_outside", f"{summary}; skip_mutable_buffer=True must keep {buffers} outside")
    elif not skip and outside:
        verdicts.failed(check, "buffer_outside_delegate", f"{summary}; with buffer delegation none may stay outside")
    else:
        verdicts.passed(check, summary)


def judge_run(case: dict, card, steps: list[tuple], reference, device, trace: Path, verdicts: Verdicts, checks: list[str]) -> None:
    import numpy as np

    numerics, mutbuf = sys.modules["harness.numerics"], sys.modules["harness.pipeline.mutbuf"]
    comparison = numerics.compare(device, reference, case["dtype"])
    verdicts.steps = [dict(e.__dict__) for e in comparison.errors]
    dependence = numerics.initial_value_dependence(card, steps, reference)
    delegated = case["mode"] == "delegate_mutbuf"
    if "state" in checks:
        bad = [e for e in comparison.errors if e.mismatches]
        if not bad:
            verdicts.passed("state")
        else:
            explained = all(not np.any(mask & ~dep) for mask_row, dep_row in zip(comparison.masks, dependence)
                            for mask, dep in zip(mask_row, dep_row))
            line = (f"state differs from eager: {sum(e.mismatches for e in bad)} element(s) out of tolerance in "
                    f"{len(bad)}/{len(comparison.errors)} step(s); first at step {bad[0].step}, max abs error "
                    f"{bad[0].max_abs_error:.4g}, SQNR {bad[0].sqnr_db:.1f} dB")
            if explained and delegated:
                verdicts.failed("state", "uninitialised_delegated_buffer", line + "; every mismatch depends on the buffer's initial value")
            else:
                verdicts.failed("state", "state_mismatch", line)
    if "initial_state" in checks:
        only_dependent = numerics.only_where(comparison.masks, dependence)
        wrong = numerics.count(only_dependent)
        if not numerics.count(dependence):
            verdicts.skipped("initial_state", "no output element depends on the buffers' initial values")
        elif wrong:
            first = next(step for step, row in enumerate(only_dependent) if any(mask.any() for mask in row))
            line = f"{wrong} output element(s) that depend on the registered initial value differ from eager, first at step {first}"
            if delegated:
                verdicts.failed("initial_state", "uninitialised_delegated_buffer",
                                line + "; the delegated buffer did not start from its registered value")
            else:
                verdicts.failed("initial_state", "initial_value_ignored", line)
        else:
            verdicts.passed("initial_state", f"{numerics.count(dependence)} dependent element(s) match")
    if "address_sharing" in checks:
        judge_addresses(case, mutbuf, trace, verdicts)


def judge_addresses(case: dict, mutbuf, trace: Path, verdicts: Verdicts) -> None:
    if not trace.is_file():
        verdicts.skipped("address_sharing", "no execute trace: it comes from the suite's interposer library only")
        return
    bindings = mutbuf.bindings(mutbuf.read_trace(trace))
    split = [b for b in bindings if not b.shared]
    if case["mode"] != "delegate_mutbuf" and bindings:
        verdicts.failed("address_sharing", "mutbuf_in_skip_mode", f"skip_mutable_buffer=True but the graph has mutbuf tensors ({bindings[0].input_name})")
    elif case["mode"] == "delegate_mutbuf" and not bindings:
        verdicts.failed("address_sharing", "no_mutbuf_pair", "no mutbuf pair in the compiled graph")
    elif split:
        verdicts.failed("address_sharing", "split_address", f"execute {split[0].execute}: {split[0].input_name} at "
                        f"{split[0].input_address} but {split[0].output_name} at {split[0].output_address}")
    else:
        verdicts.passed("address_sharing", f"{len(bindings)} binding(s), each input and output at one address")


# --- the report ------------------------------------------------------------------------------------------
def report(case: dict, verdicts: Verdicts, facts, out: Path) -> int:
    recorded = case["checks"]
    failing = []
    if facts is not None and facts.error is not None:
        print(f"lowering: lowering failed: {facts.error.type}: {facts.error.message}")
        print(f"  (its log, with the QNN messages: {out / 'lowering' / 'lower.log'})")
    elif facts is not None and facts.partitions is not None:
        print(f"lowering: ok, {len(facts.partitions.delegates)} delegate(s), buffers outside the delegates: "
              f"{', '.join(facts.partitions.buffers_outside) or 'none'}")
    for check, (verdict, signature, line) in verdicts.results.items():
        if signature == "lowering_failed" and facts is not None and facts.error is not None:
            line = "(the lowering above)"
        was = recorded.get(check, {})
        if signature and signature == was.get("signature"):
            note = "as recorded"
        else:
            note = f"recorded: {was.get('verdict', 'not recorded')}" + (f" [{was['signature']}]" if was.get("signature") else "")
        print(f"{check}: {verdict.upper()}{f' [{signature}]' if signature else ''} {line}".rstrip() + f"  ({note})")
        if verdict == "failed":
            failing.append(check)
    for step in verdicts.steps:
        print(f"  step {step['step']}: max abs error {step['max_abs_error']!r}, SQNR {step['sqnr_db']:.2f} dB, "
              f"{step['mismatches']} element(s) out of tolerance")
    reproduced = bool(failing)
    print(f"verdict: {'REPRODUCED' if reproduced else 'NOT REPRODUCED'}"
          + (f" ({', '.join(failing)} fail)" if reproduced else " (every check passes)"))
    (out / "result.json").write_text(json.dumps(
        {"case_id": case["case_id"], "reproduced": reproduced, "steps": verdicts.steps,
         "checks": {check: {"verdict": v, "signature": s, "message": m} for check, (v, s, m) in verdicts.results.items()}},
        indent=1, default=str))
    return 1 if reproduced else 0


def reproduce(args: argparse.Namespace) -> int:
    case = json.loads((BUNDLE / "case.json").read_text())
    env = qnn_environment(args.qnn_sdk)
    modules = load_suite(case)
    card, eager = modules["card"], modules["harness.pipeline.eager"]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    checks = [name for name, check in case["checks"].items() if check["verdict"] != "skipped"] or list(case["checks"])
    where = f"phone {args.serial}" if args.serial else "the HTP simulator"
    print(f"{case['case_id']}: {case['card']['name']}, {case['dtype']}, {case['mode']}, {case['steps']} step(s), on {where}")
    verdicts = Verdicts()
    if args.pte:
        pte, facts = Path(args.pte).resolve(), None
    else:
        pte, facts = lower(case, out, env)
        judge_lowering(case, card, facts, verdicts, checks)
    wanted = [check for check in checks if check in DEVICE_CHECKS]
    if pte is not None and wanted:
        steps = card.steps(case["steps"])
        reference = eager.run_steps(card, steps)
        inputs = out / "inputs"
        write_inputs(steps, inputs)
        outputs = out / "outputs"
        status, log = run_on_phone(args, case["case_id"], pte, inputs, outputs) if args.serial else \
            run_on_simulator(pte, inputs, outputs, env, case.get("heap_pattern"), case.get("method_index", 0))
        (out / "runner.log").write_text(log)
        if status != 0:
            tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or ["nothing"]
            for check in wanted:
                verdicts.failed(check, "not_run", f"the runner exited {status} (last words: {tail[0][:200]}); see {out / 'runner.log'}")
        else:
            judge_run(case, card, steps, reference, read_outputs(outputs, reference), outputs / "trace.jsonl", verdicts, wanted)
    return report(case, verdicts, facts, out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="repro.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--qnn-sdk", metavar="DIR", help="QNN SDK root with lib/x86_64-linux-clang (else QNN_SDK_ROOT / LD_LIBRARY_PATH)")
    parser.add_argument("--serial", metavar="S", help="run on this adb device instead of the HTP simulator")
    parser.add_argument("--device-dir", default="/data/local/tmp/qnn", metavar="DIR",
                        help="with --serial: the device folder holding qnn_executor_runner and the QNN libraries of its HTP arch")
    parser.add_argument("--adb", default="adb", metavar="PATH", help="with --serial: the adb to use")
    parser.add_argument("--pte", metavar="FILE", help="run this program (e.g. the bundle's model.pte) instead of lowering again")
    parser.add_argument("--out", default="repro-out", metavar="DIR", help="where this run's files go (default ./repro-out)")
    parser.add_argument("--lowering-child", metavar="REQUEST", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.lowering_child:
        return lowering_child(args.lowering_child)
    try:
        return reproduce(args)
    except ReproError as error:
        print(f"repro.py: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
