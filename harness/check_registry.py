"""The check registry: every check declared once, by a decorator on its function.

A declaration says everything the rest of the suite needs to know about a check: its name (its suite test
is `test_<name>`, its record and report column `<name>`), its short column label, whether it needs a device
run, the failure signatures it may raise (what known-failure entries may name), and which case matrix it
runs over. run_check, the parametrization, the known-failures manifest and the reporter read it from here,
and a suite file is one line:

    test_state = suite_test("state")

Torch-free on purpose: the manifest and the reporter import it without importing the checks' numerics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.vocabulary import Verdict

# Any check can fail these ways before its own logic runs: no program, or no device result.
COMMON_SIGNATURES = ("lowering_failed", "not_run")


class CheckFailure(AssertionError):
    """A check's verdict: one line, a signature naming the kind of failure (what the known-failures
    manifest matches), and evidence for the report."""

    def __init__(self, message: str, evidence: dict | None = None, signature: str = "unclassified") -> None:
        super().__init__(message)
        self.evidence = evidence or {}
        self.signature = signature


class NotApplicable(Exception):
    """The check has nothing to check for this case (it is skipped with this reason)."""


class NotMeasured(Exception):
    """The check applies, but this device cannot measure it (e.g. no execute trace on a phone without the
    interposer): its own verdict, `not_measured`, counted and shown as such, never a plain skip."""


class InfrastructureError(Exception):
    """The device or the lab failed, not executorch (a device quarantined by its health check, a device
    lost): the verdict `infra_error`, shown apart from conformance failures and listed apart by the gate."""


# Verdicts whose report the report hook (harness/verdicts.py settle) words as one line of its own, so pytest's
# formatting of their tracebacks would be thrown away. It is costly: pytest parses the source file of every
# traceback entry (measured: a fifth of the workers' CPU in a warm default run, where 514 checks fail as known).
WORDED_BY_THE_SUITE = (CheckFailure, NotMeasured, InfrastructureError)


def raised_verdict(error: BaseException | None) -> Verdict:
    """What a check's ending says by itself, before any known-failures entry: passed (it returned),
    skipped (NotApplicable), not_measured, infra_error, else failed. The one mapping of a check's exception
    to a verdict: harness/verdicts.py decide applies the manifest on top of it, and a repro bundle's repro.py
    (which carries this module, not pytest) judges with it alone."""
    if error is None:
        return Verdict.PASSED
    if isinstance(error, NotApplicable):
        return Verdict.SKIPPED
    if isinstance(error, NotMeasured):
        return Verdict.NOT_MEASURED
    if isinstance(error, InfrastructureError):
        return Verdict.INFRA_ERROR
    return Verdict.FAILED


def worded_by_the_suite(excinfo: Any) -> bool:
    """pytest's __tracebackhide__ for the frames between pytest and a check (it calls this with the
    ExceptionInfo): hidden for the verdicts above, which run_check raises without the check's own frames;
    any other exception, a harness bug among them, keeps its full traceback."""
    return excinfo.errisinstance(WORDED_BY_THE_SUITE)


@dataclass(frozen=True)
class CheckSpec:
    name: str
    function: Callable[[Any], dict]  # CaseOutcome -> evidence, or raises CheckFailure / NotApplicable
    short: str  # report column label
    needs_device: bool
    signatures: tuple[str, ...]  # the failure kinds it may raise, besides COMMON_SIGNATURES
    matrix: Callable[..., list] | None = None  # (cards, dtypes, socs) -> cases; None: the standard matrix
    # The runner the check compares the case's run with: its cases are run through it too, before any check
    # judges them (outcome.reference_run); None: no second run.
    reference_runner: str | None = None

    @property
    def test_name(self) -> str:
        return f"test_{self.name}"

    def declares(self, signature: str) -> bool:
        return signature in self.signatures or signature in COMMON_SIGNATURES


_CHECKS: dict[str, CheckSpec] = {}


def check(
    name: str,
    *,
    short: str,
    needs_device: bool = False,
    signatures: tuple[str, ...] = (),
    matrix: Callable[..., list] | None = None,
    reference_runner: str | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated function as the check `name` (the order of registration is the report's
    column order). reference_runner: the device runner the check compares a case's run with; the case store
    runs each of the check's cases through it too, before judging (outcome.reference_run)."""

    def register(function: Callable) -> Callable:
        known = _CHECKS.get(name)
        if known is not None and (known.function.__module__, known.function.__qualname__) != (
            function.__module__,
            function.__qualname__,
        ):
            raise ValueError(
                f"two checks are named {name!r} ({known.function.__module__}.{known.function.__qualname__} "
                f"and {function.__module__}.{function.__qualname__}): rename one"
            )
        _CHECKS[name] = CheckSpec(name, function, short, needs_device, tuple(signatures), matrix, reference_runner)
        return function

    return register


def get(name: str) -> CheckSpec:
    try:
        return _CHECKS[name]
    except KeyError:
        raise ValueError(
            f"no check named {name!r}: registered are {', '.join(_CHECKS) or 'none'} "
            f"(declare it with @check({name!r}, ...) in a module imported before the suite)"
        ) from None


def specs() -> list[CheckSpec]:
    return list(_CHECKS.values())


def signatures() -> tuple[str, ...]:
    """Every signature a known-failure entry may name."""
    declared = [s for spec in _CHECKS.values() for s in spec.signatures]
    return tuple(dict.fromkeys([*COMMON_SIGNATURES, *declared]))


def columns() -> list[dict[str, str]]:
    """The report's check columns, in registration order (carried in report.json, so report/ needs no registry)."""
    return [{"name": spec.name, "short": spec.short} for spec in _CHECKS.values()]


def suite_test(name: str) -> Callable:
    """The pytest test function of check `name`: one per case of its matrix (see harness/parametrize.py)."""
    spec = get(name)

    def test(case, run_check) -> None:
        __tracebackhide__ = worded_by_the_suite
        run_check(spec, case)

    test.__name__ = test.__qualname__ = spec.test_name
    test.__doc__ = spec.function.__doc__
    test.check_spec = spec  # type: ignore[attr-defined]
    return test
