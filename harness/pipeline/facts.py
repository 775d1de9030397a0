"""The typed boundary between the lowering child and the checks: the request it is given and the facts
it writes, as dataclasses with a schema version (JSON files in the case's artifact folder).

lower_job writes them, the host reads them back (lower.py, the artifact cache) and the checks read fields,
never string keys. A file of another schema version, or one that does not parse, is not facts
(FactsError): the caller lowers the case again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.files import write_atomically
from harness.vocabulary import FLOAT_DTYPE, Mode

SCHEMA_VERSION = 1


class FactsError(ValueError):
    """A request or facts file that cannot be read as this schema."""


def _checked(data: Any, path: Path | str) -> dict:
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        raise FactsError(f"{path}: not of schema_version {SCHEMA_VERSION}")
    return data


T = TypeVar("T")


def _read(path: Path, what: str, build: Callable[[dict], T]) -> T:
    """A facts file of this schema, built into its dataclass; any damage is one FactsError naming the file."""
    try:
        return build(_checked(json.loads(path.read_text()), path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise FactsError(f"{path}: unreadable {what} ({type(error).__name__}: {error})") from error


def quantizes(dtype: str, mode: Mode) -> bool:
    """Whether the suite quantizes a case before lowering it (the Meta llama flow quantizes by itself)."""
    return dtype != FLOAT_DTYPE and mode is not Mode.META_LLAMA


@dataclass(frozen=True)
class LoweringRequest:
    card: str  # the card's reference, module:name (the child imports the module to find it)
    dtype: str
    mode: Mode
    soc: str
    steps: int  # calibration length
    out_dir: str
    # What the case shares with its card's other cases (harness/pipeline/prepared.py): the card's export
    # facts, and the card x dtype's quantized program; "": this case's own, made in memory
    exported_dir: str = ""
    prepared_dir: str = ""
    share_mutable_buffers: bool = False  # the case's variant (multi-method cards): memory planning shares them
    profile_level: int = 0  # executorch's QNN profile_level (--profile-level): the profiled twin's lowering
    schema_version: int = SCHEMA_VERSION

    def write(self, path: Path) -> None:
        write_atomically(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> LoweringRequest:
        data = _checked(json.loads(path.read_text()), path)
        return cls(**{**data, "mode": Mode(data["mode"])})


@dataclass(frozen=True)
class ExportFacts:
    buffers_to_mutate: list[str]
    expected: list[str]
    methods: dict[str, list[str]] = field(default_factory=dict)  # multi-method: what each method writes


@dataclass(frozen=True)
class QuantizeFacts:
    annotated_buffer_inputs: list[dict[str, str]]  # {"op", "buffer"}
    qdq_around_buffers: list[dict[str, str]]  # {"buffer", "op"}
    folded_buffer_reads: dict[str, dict[str, int]]  # buffer -> {"before", "after"} reader counts


@dataclass(frozen=True)
class Delegate:
    name: str
    backend: str


@dataclass(frozen=True)
class PartitionFacts:
    delegates: list[Delegate]
    ops_outside: list[str]
    buffers_outside: list[str]
    methods: dict[str, PartitionFacts] = field(default_factory=dict)  # multi-method: each method's own

    @classmethod
    def of(cls, data: dict) -> PartitionFacts:
        methods = {str(method): cls.of(facts) for method, facts in data.get("methods", {}).items()}
        return cls(
            [Delegate(**d) for d in data["delegates"]],
            list(data["ops_outside"]),
            list(data["buffers_outside"]),
            methods,
        )


@dataclass(frozen=True)
class LoweringError:
    type: str
    message: str
    traceback: str = ""
    # The machine's doing (no space, no memory, a killed or crashed process), not the case's: never cached.
    environmental: bool = False


# Failures of the machine rather than of the case (ENOSPC, EMFILE, out of memory): reported, never cached.
ENVIRONMENTAL = (OSError, MemoryError)


def lowering_error(error: Exception, traceback_text: str) -> LoweringError:
    text = str(error).strip()
    return LoweringError(
        type(error).__name__,
        text.splitlines()[0] if text else "",
        traceback_text,
        environmental=isinstance(error, ENVIRONMENTAL),
    )


class QuantizationFailed(Exception):
    """A card and dtype's quantization failed, in this lowering (made) or in the one that made its shared
    entry; error is that failure as it was recorded, so every case of the card and dtype reports the same."""

    def __init__(self, error: LoweringError, made: bool) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error, self.made = error, made


@dataclass(frozen=True)
class ProgramFacts:
    """The model.pte that was written, so a cached one is checked before it is served."""

    sha256: str
    bytes: int


@dataclass
class LoweringFacts:
    """What the lowering child found; a field is None when the stage that makes it did not run."""

    timings_s: dict[str, float] = field(default_factory=dict)
    error: LoweringError | None = None
    export: ExportFacts | None = None
    quantize: QuantizeFacts | None = None
    partitions: PartitionFacts | None = None
    partitions_without_convert_bmm: PartitionFacts | None = None  # meta llama only: the pass switched off
    program: ProgramFacts | None = None
    without_convert_bmm_error: str | None = None  # meta llama only: why the flow did not lower with the pass off
    method_index: int = 0  # the runner's --method_index of forward (the Meta llama flow adds metadata methods)
    # Whether this lowering computed the export facts / the quantization itself (False: another case of its
    # card (and dtype) did, and this one read them from the shared entry); what a run's work counts sum.
    exported: bool = False
    quantized: bool = False
    # A multi-method program: its methods in the program's order (empty: a single-method program),
    # and, quantized, each method's encodings of each mutated buffer: method -> buffer -> {"read", "write"}
    # (harness/pipeline/stages.py buffer_encodings), what the cross_method_state check compares.
    methods: list[str] = field(default_factory=list)
    buffer_encodings: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    # Quantized multi-method: each method's CPU quantize/dequantize program run on the plan as each of eager's
    # STATE_MODELS (harness/pipeline/stages.py quantized_models): model -> [step][output] flat values, what
    # cross_method_state compares a quantized device with ({}: not recorded).
    modelled: dict[str, list[list[list[float]]]] = field(default_factory=dict)
    # The program's structural performance facts (harness/pipeline/structure.py structure_of: per method its
    # QNN graphs' op types, context binary and boundary bytes, the ops outside, the planned arenas); None:
    # not lowered, or by a suite that did not record them.
    structure: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def cacheable(self) -> bool:
        return self.error is None or not self.error.environmental

    def write(self, path: Path) -> None:
        """Last of a lowering's files, and atomically: a facts.json that exists is a finished lowering."""
        write_atomically(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> LoweringFacts:
        return _read(
            path,
            "facts",
            lambda data: cls(
                timings_s=dict(data["timings_s"]),
                error=LoweringError(**data["error"]) if data["error"] else None,
                export=ExportFacts(**data["export"]) if data["export"] else None,
                quantize=QuantizeFacts(**data["quantize"]) if data["quantize"] else None,
                partitions=PartitionFacts.of(data["partitions"]) if data["partitions"] else None,
                partitions_without_convert_bmm=(
                    PartitionFacts.of(data["partitions_without_convert_bmm"])
                    if data["partitions_without_convert_bmm"]
                    else None
                ),
                without_convert_bmm_error=data.get("without_convert_bmm_error"),
                method_index=int(data.get("method_index", 0)),
                exported=bool(data.get("exported", False)),
                quantized=bool(data.get("quantized", False)),
                methods=[str(method) for method in data.get("methods", [])],
                buffer_encodings=dict(data.get("buffer_encodings", {})),
                modelled=dict(data.get("modelled", {})),
                program=ProgramFacts(**data["program"]) if data["program"] else None,
                structure=data.get("structure") if isinstance(data.get("structure"), dict) else None,
            ),
        )

    @classmethod
    def read_cached(cls, path: Path) -> LoweringFacts:
        """The facts of a cache entry that may be served: FactsError also when they record a failure of the
        machine (no space, no memory, a killed lowering), which a run removes after writing it; a run killed
        in between leaves it, and the next one must lower the case again rather than serve that failure."""
        facts = cls.read(path)
        if not facts.cacheable:
            assert facts.error is not None
            raise FactsError(
                f"{path}: records a failure of the machine ({facts.error.type}), never served from the cache"
            )
        return facts

    @classmethod
    def crashed(cls, message: str) -> LoweringFacts:
        return cls(error=LoweringError("LoweringCrashed", message, environmental=True))


@dataclass(frozen=True)
class ExportedFacts:
    """A card's export facts, shared by its lowerings in every dtype, SoC and mode (the file of its entry)."""

    export: ExportFacts
    schema_version: int = SCHEMA_VERSION

    def write(self, path: Path) -> None:
        write_atomically(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> ExportedFacts:
        return _read(path, "export facts", lambda data: cls(export=ExportFacts(**data["export"])))


@dataclass(frozen=True)
class PreparedFacts:
    """A card x dtype's quantization, shared by its lowerings for every SoC and mode: its facts and each
    method's program (<method>.pt2, checked against its ProgramFacts before use; forward alone for a
    single-method card), or the error it failed with (error; neither of the others), so a quantizer defect is
    met once per card and dtype and reported alike by all its cases."""

    quantize: QuantizeFacts | None
    methods: dict[str, ProgramFacts] = field(default_factory=dict)
    error: LoweringError | None = None
    # A multi-method card's encodings of each mutated buffer (LoweringFacts.buffer_encodings).
    buffer_encodings: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    modelled: dict[str, list[list[list[float]]]] = field(default_factory=dict)  # LoweringFacts.modelled
    schema_version: int = SCHEMA_VERSION

    def write(self, path: Path) -> None:
        """Last of the entry's files, and atomically: a prepared.json that exists is a finished entry."""
        write_atomically(path, json.dumps(asdict(self), indent=1))

    @classmethod
    def read(cls, path: Path) -> PreparedFacts:
        def build(data: dict) -> PreparedFacts:
            facts = cls(
                quantize=QuantizeFacts(**data["quantize"]) if data["quantize"] else None,
                methods={str(name): ProgramFacts(**program) for name, program in data["methods"].items()},
                error=LoweringError(**data["error"]) if data.get("error") else None,
                buffer_encodings=dict(data.get("buffer_encodings", {})),
                modelled=dict(data.get("modelled", {})),
            )
            if facts.error is None and (facts.quantize is None or not facts.methods):
                raise KeyError("quantize or methods")
            return facts

        return _read(path, "prepared facts", build)
