"""The health check: before a device gets cases, it must run a one-op program and match eager.

A device that cannot run anything (a broken runner, missing or wrong libraries, full storage, a DSP that
will not start) would otherwise fail every case with the same line, which reads as hundreds of
conformance failures. Run once per device by the controller at session start (harness/session.py), each
device in its own thread, through the suite's own path: the program (harness/pipeline/health_card.py) is
lowered once per SoC through the artifact cache and the run's lowering server, pushed, run and pulled by
the CaseStore, and compared with eager by the same tolerances as every case. A device that fails is
quarantined: one line on stderr naming it and the cause, and its cases raise InfrastructureError with that
line (harness/device/pool.py). The same visit measures the device's provenance (harness/device/provenance.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.case_store import CaseStore
from harness.device import kinds, provenance
from harness.device.device import WORKSPACE_ROOT
from harness.device.kinds import PayloadInputs
from harness.device.pool import DevicePool, DeviceSpec
from harness.outcome import CaseOutcome
from harness.pipeline.health_card import STEPS, health_case
from harness.qnn.toolchain import Toolchain

# A one-op program runs in well under a second on a phone's HTP; a minute covers a slow first DSP start
# without letting a hung runner hold the run's start for the full --runner-timeout.
HEALTH_TIMEOUT_S = 60.0


@dataclass
class HealthResults:
    """label (server/serial) -> quarantine line (failed devices only), and label -> provenance (every device)."""

    quarantined: dict[str, str] = field(default_factory=dict)
    provenance: dict[str, dict] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)  # what to say on stderr
    seconds: float = 0.0


def verdict(outcome: CaseOutcome) -> str | None:
    """Why the device failed the health check (one line), or None when it passed."""
    if outcome.run is None:  # a runner's failure is a line, then "; its log:" and the log (in its run folder)
        return (outcome.run_error or "the program was not run").splitlines()[0].removesuffix("; its log:")
    try:
        comparison = outcome.comparison
    except ValueError as error:  # outputs of the wrong size
        return f"its output is not the program's: {error}"
    if comparison.mismatched:
        worst = max(comparison.errors, key=lambda e: e.max_abs_error)
        return (
            f"its output differs from eager: {sum(e.mismatches for e in comparison.errors)} element(s) out of "
            f"tolerance, max abs error {worst.max_abs_error:.4g} at step {worst.step}"
        )
    return None


def quarantine_line(spec: DeviceSpec, cause: str) -> str:
    return f"device {spec.label} ({spec.soc}) quarantined: it failed the health check (a one-op program): {cause}"


class HealthCheck:
    """One run's health checks; `run()` visits every device in parallel and returns what it found."""

    def __init__(
        self,
        specs: tuple[DeviceSpec, ...],
        run_id: str,
        toolchain: Toolchain,
        work_dir: Path,
        given: PayloadInputs,
        runner_timeout_s: float,
        cache_dir: Path | None,
        lowering_server: Path | None,
    ) -> None:
        self._specs, self._run_id = specs, run_id
        self._toolchain, self._work_dir, self._given = toolchain, work_dir, given
        self._timeout_s = min(runner_timeout_s, HEALTH_TIMEOUT_S)
        self._cache_dir, self._lowering_server = cache_dir, lowering_server
        self._results = HealthResults()
        self._lock = threading.Lock()

    def run(self) -> HealthResults:
        started = time.perf_counter()
        threads = [
            threading.Thread(target=self._visit, args=(index, spec), name=f"health {spec.serial}", daemon=True)
            for index, spec in enumerate(self._specs)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._results.seconds = time.perf_counter() - started
        return self._results

    def _visit(self, index: int, spec: DeviceSpec) -> None:
        worker = f"health-{index}"  # its own host and device folders, even for two devices of one SoC
        given = self._given
        pool = DevicePool(
            [spec], self._run_id, worker, self._toolchain.sdk, given.runner, given.backend_lib, given.trace_interposer
        )
        pool.android_runner = given.android_runner  # a phone's health run takes the runner its cases take
        store = CaseStore(
            self._toolchain,
            pool,
            self._work_dir,
            worker,
            lambda tags: STEPS,
            self._timeout_s,
            self._cache_dir,
            self._lowering_server,
        )
        cause, status = None, "passed"
        try:
            outcome = store.executed(health_case(spec.soc))
            if not outcome.artifact.ok:  # not the device's fault: say so, and let it take cases
                status = f"not checked: its program could not be lowered ({outcome.artifact.failure.splitlines()[0]})"
                self._say(
                    f"qnnsuite: device {spec.serial} ({spec.soc}) is not health-checked: the one-op program "
                    f"could not be lowered ({outcome.artifact.failure.splitlines()[0]})"
                )
            else:
                cause = verdict(outcome)
            found = self._provenance(pool, spec)
        except Exception as error:  # a surprise quarantines this device alone, in one line
            cause, found = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", {}
        finally:
            pool.close(keep=False)
        with self._lock:
            self._results.provenance[spec.label] = {
                "serial": spec.serial,
                "device": spec.label,
                "soc": spec.soc,
                **found,
                "health": cause or status,
            }
            if cause is not None:
                line = quarantine_line(spec, cause)
                self._results.quarantined[spec.label] = line
                self._results.lines.append(f"qnnsuite: {line}")

    def _provenance(self, pool: DevicePool, spec: DeviceSpec) -> dict:
        try:
            payload = kinds.of(spec.kind).payload(spec.abi, spec.htp_arch, self._given)
            device = pool.device(spec.label)
            return provenance.measure(
                device, spec.kind, payload, f"{WORKSPACE_ROOT}/{self._run_id}/payload", self._toolchain.sdk
            )
        except Exception as error:  # provenance not measured is said in the report, never a quarantine
            return {
                "kind": spec.kind,
                "problem": f"provenance not measured: {str(error).splitlines()[0] if str(error) else type(error).__name__}",
            }

    def _say(self, line: str) -> None:
        with self._lock:
            self._results.lines.append(line)


def report_lines(results: HealthResults, devices: int) -> list[str]:
    """The lines for stderr: every quarantine, and how long the checks took."""
    healthy = devices - len(results.quarantined)
    return [*results.lines, f"qnnsuite: health check: {healthy}/{devices} device(s) healthy in {results.seconds:.1f} s"]
