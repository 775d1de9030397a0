"""One run's controller-side resources, started once and stopped once: the QNN toolchain, the run's
lowering server, its devices (through a provider) and its host work folder; and, once, each device's
health check and provenance (harness/health.py), so no worker repeats them.

The plugin calls start() at configure and stop() at unconfigure; workers only ever see the RunContext
that start() returns. The lowering server is started only when something must be lowered (a warm run needs
none: it would cost seconds of imports and memory for nothing): at start, while an emulated fleet comes up,
when the health check's program is not in the artifact cache (else that lowering took a fresh Python, about
10 s of imports, before the server took as long again); otherwise after collection, when a collected case is
not in the cache.
The controller decides and starts it, not the first worker that misses: a server must be the controller's
child to die with the run (pdeathsig), to be in the run's record (what a killed run left) and to outlive
any one worker. xdist schedules no test before the controller has seen a collection, so the server is up
before any case asks; a case nobody foresaw (a damaged cache entry) is lowered in a fresh Python, as
without a server. Stopping removes the run's folder from every device while the devices still answer,
then stops the lowering server and the provider, then removes the work folder.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

from harness import health, run_records
from harness.context import RunContext, new_run_id
from harness.device import kinds, pool
from harness.device.device import DeviceError
from harness.emulator.launcher import FleetError
from harness.files import NoWorkFolder, make_work_folder
from harness.options import RunOptions
from harness.pipeline.health_card import STEPS as HEALTH_STEPS
from harness.pipeline.lowering_cache import is_lowered, lowering_directory
from harness.process import fork_server
from harness.process.services import LOWERING
from harness.providers import DeviceProvider, provider_for
from harness.qnn.interposer import InterposerBuildError
from harness.qnn.sdk import SdkError
from harness.qnn.toolchain import Toolchain, ToolchainError, prepare
from harness.user_state import UnsafeStateDir
from harness.vocabulary import Case


class RunStartError(RuntimeError):
    """The run cannot start; the message is one line naming the problem and the fix."""


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a CI job cancelled, `kill`) ends the run as Ctrl-C does: reports of what finished, then stop."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


class RunSession:
    def __init__(self, options: RunOptions) -> None:
        self._options = options
        self._provider: DeviceProvider | None = None
        self._previous_sigterm: object = None
        self._lowering_server: subprocess.Popen[bytes] | None = None
        self._toolchain: Toolchain | None = None
        self._lowering_decided = False
        self._attached: tuple[str, ...] = ()  # labels of the devices this run did not start (phones)
        self.context: RunContext | None = None

    def start(self, health_check: bool = True) -> RunContext:
        """health_check=False (e.g. --collect-only, which runs nothing): no device runs the health program."""
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _interrupt)
        try:
            for line in run_records.clean_up_after_killed_runs():
                print(line, file=sys.stderr)
        except UnsafeStateDir as error:
            raise RunStartError(str(error)) from error
        run_id = new_run_id()
        try:  # the devices' jails hide it wherever it is (harness/emulator/jail.py)
            work_dir = make_work_folder(f"qnnsuite-{run_id}-")
        except NoWorkFolder as error:
            raise RunStartError(str(error)) from error
        socket_path = work_dir / "lower.sock"  # where the lowering server serves once started
        checks_health = health_check and not self._options.compile_only
        try:
            toolchain = self._toolchain = prepare(self._options.qnn_sdk)
            self._provider = provider_for(self._options, toolchain, work_dir)
            if checks_health and self._health_unlowered(self._provider.expected_socs, work_dir):
                self._spawn_lowering_server(socket_path)  # comes up while the devices do
            provided = self._provider.start()
            options = self._options
            given = kinds.payload_inputs(
                toolchain.sdk,
                options.runner,
                options.backend_lib,
                options.android_ndk,
                options.executorch_android_build,
            )
            kinds.check_payloads([(d.kind, d.abi, d.htp_arch) for d in provided.devices], given)
            # Until the lowering server serves there, or without it, a client lowers in a fresh Python.
            server_pids = (self._lowering_server.pid,) if self._lowering_server else ()
            self.context = RunContext(
                run_id,
                provided.devices,
                provided.emulated_pids,
                (*provided.started_pids, *server_pids),
                work_dir,
                lowering_server=socket_path,
                lowering_server_pid=server_pids[0] if server_pids else None,
            )
        except (DeviceError, SdkError, ToolchainError, FleetError, InterposerBuildError) as error:
            self._stop_processes()
            shutil.rmtree(work_dir, ignore_errors=True)
            raise RunStartError(str(error)) from error
        self._publish(self.context)
        # By label (server/serial): the next run must find the folder on the same host's device.
        attached = self._attached = tuple(
            spec.label for spec in self.context.devices if spec.serial not in self.context.emulated_pids
        )
        run_records.record(run_id, work_dir, self.context.started_pids, devices=attached)
        self._remove_killed_runs_folders(set(attached))
        if checks_health:
            if self._lowering_server is not None:
                self._wait_for_lowering_server()
            elif not self._provider.expected_socs and self._health_unlowered(
                {spec.soc for spec in self.context.devices}, work_dir
            ):
                self._start_lowering_server()  # devices whose SoCs were not known before they came up
            self.context = self._checked(self.context, toolchain, given)
            self._publish(self.context)
        return self.context

    def _health_unlowered(self, socs: Iterable[str], work_dir: Path) -> bool:
        """Whether the health check's program for one of these SoCs is not in the artifact cache."""
        return any(
            not is_lowered(
                lowering_directory(
                    health.health_case(soc), HEALTH_STEPS, self._toolchain, self._options.cache_dir, work_dir
                )
            )
            for soc in socs
        )

    def _remove_killed_runs_folders(self, labels: set[str]) -> None:
        """The folders killed earlier runs of this user left on these devices (harness/run_records.py)."""
        context = self.context
        for run_id, label in run_records.leftover_folders(labels):
            spec = next(spec for spec in context.devices if spec.label == label)
            lines = pool.remove_run_folders([spec], run_id)
            if not lines:
                run_records.leftover_removed(run_id, label)
                print(
                    f"qnnsuite: removed {label}:{pool.WORKSPACE_ROOT}/{run_id}, left by a killed run", file=sys.stderr
                )

    def _checked(self, context: RunContext, toolchain: Toolchain, given: kinds.PayloadInputs) -> RunContext:
        """The context with the devices that failed their health check quarantined, and every device's provenance."""
        options = self._options
        results = health.HealthCheck(
            context.devices,
            context.run_id,
            toolchain,
            context.work_dir,
            given,
            options.runner_timeout_s,
            options.cache_dir,
            context.lowering_server,
        ).run()
        for line in health.report_lines(results, len(context.devices)):
            print(line, file=sys.stderr, flush=True)
        return dataclasses.replace(context, quarantined=results.quarantined, provenance=results.provenance)

    def start_lowering_server_if_needed(self, cases: Iterable[Case]) -> None:
        """Start the lowering server (once per run, before any case is lowered) if one of the collected cases
        is not in the artifact cache; the run's record and run-context.json then name it."""
        if self._lowering_decided or self.context is None or self._toolchain is None:
            return
        self._lowering_decided = True
        options, context = self._options, self.context
        if self._lowering_server is not None:  # started for the health check
            return
        missing = [
            case
            for case in cases
            if not is_lowered(
                lowering_directory(
                    case,
                    len(case.card.steps(options.steps_for(case.card.tags))),
                    self._toolchain,
                    options.cache_dir,
                    context.work_dir,
                )
            )
        ]
        if missing:
            self._start_lowering_server()

    def _spawn_lowering_server(self, socket_path: Path) -> None:
        self._lowering_server = fork_server.spawn_server(LOWERING, socket_path, self._toolchain.child_env())

    def _wait_for_lowering_server(self) -> None:
        """Until it serves; if it never does, each lowering takes a fresh Python (said in one line)."""
        try:
            fork_server.wait_until_serving(self._lowering_server, self.context.lowering_server)
        except fork_server.ForkServerError as error:
            print(f"qnnsuite: {error}; lowering each case in a fresh Python instead (slower)", file=sys.stderr)

    def _start_lowering_server(self) -> None:
        """Start it once the run's context exists; the run's record and run-context.json then name it."""
        context = self.context
        self._spawn_lowering_server(context.lowering_server)
        self._wait_for_lowering_server()
        self.context = dataclasses.replace(
            context,
            lowering_server_pid=self._lowering_server.pid,
            started_pids=(*context.started_pids, self._lowering_server.pid),
        )
        self._publish(self.context)
        run_records.record(context.run_id, context.work_dir, self.context.started_pids, devices=self._attached)

    def _publish(self, context: RunContext) -> None:
        """The run's devices and processes, beside its reports (what ran where; what to look for after)."""
        folder = self._options.report_dir / context.run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "run-context.json").write_text(context.to_json())

    def stop(self, keep_work_dir: bool = False) -> None:
        """keep_work_dir: leave the host work folder (and say where), e.g. when the reports could not be written."""
        context, keep = self.context, self._options.keep_workspace
        if context is not None and not keep:  # while the devices still answer
            for line in pool.remove_run_folders(list(context.devices), context.run_id):
                print(line, file=sys.stderr)
        self._stop_processes()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if context is not None:
            run_records.forget(context.run_id)
        if context is not None and (keep or keep_work_dir):
            print(f"qnnsuite: the run's work folder is kept: {context.work_dir}", file=sys.stderr)
        elif context is not None:
            shutil.rmtree(context.work_dir, ignore_errors=True)

    def _stop_processes(self) -> None:
        if self._provider is not None:
            self._provider.stop()
            self._provider = None
        if self._lowering_server is not None:
            fork_server.stop_server(self._lowering_server)
            self._lowering_server = None
