"""Content keys for lowered artifacts, so a case is lowered once and reused across checks, workers
and runs until something that shapes the result changes; and for what lowerings share
(harness/pipeline/prepared.py): a card's export facts, and its quantized program in one dtype.

A lowering's key covers the card (its module's source and name), dtype, mode (which implies the lowering path),
SoC, the calibration length, the harness code that lowers, the QNN build, whether the device-config bridge is
on and the interposer's source, and the executorch / torch / torchao builds under test by content (a
wheel's RECORD, an editable checkout's commit and changes: harness/versions.py build_identity). Anything else (device, run id) cannot change a .pte and stays out of it.
A quantized program's key is the same less what only lowering reads: SoC, mode (but whether it is quantized),
the QNN build, the bridge and the interposer; a card's export facts' key is that less the dtype.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
from functools import cache
from pathlib import Path

from harness.pipeline.facts import quantizes
from harness.qnn.interposer import SOURCE as INTERPOSER_SOURCE
from harness.qnn.toolchain import Toolchain
from harness.versions import build_identity, package_version
from harness.vocabulary import Case

# Every pipeline module the lowering child runs (meta_llama.py: the Meta llama flow, which builds and lowers
# its own model; card.py: how the child finds the card).
LOWERING_SOURCES = ("stages.py", "lower_job.py", "eager.py", "facts.py", "prepared.py", "meta_llama.py", "card.py")
NUMERICS_SOURCE = Path(__file__).resolve().parent.parent / "numerics.py"  # the eager results' dependence


def key(case: Case, steps: int, toolchain: Toolchain) -> str:
    parts = [case.dtype, case.mode.value, case.soc, toolchain.probe.build_id,
             "bridge" if toolchain.probe.bridge_device_config else "no bridge", INTERPOSER_SOURCE.read_text()]
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
    card_module = sys.modules.get(case.card.module)
    card_source = inspect.getsource(card_module) if card_module else case.card.module
    parts = [case.card.name, card_source, str(steps), *specific,
             *(f"{name} {package_version(name)} {build_identity(name)}" for name in ("executorch", "torch", "torchao")),
             *_lowering_sources()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


@cache
def _lowering_sources() -> tuple[str, ...]:
    """Read once per process, as the modules themselves are imported once: a worker asks for three keys a case."""
    here = Path(__file__).parent
    return tuple((here / name).read_text() for name in LOWERING_SOURCES)
