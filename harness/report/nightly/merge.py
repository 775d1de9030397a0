"""`python -m harness.report merge DIR... --out DIR`: the reports of shards (CI jobs, hosts) as one run's.

Each DIR is a run folder (reports/<run>/ with <SOC>/report.json). The merge is refused, in one line, when
the parts cannot be one run: a different executorch, torch, torchao or QNN build (their verdicts would
not be comparable), a case present twice (a shard merged twice, or two slices that overlap), or shards
that do not fit (a mix of counts, an index twice or missing, a sharded run with an unsharded one).
The merged documents are rebuilt from the parts' check records by the same code as a run's
(harness/report/document.py, writer.py), so a merge of shards 1/2 and 2/2 reads like the unsharded run
and `--baseline` and `diff` take it as they take any run. Reproduction bundles are copied along, and so is
each part's provenance (its devices, and any QNN build warning), which the merged page shows as a run's.

The parts are data from other jobs or hosts: each report.json is validated before use (harness/report/
intake.py; a bad one is MalformedReport, exit code 4), the merge writes only under --out (a part's SoC
names a folder there, and nothing else), and only directories and regular files of a part are copied.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from harness.record import CheckRecord
from harness.report.document import Column, records_of
from harness.report.gate import (
    BaselineError,
    GateResult,
    MalformedReport,
    Selection,
    compare,
    of_document,
    of_records,
    read_documents,
    selection_of,
)
from harness.report.nightly.promote import identity
from harness.report.render.writer import copy_findings, write_soc
from harness.repro.layout import REPRO_DIR

VERSION_KEYS = ("executorch", "torch", "torchao", "qnn_build_id")  # what the verdicts depend on
JOINED_KEYS = ("host", "device_serial", "device_model")  # where each part ran, listed in the merge
UNSHARDED = "unsharded"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$")  # a name in a folder name (a night's, in a store)


class MergeError(ValueError):
    """Reports that cannot be merged; the message names the parts and what to do."""


@dataclass(frozen=True)
class Part:
    folder: Path
    documents: list[dict]  # one per SoC

    @property
    def shard(self) -> str:
        labels = {document["environment"].get("shard") or UNSHARDED for document in self.documents}
        if len(labels) > 1:
            raise MergeError(
                f"{self.folder} mixes reports of shards {', '.join(sorted(labels))}: pass one run's folder"
            )
        return labels.pop()


def _inside(out: Path, name: str) -> Path:
    """out/name, refused unless it resolves inside out: a part's SoC (validated by the schema already)
    is a name from a file, and must not make the merge write anywhere else."""
    folder = (out / name).resolve()
    if not folder.is_relative_to(out.resolve()) or folder == out.resolve():
        raise MergeError(f"a part's SoC {name!r} is not a folder name: merge only report.json files a run wrote")
    return folder


def _copy_regular_files(source: Path, target: Path) -> None:
    """The reproduction bundles of a part: directories and regular files only. A symlink (or a device, a
    FIFO) in a part is not copied, so a merged report never links to, nor copies, a file outside its
    parts; each one skipped is named on stderr."""
    if not source.is_dir() or source.is_symlink() or source.parent.is_symlink():
        if source.is_symlink() or source.parent.is_symlink():
            print(f"merge: skipped {source}: a symlink, not a folder of the part", file=sys.stderr)
        return
    for folder, directories, files in os.walk(source):  # os.walk does not descend into linked directories
        here = Path(folder)
        destination = target / here.relative_to(source)
        destination.mkdir(parents=True, exist_ok=True)
        for name in [*directories, *files]:
            entry = here / name
            info = entry.lstat()
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                print(f"merge: skipped {entry}: not a regular file (a symlink or a special file)", file=sys.stderr)
                continue
            shutil.copyfile(entry, destination / name, follow_symlinks=False)
            os.chmod(destination / name, stat.S_IMODE(info.st_mode) & 0o755)  # repro.py stays runnable, by nobody else


def read_parts(folders: list[Path]) -> list[Part]:
    try:
        return [Part(folder, [document for _, document in read_documents(folder)]) for folder in folders]
    except MalformedReport:
        raise  # bad input, not parts that do not fit: the caller says so apart (exit code 4)
    except BaselineError as error:
        raise MergeError(str(error)) from error


def check_versions(parts: list[Part]) -> None:
    for key in VERSION_KEYS:
        seen: dict[str, Path] = {}
        for part in parts:
            for document in part.documents:
                seen.setdefault(str(document["environment"].get(key)), part.folder)
        if len(seen) > 1:
            found = " and ".join(f"{key} {value} in {folder}" for value, folder in seen.items())
            raise MergeError(
                f"cannot merge a mix of versions: {found}; merge only runs of one executorch, torch "
                f"and QNN build (rerun the odd part with the others' versions)"
            )


def check_shards(parts: list[Part]) -> None:
    labels = [part.shard for part in parts]
    sharded = sorted(label for label in labels if label != UNSHARDED)
    if not sharded:
        return
    if len(sharded) < len(labels):
        plain = parts[labels.index(UNSHARDED)].folder
        raise MergeError(f"{plain} is an unsharded run and the others are shards: merge the shards of one run only")
    counts = {label.split("/")[1] for label in sharded}
    if len(counts) > 1:
        raise MergeError(
            f"shards of different counts ({', '.join(sharded)}): merge the shards of one --shard INDEX/COUNT split"
        )
    count = int(counts.pop())
    indices = [int(label.split("/")[0]) for label in sharded]
    missing = sorted(set(range(1, count + 1)) - set(indices))
    if len(indices) != len(set(indices)) or missing:
        twice = sorted({i for i in indices if indices.count(i) > 1})
        problem = (
            f"shard {', '.join(f'{i}/{count}' for i in twice)} given twice"
            if twice
            else f"shard {', '.join(f'{i}/{count}' for i in missing)} missing"
        )
        raise MergeError(f"the shards given are {', '.join(sharded)}: {problem}; pass every shard's run folder once")


def _columns(parts: list[Part], soc: str) -> list[Column]:
    """Every part's columns, each part's order kept (each part shows the registry's order, minus checks
    it had no record of): a new name goes after its predecessor in the part that has it."""
    merged: list[Column] = []
    for part in parts:
        for document in part.documents:
            if document["soc"] != soc:
                continue
            columns = list(document.get("checks") or ())
            for i, column in enumerate(columns):
                names = [c["name"] for c in merged]
                if column["name"] in names:
                    continue
                before = columns[i - 1]["name"] if i and columns[i - 1]["name"] in names else None
                after = next((names.index(c["name"]) for c in columns[i + 1 :] if c["name"] in names), len(merged))
                merged.insert(names.index(before) + 1 if before else after, column)
    return merged


def _environment(documents: list[tuple[Part, dict]], run_id: str) -> dict:
    """The first part's environment, with every part's hosts and devices, the whole time span, and which
    runs (and shards) the merge is made of."""
    environments = [document["environment"] for _, document in documents]
    merged = {
        key: value for key, value in environments[0].items() if key != "shard" and not key.startswith("selection")
    }
    merged |= selection_of(environments).environment()
    for key in JOINED_KEYS:
        values = [str(v) for env in environments for v in str(env.get(key, "")).split(", ") if env.get(key)]
        if values:
            merged[key] = ", ".join(dict.fromkeys(values))
    for key, pick in (("started", min), ("finished", max)):
        if all(env.get(key) for env in environments):
            merged[key] = pick(str(env[key]) for env in environments)
    merged["run_id"] = run_id
    merged["merged_from"] = ", ".join(
        f"{env.get('run_id')}" + (f" (shard {env['shard']})" if env.get("shard") else "") for env in environments
    )
    return merged


def merged_records(parts: list[Part]) -> dict[str, list[tuple[Part, dict]]]:
    """Each SoC's documents, refusing a case that two parts hold."""
    owner: dict[tuple[str, str], Path] = {}
    by_soc: dict[str, list[tuple[Part, dict]]] = {}
    for part in parts:
        for document in part.documents:
            for case in document["cases"]:
                key = (document["soc"], case["case_id"])
                if key in owner:
                    raise MergeError(
                        f"case {case['case_id']} is in both {owner[key]} and {part.folder}: merge each "
                        f"shard once, and only runs of disjoint selections"
                    )
                owner[key] = part.folder
            by_soc.setdefault(document["soc"], []).append((part, document))
    return by_soc


def _provenance(documents: list[tuple[Part, dict]]) -> dict | None:
    """What made the programs and what every part's devices ran them with: the first part's host (the
    versions are equal, check_versions), each device once, each warning once (the QNN build warning
    of any part is the merged run's). None when no part measured it."""
    measured = [document["provenance"] for _, document in documents if isinstance(document.get("provenance"), dict)]
    if not measured:
        return None
    devices = {
        (device.get("device") or device.get("serial")): device
        for provenance in measured
        for device in provenance["devices"]
    }
    warnings = dict.fromkeys(warning for provenance in measured for warning in provenance["warnings"])
    return {"host": measured[0]["host"], "devices": list(devices.values()), "warnings": list(warnings)}


def run_id_of(parts: list[Part], given: str | None) -> str:
    """The merged run's id: --run-id, else the parts' (one run's shards share it; parts run by separate
    jobs each have their own, and the earliest is taken: a run id starts with its start time). Never the
    --out folder's name, which a CI job reuses every night."""
    if given is not None:
        if not RUN_ID.match(given):
            raise MergeError(f"--run-id {given!r}: use letters, digits, '.', '_' and '-' (at most 121), e.g. the date")
        return given
    return min(str(document["run_id"]) for part in parts for document in part.documents)


def _selection(parts: list[Part]) -> Selection:
    """The merged run's selection: the parts' together (shards merged whole are not a narrowing)."""
    return selection_of([document["environment"] for part in parts for document in part.documents])


def _gate(baseline: Path, records: list[CheckRecord], allow_missing: bool, selection: Selection) -> GateResult:
    """The merged records against the baseline's reports, read once, naming the baseline."""
    documents = [document for _, document in read_documents(baseline)]
    before = {key: outcome for document in documents for key, outcome in of_document(document).items()}
    result = compare(before, of_records(records), allow_missing, selection)
    return replace(result, baseline=identity(baseline, documents))


@dataclass(frozen=True)
class Merged:
    records: list[CheckRecord]  # every part's, for the summary lines
    verdict: GateResult | None  # None without a baseline


def merge(
    folders: list[Path],
    out: Path,
    baseline: Path | None = None,
    allow_missing: bool = False,
    run_id: str | None = None,
    url: str | None = None,
) -> Merged:
    """Write the merged per-SoC reports to out/<SOC>/ (and gate.json when a baseline is given). run_id:
    the merged run's (default: the parts', run_id_of); url: the docs base URL (writer.docs_url), else
    out/FINDINGS.md is the copy the pages link."""
    if out.exists() and any(out.iterdir()):
        raise MergeError(f"--out {out} is not empty: name a new folder, so no old report is mixed in")
    parts = read_parts(folders)
    check_versions(parts)
    check_shards(parts)
    run_id = run_id_of(parts, run_id)
    by_soc = merged_records(parts)
    records: dict[str, list[CheckRecord]] = {
        soc: [r for _, d in docs for r in records_of(d)] for soc, docs in by_soc.items()
    }
    every = [record for soc_records in records.values() for record in soc_records]
    try:
        verdict = _gate(baseline, every, allow_missing, _selection(parts)) if baseline is not None else None
    except MalformedReport as error:
        raise MalformedReport(f"--baseline: {error}") from None
    except BaselineError as error:
        raise MergeError(f"--baseline: {error}") from error
    targets = {soc: _inside(out, soc) for soc in by_soc}  # all checked before anything is written
    out.mkdir(parents=True, exist_ok=True)
    if url is None:
        copy_findings(out)
    for soc, documents in sorted(by_soc.items()):
        folder = targets[soc]
        for part, _ in documents:
            _copy_regular_files(part.folder / soc / REPRO_DIR, folder / REPRO_DIR)
        write_soc(
            records[soc],
            _environment(documents, run_id),
            folder,
            run_id,
            soc,
            _columns(parts, soc),
            verdict,
            _provenance(documents),
            url,
        )
    return Merged(every, verdict)
