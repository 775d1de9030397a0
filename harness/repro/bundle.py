"""Writes a case's reproduction bundle on the worker that ran it, while the run's work dir still holds
its files (the work dir is deleted when the run ends).

Called by the run_check fixture (harness/fixtures.py), once the verdict is decided, with each check of a failed, expected-to-fail
or unexpectedly passing kind (or every check, with --repro-all). The case's files are copied once, by
its first such check; every such check adds itself to case.json and issue.md is rewritten, so the folder is
complete after any check. Every other check of the case (passed, skipped...) is recorded in case.json too,
without its evidence: repro.py judges every check the run judged, and needs each one's verdict. The .tar.gz of it is made once, when the worker goes on to another case's bundle
or the session ends (a case's checks run one after another on one worker: `--dist loadgroup`), not once per
check: 514 archives were 226 cases' in a warm default run. Bundles carry no QNN or executorch library:
repro.py needs them installed (see harness/repro/standalone.py). They carry the suite's own code that
repro.py runs: the pipeline and the check modules (standalone.SUITE_MODULES), and every module that
declared a registered check (a user's @check too), listed with their hashes in suite/manifest.json.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import shutil
import sys
import tarfile
from dataclasses import replace
from functools import cache, partial
from pathlib import Path

import numpy as np
import torch

from harness import check_registry
from harness.device.execute import DEVICE_LOG
from harness.files import say
from harness.known_failures import KnownFailure
from harness.numerics import TOLERANCES
from harness.outcome import CaseOutcome
from harness.paths import REPO_ROOT
from harness.pipeline import drivers
from harness.pipeline.card import ModelCard
from harness.qnn.toolchain import Toolchain
from harness.record import CheckRecord
from harness.repro import exports, issue, layout, standalone
from harness.runner import build as runner_build, contract as runner_contract
from harness.versions import package_version
from harness.vocabulary import Case

PTE_LIMIT_BYTES = 2 * 1024 * 1024  # a larger .pte is left out: repro.py makes it again
SCHEMA_VERSION = 1


@cache
def _source(function: object) -> str:
    """The source of a card's build class or steps function ('' when Python cannot show it); once per
    process, since inspect reads and tokenises the whole file."""
    target = getattr(function, "func", function)  # functools.partial
    try:
        return inspect.getsource(target)
    except (OSError, TypeError):
        return ""


def _argument_text(value: object) -> str | None:
    """An argument as the script writes it: a Python literal, or a torch dtype (torch.int32); None otherwise."""
    if isinstance(value, torch.dtype):
        return repr(value)
    text = repr(value)
    try:
        return text if ast.literal_eval(text) == value else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _call_arguments(function: object) -> dict | None:
    """A functools.partial's bound arguments as text (_argument_text), so a script cut out of the card module
    can call the class or function as the card does; none for a plain one, None when one cannot be written."""
    if not isinstance(function, partial):
        return {"args": [], "kwargs": {}}
    arguments = {
        "args": [_argument_text(value) for value in function.args],
        "kwargs": {key: _argument_text(value) for key, value in function.keywords.items()},
    }
    return None if None in arguments["args"] or None in arguments["kwargs"].values() else arguments


def _plan(case: Case, steps: int) -> list[str]:
    """The method of each step, for issue.md and a reader (repro.py takes it from the card's source): a driven
    case's driver plan (its step count the long driver's horizon), a multi-method card's plan, [] for forward."""
    if case.driver:
        return drivers.of_run(case, steps).methods
    return case.card.step_methods(steps) if case.card.multi_method else []


def card_record(card: ModelCard, card_file: str) -> dict:
    """case.json's "card": what a reader (issue.md, the finding scripts of harness/report/nightly/issues.py) needs to
    rebuild the card from the bundle's copy of its module."""
    return {
        "name": card.name,
        "module": card.module,
        "reference": card.reference,
        "file": f"card/{card_file}",
        "mutated_buffers": list(card.mutated_buffers),
        "expected_partitions": card.expected_partitions,
        "build_source": _source(card.build),
        "steps_source": _source(card.steps),
        "build_arguments": _call_arguments(card.build),
        "steps_arguments": _call_arguments(card.steps),
        "methods": list(card.methods),
        "plan_source": _source(card.plan) if card.plan is not None else "",
        # The compiler-spec options the card asks for (issue.md names them in its pipeline)
        "online_prepare": card.online_prepare,
        "shared_buffer": card.shared_buffer,
    }


class BundleWriter:
    def __init__(self, run_folder: Path, toolchain: Toolchain, write_passes: bool) -> None:
        """run_folder: reports/<run>; write_passes: bundles for every check, passes and skips too (--repro-all)."""
        self._run_folder, self._toolchain, self._write_passes = run_folder, toolchain, write_passes
        self._unarchived: Path | None = None  # the folder whose checks were added since it was last archived
        # Case id -> the checks of it judged on this worker before its bundle existed, without evidence:
        # case.json records them when the bundle is made (a worker's cases interleave, test file by test file).
        self._earlier: dict[str, dict[str, dict]] = {}

    def add(self, record: CheckRecord, outcome: CaseOutcome, signature: str, known: KnownFailure | None) -> CheckRecord:
        """Add the check to its case's bundle; the record comes back with the bundle's link (or as it
        was, when the check is not bundled or the bundle cannot be written: one line says why)."""
        bundled = record.verdict.bundled or self._write_passes
        folder = self._run_folder / record.soc / layout.link(record.case_id)
        finding, _, upstream = (known.reference if known else "").partition(";")
        entry = {
            "verdict": record.verdict,
            "signature": signature,
            "message": record.message,
            "known_failure": record.known_failure,
            "finding": finding.strip(),
            "upstream": upstream.strip(),
            "evidence": record.evidence if bundled else {},
            "nodeid": record.nodeid,
        }
        if not bundled and not (folder / layout.CASE_FILE).is_file():
            self._earlier.setdefault(record.case_id, {})[record.check] = entry
            return record
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / layout.CASE_FILE).is_file():
                self._write_case_files(folder, outcome)
            case = json.loads((folder / layout.CASE_FILE).read_text())
            case["checks"].update(self._earlier.pop(record.case_id, {}))
            case["checks"][record.check] = entry
            (folder / layout.CASE_FILE).write_text(json.dumps(case, indent=1, default=str) + "\n")
            (folder / "issue.md").write_text(issue.render(case))
        except Exception as error:  # a bundle that cannot be written must not cost the run its verdicts and reports
            say(f"qnnsuite: no reproduction bundle for {record.case_id} ({type(error).__name__}: {error})")
            return record
        if self._unarchived != folder:
            self.archive()
            self._unarchived = folder
        return replace(record, repro=layout.link(record.case_id)) if bundled else record

    def archive(self) -> None:
        """Make the .tar.gz of the folder whose checks were added last (a failure costs one line, not the run)."""
        folder, self._unarchived = self._unarchived, None
        if folder is None:
            return
        try:
            _archive(folder)
        except Exception as error:
            say(f"qnnsuite: no .tar.gz of the reproduction bundle {folder.name} ({type(error).__name__}: {error})")

    def _write_case_files(self, folder: Path, outcome: CaseOutcome) -> None:
        case, artifact = outcome.case, outcome.artifact
        card_file = Path(sys.modules[case.card.module].__file__)
        shutil.rmtree(folder, ignore_errors=True)
        for directory in ("card", "suite", "lowering", "reference", "device"):
            (folder / directory).mkdir(parents=True)
        shutil.copyfile(card_file, folder / "card" / card_file.name)
        _write_suite(folder, case.card.module, card_file)
        shutil.copyfile(Path(standalone.__file__), folder / "repro.py")
        for name in ("lower.log", "facts.json", "request.json"):
            if (artifact.directory / name).is_file():
                shutil.copyfile(artifact.directory / name, folder / "lowering" / name)
        rows = runner_contract.write_inputs(outcome.steps, folder / "inputs")
        names = [[path.name for path in row] for row in rows]
        runner_contract.write_input_list(names, folder / "inputs" / runner_contract.INPUT_LIST_NAME)
        for step, row in enumerate(outcome.reference):
            for index, array in enumerate(row):
                np.save(folder / "reference" / f"output_{step}_{index}.npy", array)
        if outcome.run is not None:
            for path in [path for row in outcome.run.output_files for path in row] + [outcome.run.trace]:
                if path is not None and path.is_file():
                    shutil.copyfile(path, folder / "device" / path.name)
            (folder / "device" / "runner.log").write_text(outcome.run.log)
        elif outcome.run_dir is not None:
            for name in ("runner.log", DEVICE_LOG):  # device.log: the failed run's logcat lines
                if (outcome.run_dir / name).is_file():
                    shutil.copyfile(outcome.run_dir / name, folder / "device" / name)
        _write_reference_run(folder, outcome)
        pte = _pte(artifact.pte, folder)
        (folder / layout.CASE_FILE).write_text(
            json.dumps(self._case(outcome, card_file, pte), indent=1, default=str) + "\n"
        )

    def _case(self, outcome: CaseOutcome, card_file: Path, pte: dict) -> dict:
        case, artifact, probe = outcome.case, outcome.artifact, self._toolchain.probe
        error = artifact.facts.error
        return {
            "schema_version": SCHEMA_VERSION,
            "case_id": case.id,
            "dtype": case.dtype,
            "mode": case.mode.value,
            "soc": case.soc,
            "steps": len(outcome.steps),
            "skip_mutable_buffer": case.skip_mutable_buffer,
            "share_mutable_buffers": case.share_mutable_buffers,
            # A multi-method card's plan, the method of each step (repro.py takes it from the card's source;
            # here for issue.md and a reader); [] for a single-method program.
            "plan": _plan(case, len(outcome.steps)),
            # A driven case's driver (harness/pipeline/drivers.py): repro.py drives the card the same way, its
            # step count the long driver's horizon; "" for a case run on the card's own steps.
            "driver": case.driver,
            "card": card_record(case.card, card_file.name),
            "tolerance": TOLERANCES.get(case.dtype),  # the state checks' bound for this dtype (the issue's script)
            "environment": {
                "executorch": package_version("executorch"),
                "torch": package_version("torch"),
                "torchao": package_version("torchao"),
                "python": sys.version.split()[0],
                "qnn_build_id": probe.build_id,
                "qnn_sdk": self._toolchain.sdk.origin,
                "device_config_bridge": probe.bridge_device_config,
                "device_serial": outcome.device_serial,
                "device_kind": outcome.device_kind,
                "run": self._run_folder.name,
                "exports": exports.lines(self._toolchain),
            },
            "lowering": {
                "ok": artifact.ok,
                "error": artifact.failure if not artifact.ok else "",
                "traceback": error.traceback if error else "",
                "delegates": artifact.delegate_count,
                "cached": artifact.cached,
                "qnn_errors": artifact.qnn_errors[:10],
            },
            "run_error": outcome.run_error or "",
            "numbers": _numbers(outcome),
            "pte": pte,
            "checks": {},
            # The byte the device's fresh heap allocations held (None: unknown, e.g. a phone): repro.py starts its
            # simulator run the same way, so an uninitialised buffer reads the same bytes.
            "heap_pattern": outcome.run.heap_pattern if outcome.run is not None else None,
            "method_index": artifact.facts.method_index,
            "runner": _runner(outcome),
            "reference_run": _reference_run(outcome),
        }


def _write_reference_run(folder: Path, outcome: CaseOutcome) -> None:
    """device/reference/: the outputs and log of the case's run through the reference runner (runner_parity
    compared them with the case's run), for a reader; repro.py runs that runner again to judge the check."""
    other = outcome.reference_run
    if other is None or other.run is None:
        return
    (folder / "device" / "reference").mkdir()
    for path in [path for row in getattr(other.run, "output_files", []) for path in row]:
        if path.is_file():
            shutil.copyfile(path, folder / "device" / "reference" / path.name)
    (folder / "device" / "reference" / "runner.log").write_text(getattr(other.run, "log", ""))


def _reference_run(outcome: CaseOutcome) -> dict | None:
    """The reference run a check compared the case's run with (None: the case had none)."""
    other = outcome.reference_run
    if other is None:
        return None
    runner = other.run.runner if other.run is not None else None
    return {
        "runner": runner,
        "error": other.error or "",
        "device_serial": other.device_serial,
        "seconds": other.seconds,
    }


def _runner(outcome: CaseOutcome) -> dict:
    """Which runner ran the case (repro.py runs the same one: the compiled runner from the bundle's source,
    built by the bundle's copy of harness/runner/build.py) and the command that builds it, for a reader."""
    name = outcome.run.runner if outcome.run is not None else standalone.SUITE_RUNNER
    try:
        compiler = runner_build.find_compiler()
        install = runner_build.find_executorch()
        command = runner_build.compile_command(compiler, install, Path(runner_build.BINARY_NAME))
        command = [standalone.RUNNER_SOURCE if word == str(runner_build.SOURCE) else word for word in command]
    except runner_build.RunnerBuildError as error:
        command = [f"(not buildable where the run was: {error})"]
    return {"name": name, "source": standalone.RUNNER_SOURCE, "build_command": command}


def _write_suite(folder: Path, card_module: str, card_file: Path) -> None:
    """suite/: the suite's modules repro.py runs and every module that declared a registered check (the
    registry knows each check's function, so a user's @check is judged in the bundle too), and
    suite/manifest.json: each module's name, its file in the bundle, where it came from and its sha256."""
    sources = {name: REPO_ROOT / (name.replace(".", "/") + ".py") for name in standalone.SUITE_MODULES}
    checks = {spec.name: spec.function.__module__ for spec in check_registry.specs()}
    for module in checks.values():
        if module not in sources and module != card_module:
            sources[module] = Path(sys.modules[module].__file__)
    modules = {}
    for name, source in sources.items():
        shutil.copyfile(source, folder / "suite" / f"{name}.py")
        modules[name] = _manifest_entry(f"suite/{name}.py", source)
    # The compiled runner's source, where the carried harness.runner.build looks for it (its SOURCE).
    shutil.copyfile(runner_build.SOURCE, folder / standalone.RUNNER_SOURCE)
    modules[card_module] = _manifest_entry(f"card/{card_file.name}", card_file)
    manifest = {"schema_version": SCHEMA_VERSION, "modules": modules, "checks": checks}
    (folder / standalone.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _manifest_entry(file: str, source: Path) -> dict[str, str]:
    shown = source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else Path(source.name)
    return {"file": file, "source": str(shown), "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}


def _numbers(outcome: CaseOutcome) -> list[dict]:
    """Device vs eager per step, as the state check saw it ([] when nothing ran)."""
    if outcome.run is None:
        return []
    try:
        return [dict(error.__dict__) for error in outcome.comparison.errors]
    except ValueError:  # outputs of the wrong size: the checks say so, the bundle has the files
        return []


def _pte(pte: Path, folder: Path) -> dict:
    if not pte.is_file():
        return {"file": "", "bytes": 0, "note": "lowering made no program"}
    size = pte.stat().st_size
    if size > PTE_LIMIT_BYTES:
        return {
            "file": "",
            "bytes": size,
            "note": f"{size} bytes is over the bundle limit of {PTE_LIMIT_BYTES}: `python repro.py` lowers it again "
            f"(into repro-out/lowering/model.pte)",
        }
    shutil.copyfile(pte, folder / "model.pte")
    return {"file": "model.pte", "bytes": size, "note": ""}


def _archive(folder: Path) -> None:
    """<folder>.tar.gz beside the folder, swapped in whole so a reader never sees half of it."""
    target = folder.parent / (folder.name + layout.ARCHIVE_SUFFIX)
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    # Rewritten by each bundled check of the case: the fastest level, as the .pte inside barely compresses.
    with tarfile.open(staging, "w:gz", compresslevel=1) as archive:
        archive.add(folder, arcname=folder.name)
    os.replace(staging, target)
