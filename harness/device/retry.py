"""One case's device run with the device layer's reconnects: a dropped connection is retried (bounded) when
the device comes back, or when its dropped adb server is restored by the provider's hook (DevicePool.back_online),
as Mobly's controllers own reconnecting their devices; callers get one result.

The case store (harness/case_store.py) asks for a run here and copies the result into the case's outcome:
the device layer knows nothing of outcomes, checks or verdicts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harness.device.device import DeviceError, DeviceFrozen, DeviceLost
from harness.device.execute import DeviceRun, DeviceRunRequest, RunnerFailed, RunnerUnavailable, run_case
from harness.device.pool import DevicePool

MAX_RETRIES = 2
RECONNECT_WAIT_S = 10.0


@dataclass
class Attempt:
    """What running one case came to, reconnects included; run is None when it failed (error says why)."""

    run: DeviceRun | None = None
    error: str | None = None
    # The device or the lab failed (lost, no space, push refused, quarantined), not the program.
    infrastructure: bool = False
    not_measured: bool = False  # the plan needs a runner the device lacks (execute.RunnerUnavailable)
    device_log: str = ""  # a failed runner's device log tail
    device_serial: str | None = None  # the pool's label of the device that ran it (server/serial)
    device_kind: str | None = None
    retries: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)


def run_with_reconnects(pool: DevicePool, request: DeviceRunRequest, holder: str) -> Attempt:
    """Run the request on a device of its SoC (holder: who holds the device meanwhile, for the pool's
    messages); every failure is one line in the result, never an exception."""
    attempt = Attempt()
    started = time.perf_counter()
    for tried in range(1 + MAX_RETRIES):
        try:
            with pool.acquire(request.soc, holder=holder) as (device, workspace):
                # waiting for another worker's case to free the device, plus a first push of the payload
                attempt.timings_s["device_wait"] = time.perf_counter() - started
                attempt.device_serial, attempt.device_kind = device.label, pool.spec(device.label).kind
                attempt.run = run_case(device, workspace, request)
                attempt.timings_s.update(attempt.run.timings_s)
            break
        except DeviceLost as lost:
            label = attempt.device_serial or lost.label  # the pool's name of the device, server/serial
            retry = label and tried < MAX_RETRIES and not isinstance(lost, DeviceFrozen)
            if retry and pool.back_online(label, RECONNECT_WAIT_S):
                attempt.retries += 1
                continue
            if label:
                pool.mark_lost(label, str(lost))
            attempt.error, attempt.infrastructure = str(lost), True
            break
        except RunnerUnavailable as unavailable:
            attempt.error, attempt.not_measured = str(unavailable), True
            break
        except RunnerFailed as failed:
            attempt.error, attempt.device_log = str(failed), failed.device_log
            break
        except DeviceError as error:  # the device's failure, e.g. quarantined by its health check, disk full
            attempt.error, attempt.infrastructure = str(error), True
            break
        except Exception as error:  # any other surprise still fails this case alone, in one line
            attempt.error = f"device run failed unexpectedly: {type(error).__name__}: {error}"
            break
    attempt.timings_s["device_total"] = time.perf_counter() - started
    return attempt
