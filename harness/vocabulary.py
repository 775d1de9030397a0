"""The nouns of the case matrix, in one leaf module: dtypes, buffer modes, the model card contract, a
case, verdicts.

pipeline/, the checks, the plugin and report/ (which stays free of torch) all spell these the same way
because they import them from here. A mode has one spelling: the `Mode` value, which is also what test
ids, records and reports show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for the card contract's annotations: importing this module never imports torch
    import torch

# The suite's own card modules, always registered (a run adds the user's with --models); named once here for the
# plugin and for `python -m harness repro`, which must not import a card module a run folder names.
DEFAULT_CARD_MODULES = (
    "fixtures.zoo",
    "fixtures.llama",
    "fixtures.families",
    "fixtures.multi_method",
    "fixtures.online_prepare",
    "fixtures.shared_buffer",
    "fixtures.drivers",
)
# 16a4w_block: 16-bit activations, 4-bit weights with a scale per block of input channels (QNN's LPBQ, what
# upstream's static llama flow ships; QuantDtype.use_16a4w_block). It acts on linear weights only, so a card
# opts in (CARD_DTYPES, the default, leaves it out), and it needs HTP V69 or newer (MIN_HTP_ARCH).
BLOCK_DTYPE = "16a4w_block"
DTYPES = ("fp16", "16a8w", "8a8w", "16a4w", BLOCK_DTYPE)
CARD_DTYPES = tuple(dtype for dtype in DTYPES if dtype != BLOCK_DTYPE)
FLOAT_DTYPE = "fp16"
# The QnnQuantizer QuantDtype of each quantized dtype (pipeline/stages.py quantizes with it; issue.md names it)
QUANT_DTYPES = {"16a8w": "use_16a8w", "8a8w": "use_8a8w", "16a4w": "use_16a4w", BLOCK_DTYPE: "use_16a4w_block"}
# The oldest HTP arch a dtype runs on (executorch's htp_rules.validate_lpbq_support: V69); the matrix skips the
# dtype's cases on an older SoC (pipeline/cases.py). A dtype not named runs on every SoC.
MIN_HTP_ARCH = {BLOCK_DTYPE: 69}


@dataclass(frozen=True)
class VerdictMeaning:
    """What a verdict means to every reader of it: the renderers, the summary lines, the gate, the bundles.

    The one table of these meanings is Verdict's members below; a consumer asks a member (`verdict.fails_run`),
    never keeps a list of verdict strings of its own. A flag left out is False."""

    label: str  # its cell in a table (report.html, the matrix's side by side)
    spoken: str  # in a sentence's counts: "3 not measured"
    junit: str = ""  # JUnit's element for it ("" for none: a pass)
    passes: bool = False  # the check's own function passed (an xpassed one did: its manifest entry is wrong)
    fails: bool = False  # the check's own function failed, expected or not
    fails_run: bool = False  # a conformance failure of the run: a person must look (JUnit's <failure>)
    measured: bool = False  # the check was verified on its case (the gate names one measured before, not now)
    bundled: bool = False  # a reproduction bundle is written for it; after a pass the gate calls it a regression
    apart: bool = False  # not about executorch (the device or the lab): counted and listed apart, never a finding
    always_counted: bool = False  # a run's counts name it even at zero


class Verdict(StrEnum):
    """A check's final verdict (harness/verdicts.py decides it); the value is the one spelling in records and
    reports, and each member carries its meaning (VerdictMeaning's fields: `Verdict.FAILED.label`)."""

    label: str
    spoken: str
    junit: str
    passes: bool
    fails: bool
    fails_run: bool
    measured: bool
    bundled: bool
    apart: bool
    always_counted: bool

    def __new__(cls, value: str, meaning: VerdictMeaning) -> Verdict:
        member = str.__new__(cls, value)
        member._value_ = value
        for name, said in vars(meaning).items():
            setattr(member, name, said)
        return member

    PASSED = "passed", VerdictMeaning("pass", "passed", passes=True, measured=True, always_counted=True)
    FAILED = (
        "failed",
        VerdictMeaning(
            "FAIL", "failed", "failure", fails=True, fails_run=True, measured=True, bundled=True, always_counted=True
        ),
    )
    # An expected failure did not happen: a strict failure of the run
    XPASSED = (
        "xpassed",
        VerdictMeaning("XPASS", "xpassed", "failure", passes=True, fails_run=True, measured=True, bundled=True),
    )
    # Failed as a known-failures entry expects
    XFAILED = "xfailed", VerdictMeaning("xfail", "xfailed", "skipped", fails=True, measured=True, bundled=True)
    # The check does not apply to the case
    SKIPPED = "skipped", VerdictMeaning("skip", "skipped", "skipped")
    # The device cannot measure the check
    NOT_MEASURED = "not_measured", VerdictMeaning("n/m", "not measured", "skipped", apart=True)
    # The device or the lab failed, not executorch
    INFRA_ERROR = "infra_error", VerdictMeaning("INFRA", "infrastructure errors", "error", apart=True)

    @classmethod
    def of(cls, value: object) -> Verdict | None:
        """The verdict a string from a report names; None for one this suite does not know (a report of another
        release's suite, or "absent" in a comparison)."""
        try:
            return cls(value)
        except ValueError:
            return None


VERDICTS = tuple(verdict.value for verdict in Verdict)  # report order


class Mode(StrEnum):
    """How a case's mutable buffers are lowered."""

    DELEGATE = "delegate_mutbuf"  # skip_mutable_buffer=False: the buffers live inside the QNN delegate
    SKIP = "skip_mutbuf"  # skip_mutable_buffer=True: the buffers stay outside, copied by the runtime
    META_LLAMA = "meta_llama"  # executorch's Meta llama export path (it hard-wires skip_mutable_buffer=True)

    @property
    def skip_mutable_buffer(self) -> bool:
        return self is not Mode.DELEGATE


MATRIX_MODES = (Mode.DELEGATE, Mode.SKIP)
SHARED_SUFFIX = "shared"  # in a case id after the mode: lowered with share_mutable_buffers  # what every card is run in
MODE_ORDER = tuple(mode.value for mode in Mode)  # report order


# How a driven card resets between two conversations (Drive.reset): positions rewound to 0 (the masks hide what
# the first conversation left), or the program loaded again mid-plan (a fresh Module); any other value names a
# method of the card that resets its buffers.
REWIND, RELOAD = "rewind", "reload"
DRIVERS = ("single", "chunked", "prefill_decode", "second_prefill", "reset", "adapter_switch", "long")


@dataclass(frozen=True)
class DriveChunk:
    """What one driven step consumes: its method, the stream positions it covers (empty for a reset method's
    step), the conversation it belongs to (0, then 1 after a reset or for a second prefill's turn) and the
    adapter whose weights it is fed (0 unless the card declares adapters)."""

    method: str
    positions: tuple[int, ...]
    turn: int = 0
    adapter: int = 0


@dataclass(frozen=True)
class Drive:
    """How a user drives a stateful card: the token/position stream it consumes and the width each method
    takes (harness/pipeline/drivers.py drives it several ways). Every output of a driven method has its chunk's
    positions on axis 1, so outputs of different widths compare position by position."""

    feed: Callable[[DriveChunk], tuple]  # a step's inputs, deterministic in the chunk
    widths: tuple[tuple[str, int], ...]  # (method, positions per step): a width-1 decode method is required
    reset: str = REWIND  # REWIND, RELOAD or the name of the card's reset method
    adapters: int = 0  # adapter weight sets the feed can give (2 or more: the adapter_switch driver)
    prompt: int = 8  # positions of the first prefill
    decode: int = 4  # width-1 steps after a prefill
    drivers: tuple[str, ...] = DRIVERS  # the drivers the card runs under (those its declaration allows)
    long_dtypes: tuple[str, ...] = (FLOAT_DTYPE,)  # the long driver's default subset of the card's dtypes
    dtypes: tuple[str, ...] | None = None  # the card's dtypes the drivers run in (None: all of them)
    # A method of the card that returns its buffers' contents and changes no state (its inputs from feed, for a
    # chunk without positions): each driver calls it at the end of every conversation, on the device and in
    # eager, so the buffers' final contents are compared too. "": the card exposes no read-back.
    read_back: str = ""

    def width(self, method: str) -> int:
        return dict(self.widths)[method]


@dataclass(frozen=True)
class ModelCard:
    """How to build a stateful module, which inputs to feed it step by step, which buffers it mutates and
    what a correct lowering looks like. Users add models by writing cards in their own module and passing
    `--models MODULE` (registered with harness.pipeline.card.register)."""

    name: str
    build: Callable[[], torch.nn.Module]
    steps: Callable[[int], list[tuple[torch.Tensor, ...]]]  # deterministic inputs for n steps
    mutated_buffers: tuple[str, ...]
    expected_partitions: int = 1
    tags: frozenset[str] = field(default_factory=frozenset)
    module: str = ""  # where the card is registered, so a child process can find it again
    dtypes: tuple[str, ...] = CARD_DTYPES  # where the card is meaningful (the matrix skips the others)
    # A multi-method card: build() returns a module with these methods (no forward needed), and
    # plan(n) names the method each of n steps runs; steps(n) gives that method's inputs. The methods share
    # the module's buffers: eager runs the plan on ONE module. Empty: a single-method card (forward).
    methods: tuple[str, ...] = ()
    plan: Callable[[int], list[str]] | None = None
    # Lowered with generate_qnn_executorch_compiler_spec(online_prepare=True): the delegate holds a
    # QNN IR (DLC) program that the device composes into a graph when the program loads, instead of a context
    # binary prepared at lowering. Off: the offline-prepared program users ship by default.
    online_prepare: bool = False
    # Lowered with generate_qnn_executorch_compiler_spec(shared_buffer=True) and its graph inputs and outputs left
    # unplanned: the application supplies their memory, which the QNN backend registers with QNN
    # instead of copying where it is QNN's shared memory (rpcmem, a phone's), as upstream's export_utils.py and
    # runner's --shared_buffer do. Off: executorch plans the I/O and the backend copies it.
    shared_buffer: bool = False
    # How users drive its state (chunked prefill, turns, resets, adapters, long runs): the driver matrix's
    # cards (harness/pipeline/drivers.py). None: the card runs its plan only.
    drive: Drive | None = None

    @property
    def reference(self) -> str:
        return f"{self.module}:{self.name}"

    @property
    def multi_method(self) -> bool:
        return bool(self.methods)

    @property
    def method_names(self) -> tuple[str, ...]:
        """The methods its program has: a single-method card is a plan of one method, forward."""
        return self.methods or ("forward",)

    def step_methods(self, n: int) -> list[str]:
        """The method each of n steps runs (forward for a single-method card); ValueError for a plan that
        names a method the card does not declare, or has another length."""
        if not self.methods:
            return ["forward"] * n
        if self.plan is None:
            raise ValueError(f"model card {self.name!r} declares methods but no plan: give plan=")
        methods = list(self.plan(n))
        unknown = sorted(set(methods) - set(self.methods))
        if unknown or len(methods) != n:
            raise ValueError(
                f"model card {self.name!r}: its plan for {n} steps names {len(methods)} step(s)"
                + (f" and undeclared method(s) {unknown}" if unknown else "")
                + f": a plan names one of {list(self.methods)} per step"
            )
        return methods


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: card x dtype x mode x SoC."""

    card: ModelCard
    dtype: str
    mode: Mode
    soc: str
    # Lowered with share_mutable_buffers (executorch's MemoryPlanningPass: one allocation per mutable buffer
    # for every method): a multi-method card's matrix has it on and off; single-method cases never set it.
    share_mutable_buffers: bool = False
    # Why the matrix lists the case but never runs it (its dtype needs a newer HTP than its SoC has: the rule is
    # pipeline/cases.py's); empty: it runs. The id leaves it out: a case is the same cell either way.
    skip_reason: str = field(default="", compare=False)
    # How the case's state is driven (one of DRIVERS, harness/pipeline/drivers.py): "" is the card's own plan.
    # A driver changes the run, never the lowering: every driver of a card/dtype/mode/SoC shares `lowering`'s.
    driver: str = ""

    @property
    def skip_mutable_buffer(self) -> bool:
        return self.mode.skip_mutable_buffer

    @property
    def lowering(self) -> Case:
        """The case whose lowering this one runs (itself, less its driver)."""
        return replace(self, driver="") if self.driver else self

    @property
    def id(self) -> str:
        shared = f"-{SHARED_SUFFIX}" if self.share_mutable_buffers else ""
        driver = f"-{self.driver}" if self.driver else ""
        return f"{self.card.name}-{self.dtype}-{self.mode.value}{shared}-{self.soc}{driver}"
