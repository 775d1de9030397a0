"""Each case's shared outcome: lowered once per run, run once on a device, read by every check.

Checks never lower or run anything themselves; they ask the CaseStore, which memoizes per worker
and, for lowering, across workers (a file lock per case, results on disk in the run's work dir). Where a
lowering is kept is harness/pipeline/lowering_cache.py's; reconnecting a dropped device is the device
layer's (harness/device/retry.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from harness.device import kinds
from harness.device.execute import DeviceRunRequest
from harness.device.pool import DevicePool
from harness.device.retry import Attempt, run_with_reconnects
from harness.outcome import CaseOutcome, OtherRun
from harness.pipeline import drivers, eager, health_card, references
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.pipeline.lowering_cache import lowering_directory, served
from harness.qnn.toolchain import Toolchain
from harness.runner.profile import PROFILE_NAMES, ProfileError, profile_of, read_etdump
from harness.user_state import claim_entry
from harness.vocabulary import Case, Mode


@dataclass(frozen=True)
class CaseRuns:
    """Every device run a case needs, decided once from its outcome and the run's options, all made before
    any check judges the case: the run, its --perf-repeats, its --profile-level twin, and the run through
    the reference runner a check compares runners with (runner_parity)."""

    run: DeviceRunRequest
    repeats: int = 0  # more runs of the plan, each in a fresh runner process (only their step times are kept)
    profile_level: int = 0  # the QNN profile_level of the profiled twin (0: none)
    reference_runner: str | None = None  # the runner the case is run through again (None: no such run)


# Steps of a repeat timed beside the reference: on the HTP simulator a graph's first three executes take
# 10-60 ms and later ones 0.2-0.4 ms, so a 4-step plan's steady state is one execute; cycled to 16, thirteen.
TIMED_STEPS = 16


def timed(request: DeviceRunRequest, reference: Path) -> DeviceRunRequest:
    """A repeat's request: the plan cycled to at least TIMED_STEPS steps (the same inputs again, in order: only
    the times are kept), run beside the reference program."""
    cycles = -(-TIMED_STEPS // len(request.steps))
    return replace(
        request,
        steps=request.steps * cycles,
        methods=request.methods * cycles if request.methods else None,
        output_bytes=request.output_bytes * cycles if request.output_bytes else None,
        reference=reference,
    )


class CaseStore:
    def __init__(
        self,
        toolchain: Toolchain,
        pool: DevicePool | None,
        work_dir: Path,
        worker: str,
        steps_for,
        runner_timeout_s: float,
        cache_dir: Path | None,
        lowering_server: Path | None,
        perf_repeats: int = 1,
        profile_level: int = 0,
        reference_runner: Callable[[Case], str | None] = lambda case: None,
        horizon: int = drivers.LONG_STEPS,
    ) -> None:
        """cache_dir: where lowered artifacts are kept by content key across runs (None: this run only);
        lowering_server: the run's lowering server socket (None: each case lowered in a fresh Python);
        perf_repeats: runs of each case's plan, each in a fresh runner process (--perf-repeats);
        profile_level: executorch's QNN profile_level of the profiled run (--profile-level; 0: none);
        reference_runner: the runner a case's checks compare its run with (the collected checks' choice);
        horizon: the long driver's steps (--horizon)."""
        self._horizon = horizon
        self._reference_runner = reference_runner
        self._perf_repeats = perf_repeats
        self._profile_level = profile_level
        self._toolchain = toolchain
        self._lowering_server = lowering_server
        self._cache_dir = cache_dir
        self._pool = pool
        self._work_dir = work_dir
        self._worker = worker
        self._steps_for = steps_for
        self._runner_timeout_s = runner_timeout_s
        self._outcomes: dict[str, CaseOutcome] = {}
        self._ahead: dict[str, Future[LoweredArtifact]] = {}  # lowerings started by lower_ahead, by case id
        self._closed = threading.Event()

    def lower_ahead(self, order: list[Case]) -> None:
        """The cases this process will ask for, in the order it will: a thread lowers them one after the other,
        so that the next case is lowered while this one runs on its device and its checks run (the lowering
        child works on the host's CPU, a device run mostly waits for the device). One lowering at a time, as
        without it: a serial run stays serial in what it asks of the host. Under xdist a worker does not know
        its next cases; there each case is lowered when first asked for."""
        queue = []
        for case in order:
            if case.id not in self._ahead and case.id not in self._outcomes:
                self._ahead[case.id] = future = Future()
                queue.append((case, future))
        threading.Thread(target=self._lower_in_order, args=(queue,), name="qnnsuite-lower-ahead", daemon=True).start()

    def _lower_in_order(self, queue: list[tuple[Case, Future[LoweredArtifact]]]) -> None:
        for case, future in queue:
            # Once the run ends (close(), or the main thread gone), the rest is left: nothing outlives the run.
            if self._closed.is_set() or not threading.main_thread().is_alive():
                future.cancel()
                continue
            future.set_running_or_notify_cancel()
            try:
                future.set_result(self._lower_once(case, len(self._steps(case))))
            except BaseException as error:  # raised again to the check that asks for the case, as without this
                future.set_exception(error)

    def close(self) -> None:
        """The run is over: no lowering ahead starts from now on."""
        self._closed.set()

    def _steps(self, case: Case) -> list[tuple]:
        """The card's own steps: its lowering's, and a case's inputs unless a driver drives it."""
        return case.card.steps(self._steps_for(case.card.tags))

    def _driven(self, case: Case) -> tuple[list[tuple], eager.Outputs] | None:
        """A driven case's inputs and eager reference, its driver's plan on one module (None: not driven)."""
        if not case.driver or case.card.drive is None:
            return None
        plan = drivers.of_case(case, self._horizon)
        return plan.inputs(case.card.drive), drivers.run_eager(case.card, plan)

    def lowered(self, case: Case) -> CaseOutcome:
        """Export, quantize and lower (no device)."""
        if case.id not in self._outcomes:
            steps = self._steps(case)
            ahead = self._ahead.pop(case.id, None)
            artifact = (
                ahead.result() if ahead is not None and not ahead.cancelled() else self._lower_once(case, len(steps))
            )
            started = time.perf_counter()
            driven = self._driven(case)
            if driven is None:
                results = references.eager_results(case, steps, self._cache_dir)
                reference, dependence = results.reference, results.dependence
            else:  # the checks of a driven case compare with eager driven alike; none reads the dependence
                (steps, reference), dependence = driven, None
            # Stage times of a lowering read from the cache belong to the run that lowered it, not this one.
            timings = {} if artifact.cached else dict(artifact.facts.timings_s)
            timings["eager_reference"] = time.perf_counter() - started
            self._outcomes[case.id] = CaseOutcome(
                case, steps, artifact, reference, timings_s=timings, dependence=dependence
            )
        return self._outcomes[case.id]

    def executed(self, case: Case) -> CaseOutcome:
        """Lowered and run on a device of the case's SoC (once per run)."""
        outcome = self.lowered(case)
        if outcome.run is None and outcome.run_error is None and outcome.artifact.ok:
            self._run(outcome)
        return outcome

    def _lower_once(self, case: Case, steps: int, profile_level: int = 0) -> LoweredArtifact:
        """Workers asking for the same key wait for the one that lowers it, then read its result. A cached
        entry is served only when its facts parse and its program is the one they describe; a failure of the
        machine (no space, no memory, a killed lowering) is reported but not kept for later runs.
        profile_level: the case's profiled twin (--profile-level), kept beside it: its key's folder + the level.
        A driven case is lowered as its undriven case (Case.lowering): its drivers share the one lowering."""
        case = case.lowering
        directory = lowering_directory(case, steps, self._toolchain, self._cache_dir, self._work_dir)
        if profile_level:
            directory = directory.with_name(f"{directory.name}-profile{profile_level}")
        shared = (self._cache_dir or self._work_dir / "artifacts") / "prepared"
        directory.parent.mkdir(parents=True, exist_ok=True)
        if self._cache_dir is not None:  # filelock opens its file following links, truncating it
            claim_entry(Path(f"{directory}.lock"), "cache lock")
        with FileLock(str(directory) + ".lock"):
            if self._cache_dir is not None:
                claim_entry(directory, "cached lowering")
            cached = served(case, directory)
            if cached is not None:
                return cached
            artifact = lower_case(case, self._toolchain, directory, steps, self._lowering_server, shared, profile_level)
            if not artifact.facts.cacheable:
                (directory / "facts.json").unlink(missing_ok=True)  # the next run lowers it again
            return artifact

    def _device_runs(self, outcome: CaseOutcome) -> CaseRuns:
        """The case's device runs, decided once from the outcome: the one place a run's request is derived."""
        case = outcome.case
        plan = drivers.of_case(case, self._horizon) if case.driver else None
        methods = case.card.step_methods(len(outcome.steps)) if case.card.multi_method else None
        request = DeviceRunRequest(
            case.id,
            outcome.artifact.pte,
            outcome.steps,
            self._work_dir / "runs" / self._worker / case.id,
            output_count=len(outcome.reference[0]),
            soc=case.soc,
            output_bytes=[[array.nbytes for array in row] for row in outcome.reference],
            methods=plan.methods if plan is not None else methods,
            method_index=outcome.artifact.facts.method_index,
            shared_buffer=case.card.shared_buffer,
            timeout_s=self._runner_timeout_s,
            reloads=plan.reloads if plan is not None else (),
            # the long driver's run timed beside the reference, for the horizon check's execute time (its
            # outputs are the same, harness/tests/runner/test_reference_program.py)
            reference=self._reference_program(case.soc) if case.driver == "long" else None,
        )
        return CaseRuns(request, self._perf_repeats - 1, self._profile_level, self._reference_runner(case))

    def _reference_program(self, soc: str) -> Path | None:
        """The repeats' and the long driver's reference program, timed after each step in the runner's process
        (the performance gate's and the horizon check's drift meter): the health check's one-op program for soc
        (a cache hit after the health check); None when it did not lower (the runs then go without one)."""
        artifact = self._lower_once(health_card.health_case(soc), health_card.STEPS)
        return artifact.pte if artifact.ok else None

    def _attempt(self, request: DeviceRunRequest, suffix: str = "", **changes) -> Attempt:
        """One device run: the request, or its variant in a folder of its own (name + suffix) with changes."""
        if suffix:
            name = request.name + suffix
            request = replace(request, name=name, local_dir=request.local_dir.with_name(name), **changes)
        return run_with_reconnects(self._pool, request, f"{self._worker}:{request.name}")

    def _run(self, outcome: CaseOutcome) -> None:
        """Run on a device (the device layer retries a dropped connection), then the case's other runs; what
        they came to goes on the outcome."""
        if self._pool is None:
            outcome.run_error = "no devices in this run (--compile-only?)"
            return
        runs = self._device_runs(outcome)
        outcome.run_dir = runs.run.local_dir
        attempt = self._attempt(runs.run)
        outcome.run, outcome.run_error, outcome.run_error_is_infrastructure = (
            attempt.run,
            attempt.error,
            attempt.infrastructure,
        )
        outcome.run_error_is_not_measured = attempt.not_measured
        outcome.device_serial, outcome.device_kind = attempt.device_serial, attempt.device_kind
        outcome.device = kinds.of(attempt.device_kind) if attempt.device_kind else None
        outcome.retries = attempt.retries
        outcome.device_log = attempt.device_log
        outcome.timings_s.update(attempt.timings_s)
        if outcome.run is None:
            return
        self._repeat(outcome, runs)
        if runs.profile_level:
            started = time.perf_counter()
            self._profile(outcome, runs)
            outcome.timings_s["profile"] = time.perf_counter() - started  # its lowering, run and reading
        if runs.reference_runner and outcome.run.runner != runs.reference_runner:
            self._reference(outcome, runs)

    def _repeat(self, outcome: CaseOutcome, runs: CaseRuns) -> None:
        """The plan run again, --perf-repeats - 1 times, each in a fresh runner process (so from the program's
        initial state): only the step times are kept, for the performance gate's noise band, with the reference
        program's after each step, the plan cycled (timed; never in the case's first run, whose outputs the
        checks read). A repeat that fails ends the repeats (the gate then has fewer of them), said in
        outcome.repeat_note."""
        reference = self._reference_program(outcome.case.soc) if runs.repeats else None
        request = timed(runs.run, reference) if reference else runs.run
        for repeat in range(1, runs.repeats + 1):
            attempt = self._attempt(request, f".repeat{repeat}")
            if attempt.run is None:
                outcome.repeat_note = f"--perf-repeats: repeat {repeat} failed: {attempt.error}"
                return
            outcome.repeat_steps_us.append(list(attempt.run.step_times_us))
            outcome.repeat_reference_us.append(list(attempt.run.reference_us))

    def _profile(self, outcome: CaseOutcome, runs: CaseRuns) -> None:
        """The QNN profile (--profile-level): the case lowered again with executorch's profiling (_lower_once),
        and run once more with the runner's ETDump. A run of its own, so the checks' outputs and step times are
        never the profiled program's. What stops it is said in outcome.profile_note; the case's checks do not
        depend on it."""
        case, steps = outcome.case, len(outcome.steps)
        if case.mode is Mode.META_LLAMA or case.card.multi_method:
            # upstream's export_llama takes no profile level; several methods' ETDump blocks cannot be told apart
            # without an ETRecord (harness/runner/profile.py): a lowering for nothing, so none
            outcome.profile_note = "--profile-level: not profiled (a Meta llama flow or multi-method case)"
            return
        artifact = self._lower_once(case, steps, runs.profile_level)
        if not artifact.ok:
            outcome.profile_note = f"--profile-level: the profiled lowering failed: {artifact.failure}"
            return
        attempt = self._attempt(runs.run, ".profile", program=artifact.pte, etdump=True, reference=None)
        if attempt.run is None or attempt.run.etdump is None:
            why = attempt.error if attempt.run is None else "the runner wrote no ETDump (a runner without ETDump?)"
            outcome.profile_note = f"--profile-level: the profiled run failed: {why}"
            return
        try:
            events = read_etdump(attempt.run.etdump, steps)
        except ProfileError as error:
            outcome.profile_note = f"--profile-level: {error}"
            return
        outcome.profile = profile_of(events, PROFILE_NAMES[runs.profile_level])

    def _reference(self, outcome: CaseOutcome, runs: CaseRuns) -> None:
        """The case's program and inputs through the reference runner on a device of its SoC (runner_parity)."""
        runner = runs.reference_runner
        attempt = self._attempt(runs.run, f".{runner}", runner=runner, reference=None)
        outcome.reference_run = OtherRun(
            attempt.run,
            attempt.error,
            attempt.infrastructure,
            attempt.device_serial,
            attempt.timings_s.get("device_total"),
        )
