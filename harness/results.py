"""Each case's shared result: lowered once per run, run once on a device, read by every check.

Checks never lower or run anything themselves; they ask the CaseStore, which memoizes per worker
and, for lowering, across workers (a file lock per case, results on disk in the run's work dir).
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from filelock import FileLock

from harness.device import kinds
from harness.device.device import DeviceError, DeviceFrozen, DeviceLost
from harness.device.execute import RunnerFailed, run_case
from harness.device.pool import DevicePool
from harness.pipeline import cache, references
from harness.pipeline.facts import FactsError, LoweringFacts
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.qnn import qnnlog
from harness.outcome import CaseOutcome
from harness.qnn.toolchain import Toolchain
from harness.vocabulary import Case


MAX_RETRIES = 2
RECONNECT_WAIT_S = 10.0


class CaseStore:
    def __init__(self, toolchain: Toolchain, pool: DevicePool | None, work_dir: Path, worker: str,
                 steps_for, runner_timeout_s: float, cache_dir: Path | None, lowering_server: Path | None) -> None:
        """cache_dir: where lowered artifacts are kept by content key across runs (None: this run only);
        lowering_server: the run's lowering server socket (None: each case lowered in a fresh Python)."""
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
        return case.card.steps(self._steps_for(case.card.tags))

    def lowered(self, case: Case) -> CaseOutcome:
        """Export, quantize and lower (no device)."""
        if case.id not in self._outcomes:
            steps = self._steps(case)
            ahead = self._ahead.pop(case.id, None)
            artifact = ahead.result() if ahead is not None and not ahead.cancelled() else self._lower_once(case, len(steps))
            started = time.perf_counter()
            results = references.eager_results(case, steps, self._cache_dir)
            # Stage times of a lowering read from the cache belong to the run that lowered it, not this one.
            timings = {} if artifact.cached else dict(artifact.facts.timings_s)
            timings["eager_reference"] = time.perf_counter() - started
            self._outcomes[case.id] = CaseOutcome(case, steps, artifact, results.reference, timings_s=timings,
                                                  dependence=results.dependence)
        return self._outcomes[case.id]

    def executed(self, case: Case) -> CaseOutcome:
        """Lowered and run on a device of the case's SoC (once per run)."""
        outcome = self.lowered(case)
        if outcome.run is None and outcome.run_error is None and outcome.artifact.ok:
            self._run(outcome)
        return outcome

    def _lower_once(self, case: Case, steps: int) -> LoweredArtifact:
        """Workers asking for the same key wait for the one that lowers it, then read its result. A cached
        entry is served only when its facts parse and its program is the one they describe; a failure of the
        machine (no space, no memory, a killed lowering) is reported but not kept for later runs."""
        directory = lowering_directory(case, steps, self._toolchain, self._cache_dir, self._work_dir)
        shared = (self._cache_dir or self._work_dir / "artifacts") / "prepared"
        directory.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory) + ".lock"):
            cached = self._cached(case, directory)
            if cached is not None:
                return cached
            artifact = lower_case(case, self._toolchain, directory, steps, self._lowering_server, shared)
            if not artifact.facts.cacheable:
                (directory / "facts.json").unlink(missing_ok=True)  # the next run lowers it again
            return artifact

    def _cached(self, case: Case, directory: Path) -> LoweredArtifact | None:
        facts_path, log_path = directory / "facts.json", directory / "lower.log"
        if not is_lowered(directory):
            return None
        try:
            facts = LoweringFacts.read_cached(facts_path)
        except FactsError as error:
            problem = str(error)
        else:
            problem = _program_problem(directory / "model.pte", facts)
            if problem is None:
                log = log_path.read_text(errors="replace")
                return LoweredArtifact(case, directory, facts, log, 0.0, qnnlog.error_lines(log), cached=True)
        print(f"qnnsuite: cached lowering of {case.id} is damaged ({problem}); lowering it again", file=sys.stderr)
        return None

    def _run(self, outcome: CaseOutcome) -> None:
        """Run on a device; a dropped connection is retried (bounded) if the device comes back."""
        if self._pool is None:
            outcome.run_error = "no devices in this run (--compile-only?)"
            return
        case = outcome.case
        local = outcome.run_dir = self._work_dir / "runs" / self._worker / case.id
        started = time.perf_counter()
        for attempt in range(1 + MAX_RETRIES):
            try:
                with self._pool.acquire(case.soc, holder=f"{self._worker}:{case.id}") as (device, workspace):
                    # waiting for another worker's case to free the device, plus a first push of the payload
                    outcome.timings_s["device_wait"] = time.perf_counter() - started
                    outcome.device_serial, outcome.device_kind = device.label, self._pool.spec(device.label).kind
                    outcome.device = kinds.of(outcome.device_kind)
                    outcome.run = run_case(device, workspace, case.id, outcome.artifact.pte, outcome.steps, local,
                                           output_count=len(outcome.reference[0]), timeout_s=self._runner_timeout_s,
                                           method_index=outcome.artifact.facts.method_index,
                                           output_bytes=[[array.nbytes for array in row] for row in outcome.reference])
                    outcome.timings_s.update(outcome.run.timings_s)
                break
            except DeviceLost as lost:
                label = outcome.device_serial  # the pool's name of the device, server/serial
                retry = label and attempt < MAX_RETRIES and not isinstance(lost, DeviceFrozen)
                if retry and self._pool.back_online(label, RECONNECT_WAIT_S):
                    outcome.retries += 1
                    continue
                if label:
                    self._pool.mark_lost(label, str(lost))
                outcome.run_error, outcome.run_error_is_infrastructure = str(lost), True
                break
            except RunnerFailed as failed:
                outcome.run_error, outcome.device_log = str(failed), failed.device_log
                break
            except DeviceError as error:  # the device's failure, e.g. quarantined by its health check, disk full
                outcome.run_error, outcome.run_error_is_infrastructure = str(error), True
                break
            except Exception as error:  # any other surprise still fails this case alone, in one line
                outcome.run_error = f"device run failed unexpectedly: {type(error).__name__}: {error}"
                break
        outcome.timings_s["device_total"] = time.perf_counter() - started


def lowering_directory(case: Case, steps: int, toolchain: Toolchain, cache_dir: Path | None, work_dir: Path) -> Path:
    """Where the case's lowering is kept: by content key in the cache, else in this run's work folder."""
    if cache_dir is None:
        return work_dir / "artifacts" / case.id
    return cache_dir / cache.key(case, steps, toolchain)


def is_lowered(directory: Path) -> bool:
    """Whether a lowering finished there (whether it is sound is checked when it is served)."""
    return (directory / "facts.json").exists() and (directory / "lower.log").exists()


def _program_problem(pte: Path, facts: LoweringFacts) -> str | None:
    """Why a cached model.pte is not the program its facts describe (None: it is, or there is none to be)."""
    if facts.error is not None:
        return None  # a lowering failure has no program
    if facts.program is None:
        return "its facts do not describe a program"
    try:
        data = pte.read_bytes()
    except OSError as error:
        return f"model.pte unreadable: {error.strerror or error}"
    if len(data) != facts.program.bytes:
        return f"model.pte has {len(data)} bytes, its facts say {facts.program.bytes}"
    if hashlib.sha256(data).hexdigest() != facts.program.sha256:
        return "model.pte's sha256 differs from its facts'"
    return None
