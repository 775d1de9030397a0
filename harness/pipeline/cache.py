"""Content keys for lowered artifacts, so a case is lowered once and reused across checks, workers
and runs until something that shapes the result changes; and for what lowerings share
(harness/pipeline/prepared.py): a card's export facts, and its quantized program in one dtype.

A lowering's key covers the card (its name, its module's source and the sources of the modules that one
imports from the user's tree, directly or not: a helper module edited changes the key), dtype, mode (which implies the lowering path),
SoC, the calibration length, the harness code that lowers, the QNN build, whether the device-config bridge is
on and the interposer's source, and the executorch / torch / torchao builds under test by content (a
wheel's RECORD, an editable checkout's commit and changes: harness/versions.py build_identity). Anything else (device, run id) cannot change a .pte and stays out of it.
A quantized program's key is the same less what only lowering reads: SoC, mode (but whether it is quantized),
the QNN build, the bridge and the interposer; a card's export facts' key is that less the dtype.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
import sysconfig
from functools import cache
from pathlib import Path

from harness.pipeline.facts import quantizes
from harness.qnn.interposer import SOURCE as INTERPOSER_SOURCE
from harness.qnn.toolchain import Toolchain
from harness.versions import build_identity, package_version
from harness.vocabulary import Case

# Every pipeline module the lowering child runs (meta_llama.py: the Meta llama flow, which builds and lowers
# its own model; card.py: how the child finds the card).
LOWERING_SOURCES = (
    "stages.py",
    "lower_job.py",
    "eager.py",
    "facts.py",
    "prepared.py",
    "meta_llama.py",
    "card.py",
    "structure.py",  # what the lowering records of the program's structure (its facts.json)
)
NUMERICS_SOURCE = Path(__file__).resolve().parent.parent / "numerics.py"  # the eager results' dependence


def key(case: Case, steps: int, toolchain: Toolchain) -> str:
    parts = [
        case.dtype,
        case.mode.value,
        case.soc,
        toolchain.probe.build_id,
        "bridge" if toolchain.probe.bridge_device_config else "no bridge",
        INTERPOSER_SOURCE.read_text(),
    ]
    if case.card.online_prepare:  # never served for the card's offline-prepared program, nor it for this one
        parts.append("online_prepare")
    if case.card.shared_buffer:  # another compiler spec and memory plan than the card's plain program
        parts.append("shared_buffer")
    return f"{case.id}-{_digest(case, steps, parts)}"


def exported_key(case: Case, steps: int) -> str:
    """One key for every dtype, SoC and mode of the case's card: its export facts."""
    return f"{case.card.name}-export-{_digest(case, steps, ['export'])}"


def eager_key(case: Case, steps: int) -> str:
    """One key for every dtype, SoC and mode of the case's card: its eager results (harness/pipeline/references.py),
    which numerics.py's initial-value dependence also shapes."""
    return f"{case.card.name}-eager-{_digest(case, steps, ['eager', NUMERICS_SOURCE.read_text()])}"


def prepared_key(case: Case, steps: int) -> str | None:
    """One key for every SoC and mode of the case's card and dtype: its quantized program (None: the case is
    not quantized by the suite)."""
    if not quantizes(case.dtype, case.mode):
        return None
    return f"{case.card.name}-{case.dtype}-{_digest(case, steps, [case.dtype, 'quantized'])}"


def _digest(case: Case, steps: int, specific: list[str]) -> str:
    parts = [
        case.card.name,
        *_card_sources(case.card.module),
        str(steps),
        *specific,
        *(f"{name} {package_version(name)} {build_identity(name)}" for name in ("executorch", "torch", "torchao")),
        *_lowering_sources(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


@cache
def _lowering_sources() -> tuple[str, ...]:
    """Read once per process, as the modules themselves are imported once: a worker asks for three keys a case."""
    here = Path(__file__).parent
    return tuple((here / name).read_text() for name in LOWERING_SOURCES)


HARNESS_DIR = Path(__file__).resolve().parent.parent  # what of it shapes a lowering is in LOWERING_SOURCES
INSTALLED = ("site-packages", "dist-packages")


@cache
def _card_sources(module_name: str) -> tuple[str, ...]:
    """The card module's source and those of the modules it imports from the user's tree (the folder on
    sys.path that holds its top-level package), directly or through each other; not the standard library,
    installed packages (their builds are keyed by version) or the harness. Read once per process, as the
    modules are imported once; a module imported only inside a function counts too (the import is read
    from the source, not from what has run)."""
    module = sys.modules.get(module_name)
    if module is None or not getattr(module, "__file__", None):
        return (module_name,)
    top = sys.modules.get(module_name.partition(".")[0], module)
    top_file = Path(top.__file__).resolve()
    root = top_file.parent.parent if top_file.name == "__init__.py" else top_file.parent
    sources, seen, pending = [], set(), [module_name]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _source_file(name)
        if path is None or (name != module_name and not _in_tree(path, root)):
            continue
        text = path.read_text(errors="replace")
        sources.append(f"{name}\n{text}")
        pending += _imports(text, name, path.name == "__init__.py")
    own, helpers = sources[0].partition("\n")[2], sorted(sources[1:])
    return (own, *helpers)  # a card without helpers keeps the key it had when only its own file was keyed


def _source_file(name: str) -> Path | None:
    """The .py file of a module, without importing anything new (None: not a Python source module)."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
    elif "." in name and name.rpartition(".")[0] not in sys.modules:
        return None  # finding it would import its package
    else:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and origin.endswith(".py") else None


def _in_tree(path: Path, root: Path) -> bool:
    standard = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return (
        path.is_relative_to(root)
        and not path.is_relative_to(HARNESS_DIR)
        and not path.is_relative_to(standard)
        and not any(part in INSTALLED for part in path.parts)
    )


def _imports(source: str, name: str, is_package: bool) -> list[str]:
    """The modules a source imports (each candidate: `from a import b` may import module a.b or name b of a)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found += [".".join(parts[:end]) for end in range(1, len(parts) + 1)]
        elif isinstance(node, ast.ImportFrom):
            package = name if is_package else name.rpartition(".")[0]
            if node.level > 1:
                package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            base = node.module if node.level == 0 else ".".join(p for p in (package, node.module) if p)
            if base:
                found += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return found
