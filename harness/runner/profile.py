"""The QNN profile of a run (--profile-level): the runner's ETDump read with executorch's devtools
Inspector, as per-step events for the case's timing.

A program lowered with a QNN profile_level makes the QNN backend log its profile into the runner's event tracer
(suite_runner.cpp --etdump_path): per execute, one value per event, e.g. "aten_add_tensor:OpId_20 (cycles)",
"Accelerator (execute) time (us)", "Number of HVX threads used (count)". The unit is the name's last
parenthesis, and the value is the backend's as logged: the Inspector is asked not to convert it (its
default reads every value as nanoseconds), so a cycle count stays a cycle count. Only the backend's
(delegated) events are kept; the runtime's own (Method::execute, DELEGATE_CALL) are what the step times
already say. Each execute of a one-method plan is one run of the ETDump's "Execute" block, in plan order,
so run N is step N. A plan of several methods gives a block per method, which an ETDump without its
ETRecord does not name: those are refused in one line rather than guessed.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from harness.files import read_regular
from harness.runner.etdump_size import MalformedEtdump, expanded_bytes

# --profile-level's words, as generate_qnn_executorch_compiler_spec's profile_level. "basic" (1) is not one:
# executorch 1.5's compiler spec warns "Profile Level 1, kProfileBasic, is not supported" and lowers without
# any profile (measured: the ETDump then holds no backend event), so such a run would have nothing to show.
PROFILE_LEVELS = {"off": 0, "detailed": 2}
PROFILE_NAMES = {level: name for name, level in PROFILE_LEVELS.items()}
MAX_EVENTS = 400  # entries kept in a case's timing.profile (report.json stays small); the rest are counted
NAME_MAX, UNIT_MAX = 200, 20  # characters (report.schema.json): an event name is the backend's text
UNIT = re.compile(r"^(?P<name>.*\S)\s*\((?P<unit>[^()]+)\)$")
# Bounds of what one ETDump may cost to read: its bytes, and the JSON executorch's parser makes of them (as
# etdump_size.py counts it, about 2.5 times flatc's). Measured: 89,600 events (64 steps of 1,400) are a
# 7.5 MB ETDump counted at 64 MB, parsed in 22 s with 112 MB more memory; a 121 KB hostile one counts 1.9 GB.
ETDUMP_MAX_BYTES = 8 << 20
EXPANDED_MAX_BYTES = 64 << 20


class ProfileError(ValueError):
    """An ETDump that cannot be read as a per-step profile; one line naming why."""


@dataclass(frozen=True)
class ProfileEvent:
    step: int
    event: str  # the backend's event name, less its unit
    value: float
    unit: str  # "cycles", "us", "count", ... ("" when the name gives none)

    def entry(self) -> dict:
        """As report.json's timing.profile.events holds it."""
        return {"step": self.step, "event": self.event, "value": self.value, "unit": self.unit}


def read_etdump(path: Path, steps: int) -> list[ProfileEvent]:
    """The backend's profile events of each step, step by step, in the order the backend logged them; an
    ETDump its parser would expand past the bounds is refused first (harness/runner/etdump_size.py)."""
    data = bounded_etdump(path)
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale

    try:
        with warnings.catch_warnings():  # "Output Buffer not found": no debug buffer was asked for
            warnings.simplefilter("ignore")
            inspector = Inspector(etdump_data=data, source_time_scale=TimeScale.NS, target_time_scale=TimeScale.NS)
    except Exception as error:  # noqa: BLE001  the Inspector raises what its parser meets
        raise ProfileError(
            f"{path.name}: not an ETDump the devtools Inspector reads ({type(error).__name__})"
        ) from None
    blocks = [block for block in inspector.event_blocks if any(e.is_delegated_op for e in block.events)]
    if not blocks:
        raise ProfileError(
            f"{path.name}: no backend profile events (was the program lowered with a QNN profile_level?)"
        )
    if len(blocks) > 1:
        raise ProfileError(
            f"{path.name}: {len(blocks)} profiled execute blocks (a plan of several methods): without the "
            "program's ETRecord they cannot be told apart, so no per-step profile"
        )
    events = []
    for event in blocks[0].events:
        if not event.is_delegated_op or event.perf_data is None:
            continue
        match = UNIT.match(event.name)
        name, unit = (match.group("name"), match.group("unit")) if match else (event.name, "")
        raw = list(event.perf_data.raw)
        if len(raw) != steps:
            raise ProfileError(f"{path.name}: event {event.name!r} has {len(raw)} value(s) for {steps} step(s)")
        events += [
            ProfileEvent(step, name[:NAME_MAX], float(value), unit[:UNIT_MAX])
            for step, value in enumerate(raw)
            if math.isfinite(value) and value >= 0  # nothing a report could not hold as a time or a count
        ]
    return sorted(events, key=lambda e: e.step)


def bounded_etdump(path: Path) -> bytes:
    """The ETDump's bytes (the ones then parsed: read once), if executorch's parser would make of them at most
    EXPANDED_MAX_BYTES of JSON; else ProfileError, one line saying why, before anything is expanded."""
    try:
        data = read_regular(path, ETDUMP_MAX_BYTES)
    except OSError as error:
        raise ProfileError(f"{path.name}: cannot be opened ({error.strerror})") from None
    except ValueError as error:
        raise ProfileError(f"{path.name}: {error}") from None
    try:
        expanded = expanded_bytes(data, EXPANDED_MAX_BYTES)
    except MalformedEtdump as error:
        raise ProfileError(f"{path.name}: not an ETDump ({error})") from None
    if expanded > EXPANDED_MAX_BYTES:
        raise ProfileError(
            f"{path.name}: its {len(data)} bytes would expand to more than {EXPANDED_MAX_BYTES >> 20} MB in "
            f"executorch's parser (a table pointed at over and over): refused unparsed"
        )
    return data


def profile_of(events: list[ProfileEvent], level: str) -> dict:
    """report.json's timing.profile: the events, at most MAX_EVENTS of them (the earliest steps first)."""
    return {
        "level": level,
        "events": [event.entry() for event in events[:MAX_EVENTS]],
        "omitted": max(0, len(events) - MAX_EVENTS),
    }
