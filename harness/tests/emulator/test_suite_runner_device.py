"""The emulated device's runners on a real .pte (harness/emulator/compiled_runner.py, runner_client.py).

The device's default runner is the suite's compiled runner, a fresh process in the device's jail; the
pybindings runner stays beside it as the reference. Both must give the same outputs and trace, every fault
switch must still break the compiled runner the way it says, the trace must be made fresh and never through a
planted link, the runner must stay inside the jail, its stderr must reach the device log, and a runner that
cannot be built must be one line and a fallback, never a failed run.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness import horizon
from harness.device import kinds
from harness.device.adb import AdbClient
from harness.device.device import Device, shell_line
from harness.device.execute import DeviceRunRequest, RunnerFailed, Workspace, prepare_workspace, run_case
from harness.device.payload import RUNNER_COMMANDS, RUNNER_NAME, SUITE_RUNNER_NAME
from harness.emulator.launcher import EmulatorFleet
from harness.pipeline import card as cards, mutbuf
from harness.pipeline.facts import LoweringFacts
from harness.pipeline.lower import LoweredArtifact, lower_case
from harness.qnn.sdk import WHEEL_ORIGIN, QnnSdk
from harness.runner import build as runner_build
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4
CARD = "fixtures.zoo:kv_gather_written"  # stateful: each step reads what the earlier ones wrote
WHEEL_SDK = QnnSdk(root=Path("/nonexistent-sdk"), origin=WHEEL_ORIGIN)


@pytest.fixture(scope="module")
def lowered(toolchain, tmp_path_factory) -> LoweredArtifact:
    case = Case(cards.find(CARD), "fp16", Mode.DELEGATE, "SM8650")
    artifact = lower_case(case, toolchain, tmp_path_factory.mktemp(case.id), STEPS)
    assert artifact.ok, artifact.failure
    return artifact


@pytest.fixture(scope="module")
def fleet(toolchain, tmp_path_factory) -> Iterator[EmulatorFleet]:
    """One SM8650 device, its commands' environment as a run gives it (the heap pattern included)."""
    device_env = {**kinds.EmulatedKind.heap_environment(toolchain.child_env()), "QNNSUITE_PYTHON": sys.executable}
    with EmulatorFleet(["SM8650"], tmp_path_factory.mktemp("fleet"), device_env=device_env) as started:
        yield started


@pytest.fixture(scope="module")
def device(fleet) -> Device:
    return Device(fleet.devices[0].serial, AdbClient(server=fleet.server))


@pytest.fixture(scope="module")
def workspace(device) -> Workspace:
    payload = device.workspace("payload")
    files = kinds.of("emulated").payload("x86_64", 75, kinds.PayloadInputs(WHEEL_SDK))
    prepare_workspace(device, payload, files)
    runners = tuple(item.remote_name for item in files if item.remote_name in RUNNER_COMMANDS)
    assert runners == (RUNNER_NAME, SUITE_RUNNER_NAME), kinds.emulated_suite_runner()[1]
    return Workspace(device.workspace("cases"), payload, runners=runners)


@pytest.fixture
def faults(fleet) -> Iterator:
    """Sets the device's fault switches for one test, and clears them after it."""
    serial = fleet.devices[0].serial
    set_ones: list[str] = []

    def switch(**given) -> None:
        set_ones.extend(given)
        fleet.set_faults(serial, **given)

    yield switch
    fleet.set_faults(serial, **dict.fromkeys(set_ones))


def _run(device, workspace, lowered, tmp_path, name: str, runner: str = SUITE_RUNNER_NAME):
    steps = cards.find(CARD).steps(STEPS)
    return run_case(
        device, workspace, DeviceRunRequest(name, lowered.pte, steps, tmp_path / name, output_count=1, runner=runner)
    )


@pytest.fixture(scope="module")
def both(device, workspace, lowered, tmp_path_factory):
    """The same case through both runners: (compiled, pybindings)."""
    folder = tmp_path_factory.mktemp("both")
    return tuple(
        _run(device, workspace, lowered, folder, runner, runner) for runner in (SUITE_RUNNER_NAME, RUNNER_NAME)
    )


def test_both_runners_give_the_same_outputs_and_trace(both):
    compiled, pybindings = both
    assert (compiled.runner, pybindings.runner) == (SUITE_RUNNER_NAME, RUNNER_NAME)
    for step, (left, right) in enumerate(zip(compiled.outputs, pybindings.outputs, strict=True)):
        assert all(np.array_equal(a, b) for a, b in zip(left, right, strict=True)), f"step {step} differs"
    traces = [mutbuf.read_trace(run.trace) for run in both]
    assert len(traces[0]) == len(traces[1]) == STEPS, "one trace line per graph execute, from each runner"
    assert [[t["name"] for t in r["inputs"]] for r in traces[0]] == [
        [t["name"] for t in r["inputs"]] for r in traces[1]
    ]
    # Measured in each runner's own process: the emulated heap's fill (docs/FINDINGS.md#F1).
    assert compiled.heap_pattern == pybindings.heap_pattern == kinds.EMULATED_HEAP_PATTERN
    assert len(compiled.step_times_us) == STEPS and all(us > 0 for us in compiled.step_times_us)
    assert compiled.peak_rss_kb and compiled.peak_rss_kb > 10_000
    assert (pybindings.step_times_us, pybindings.peak_rss_kb) == ([], None)


def test_reload_each_line_loses_the_state_between_steps(device, workspace, lowered, tmp_path, both, faults):
    """The broken runner of the fault: one compiled-runner process per step, so every step starts afresh."""
    faults(runner_reload_each_line=True)
    broken = _run(device, workspace, lowered, tmp_path, "reload")
    assert broken.runner == SUITE_RUNNER_NAME and len(broken.step_times_us) == STEPS
    assert np.array_equal(broken.outputs[0][0], both[0].outputs[0][0]), "the first step has no state to lose"
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(broken.outputs[1:], both[0].outputs[1:])), (
        "later steps must differ from the healthy run: the state was lost"
    )


@pytest.mark.parametrize(
    "switch, words",
    [
        ({"runner_crash": True}, "crashed with signal 11 SIGSEGV (exit 139)"),
        ({"runner_exit": 3}, "exited 3 (last words: runner: exiting 3 (fault switch))"),
        ({"runner_fewer_outputs": True}, "wrote no output_0_0.raw"),
    ],
)
def test_fault_switches_break_the_compiled_runner(device, workspace, lowered, tmp_path, faults, switch, words):
    faults(**switch)
    with pytest.raises(RunnerFailed) as failure:
        _run(device, workspace, lowered, tmp_path, "fault")
    assert words in str(failure.value)


LONG_STEPS = 48  # a long plan: enough for the horizon judgement's second half (harness/horizon.py MIN_STEPS)


def _long_run(device, workspace, lowered, tmp_path, name: str):
    steps = cards.find(CARD).steps(LONG_STEPS)
    request = DeviceRunRequest(name, lowered.pte, steps, tmp_path / name, output_count=1)
    return run_case(device, workspace, request)


def test_a_registration_leaked_per_execute_grows_and_the_horizon_judgement_names_it(
    device, workspace, lowered, tmp_path, faults
):
    """The fault runner_leak_registration (the interposer registers one buffer more at every graph execute and
    never releases it): the registrations the runner holds grow by one a step, the horizon judgement fails on
    them with their own message, and the structural fact counts one QnnMem_register call per execute."""
    from harness.outcome import CaseOutcome

    clean = _long_run(device, workspace, lowered, tmp_path, "clean")
    assert clean.step_registrations == [0] * LONG_STEPS, "the simulator registers nothing: constant"
    assert len(clean.step_rss_kb) == LONG_STEPS and all(kb > 10_000 for kb in clean.step_rss_kb)
    judged = horizon.long_run_verdict(clean.step_times_us, clean.step_rss_kb, clean.step_registrations)
    assert not judged.verdicts[0].grows and judged.verdicts[0].judged, judged.verdicts[0].message
    assert not judged.verdicts[1].grows, judged.verdicts[1].message  # the peak RSS: settled at load

    faults(runner_leak_registration=True)
    leaking = _long_run(device, workspace, lowered, tmp_path, "leak")
    assert leaking.step_registrations == list(range(1, LONG_STEPS + 1))
    assert np.array_equal(leaking.outputs[-1][0], clean.outputs[-1][0]), "the leak changes no output"
    broken = horizon.long_run_verdict(leaking.step_times_us, leaking.step_rss_kb, leaking.step_registrations)
    assert broken.signature == "registrations_grow"
    assert broken.message().startswith(
        "QNN memory registrations held grow by 1 per execute from step 1, the 2nd execute "
        f"(1 at step 0, 2 at step 1, 3 at step 2, {LONG_STEPS} at step {LONG_STEPS - 1})"
    ), broken.message()
    facts = types.SimpleNamespace(facts=LoweringFacts(structure={"methods": {}}))
    traced = types.SimpleNamespace(has_execute_trace=True)
    for run, calls in ((clean, 0), (leaking, 1)):
        outcome = CaseOutcome(None, [], facts, [], run=run, device=traced)  # type: ignore[arg-type]
        assert outcome.structure["mem_register_calls_per_execute"] == calls


def test_lose_delegate_state_is_routed_to_the_pybindings_runner(device, workspace, lowered, tmp_path, faults):
    """It writes into the runner's memory, which only the pybindings runner can do: the run says who ran it."""
    faults(runner_lose_delegate_state=True)
    run = _run(device, workspace, lowered, tmp_path, "lose")
    assert run.runner == RUNNER_NAME and "runner: measured by qnn_executor_runner" in run.log
    assert run.step_times_us == [] and run.heap_pattern == kinds.EMULATED_HEAP_PATTERN


def test_a_planted_trace_link_is_replaced_not_followed(device, workspace, lowered, tmp_path, fleet):
    """Attack: a device shell plants outputs/trace.jsonl as a link to another file before the runner runs."""
    _run(device, workspace, lowered, tmp_path, "plant")  # lays the case folder out (program, plan, inputs)
    case = f"{workspace.cases}/plant"
    victim = f"{workspace.cases}/victim.txt"
    device.shell(f"echo untouched > {victim} && ln -sf {victim} {case}/outputs/trace.jsonl")
    ran = device.run(
        [
            f"{workspace.payload}/{SUITE_RUNNER_NAME}",
            "--model_path",
            "model.pte",
            "--plan_path",
            "plan.txt",
            "--output_folder_path",
            "outputs",
        ],
        cwd=case,
        timeout_s=120,
    )
    assert ran.exit_code == 0, ran.output[-2000:]
    assert device.read_text(victim).strip() == "untouched"
    listing = device.shell(shell_line(["ls", "-l", f"{case}/outputs/trace.jsonl"])).output
    assert listing.startswith("-"), f"the trace must be a file of its own, not the planted link: {listing}"
    assert len(device.read_text(f"{case}/outputs/trace.jsonl").splitlines()) == STEPS


def test_the_compiled_runner_stays_in_the_jail(device, workspace, lowered, tmp_path):
    """Attack: a device command asks the runner to write its outputs into a host folder."""
    _run(device, workspace, lowered, tmp_path, "jail")
    host = tmp_path / "host-folder"
    host.mkdir()
    ran = device.run(
        [
            f"{workspace.payload}/{SUITE_RUNNER_NAME}",
            "--model_path",
            "model.pte",
            "--plan_path",
            "plan.txt",
            "--output_folder_path",
            str(host),
        ],
        cwd=f"{workspace.cases}/jail",
        timeout_s=120,
    )
    assert ran.exit_code != 0 and list(host.iterdir()) == [], ran.output[-2000:]


def test_the_runners_stderr_reaches_the_device_log(device, workspace, lowered, tmp_path):
    """A runner's last words are in the device log that a failed run pulls (logcat), as on a phone."""
    _run(device, workspace, lowered, tmp_path, "log")
    case = f"{workspace.cases}/log"
    device.shell(f"echo 'qnnsuite-plan 1' > {case}/bad_plan.txt && echo 'step nosuch' >> {case}/bad_plan.txt")
    ran = device.run(
        [
            f"{workspace.payload}/{SUITE_RUNNER_NAME}",
            "--model_path",
            "model.pte",
            "--plan_path",
            "bad_plan.txt",
            "--output_folder_path",
            "outputs",
        ],
        cwd=case,
        timeout_s=120,
    )
    assert ran.exit_code == 5 and "suite_runner: error: step 0 (method nosuch)" in ran.stderr
    logcat = device.shell(shell_line(["logcat", "-d"])).output
    assert "suite_runner: error: step 0 (method nosuch)" in logcat


def test_a_runner_that_cannot_be_built_is_one_line_and_the_pybindings_runner_runs(monkeypatch, capsys):
    def no_compiler(*_args, **_kwargs):
        raise runner_build.RunnerBuildError("no C++ compiler found (g++): install one, e.g. `apt-get install g++`")

    given = kinds.PayloadInputs(WHEEL_SDK)
    kinds.emulated_suite_runner.cache_clear()
    try:
        kinds.check_payloads([("emulated", "x86_64", 75)], given)
        assert capsys.readouterr().err == "", "a runner that builds says nothing"
        kinds.emulated_suite_runner.cache_clear()
        monkeypatch.setattr(runner_build, "build", no_compiler)
        kinds.check_payloads([("emulated", "x86_64", 75)], given)
        lines = capsys.readouterr().err.splitlines()
        assert lines == [
            "qnnsuite: emulated devices run programs through the pybindings qnn_executor_runner: no C++ compiler "
            "found (g++): install one, e.g. `apt-get install g++`"
        ]
        names = [item.remote_name for item in kinds.of("emulated").payload("x86_64", 75, given)]
        assert names == [RUNNER_NAME], "without the binary the device has no suite_runner: run_case falls back"
    finally:
        kinds.emulated_suite_runner.cache_clear()


def test_the_jail_shows_cpuinfo_and_no_other_proc_file(device):
    """executorch's thread pool reads /proc/cpuinfo (without it the compiled runner crashed at the first op
    outside the delegate); the rest of /proc stays out of the jail (/proc/self/root would lead to the host)."""
    assert device.shell("head -1 /proc/cpuinfo").output.startswith("processor")
    assert device.shell("ls /proc").output.split() == ["cpuinfo"]
    assert device.shell("test -e /proc/self/root").exit_code != 0
