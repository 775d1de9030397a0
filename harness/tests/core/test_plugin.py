"""The suite's pytest wiring: options, bad input as one line, card loading and the case matrix."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

import harness.checks  # noqa: F401  (registers the checks the manifest names)
from harness import known_failures
from harness.tests.child_suite import SUITES, run_suite


def _pytest(
    *args: str, env: dict[str, str] | None = None, targets: tuple[str, ...] = SUITES
) -> subprocess.CompletedProcess:
    """A suite run with a state folder of its own: another test's killed run is not cleaned up here (its
    one line would be a second stderr line)."""
    with tempfile.TemporaryDirectory() as runtime:  # 0700, as the state folder must be
        environment = {**os.environ, "COLUMNS": "300", "XDG_RUNTIME_DIR": runtime, **(env or {})}
        return run_suite(*args, targets=targets, env=environment, timeout=600)


@pytest.mark.child_suite
@pytest.mark.parametrize(
    "args, expected",
    [
        (["--soc", "SM0000"], "ERROR: --soc: unknown SoC 'SM0000': the ExecuTorch under test knows"),
        (["--emulate", "XX1"], "ERROR: --emulate: unknown SoC 'XX1'"),
        (["--steps", "0"], "ERROR: --steps 0: give a step count of 1 or more"),
        (["--horizon", "100"], "ERROR: --horizon 100: give 256 steps or more"),
        (["--runner", "/nonexistent/runner"], "ERROR: --runner /nonexistent/runner does not exist"),
        (["--baseline", "/nonexistent/report.json"], "ERROR: --baseline /nonexistent/report.json does not exist"),
        (["--models", "no_such_module_xyz"], "ERROR: --models: cannot import model cards from 'no_such_module_xyz'"),
        (["--qnn-sdk", "/nonexistent/sdk"], "ERROR: QNN SDK path /nonexistent/sdk (from --qnn-sdk) does not exist"),
    ],
)
def test_bad_option_is_one_line(args, expected):
    completed = _pytest("--collect-only", *args)
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR, completed.stdout + completed.stderr
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), completed.stderr


@pytest.mark.device
@pytest.mark.child_suite
def test_unknown_device_serial_is_one_line(tmp_path):
    from harness.emulator.launcher import EmulatorFleet

    with EmulatorFleet(["SM8650"], tmp_path) as fleet:
        completed = _pytest("--collect-only", "--device", "emulator-9999", env=fleet.server.environment)
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert completed.returncode == pytest.ExitCode.USAGE_ERROR
    assert len(lines) == 1 and lines[0].startswith(
        "ERROR: unknown device serial emulator-9999: attached are 127.0.0.1:"
    )


@pytest.mark.child_suite
def test_matrix_collects_every_card_dtype_mode_and_soc_and_extra_models():
    completed = _pytest(
        *("--collect-only", "--emulate", "SM8650,SM8750", "--models", "harness.tests.broken_cards"),
        targets=("suites/test_partitions.py",),
    )
    assert completed.returncode == 0, completed.stderr
    ids = [line for line in completed.stdout.splitlines() if "::test_partitions[" in line]
    assert any("[split_by_unsupported_op-16a4w-skip_mutbuf-SM8750]" in line for line in ids), "--models adds cards"
    assert any("[kv_index_copy_dim1-fp16-delegate_mutbuf-SM8650]" in line for line in ids)
    import harness.tests.broken_cards  # noqa: F401
    from fixtures import families, multi_method, zoo  # noqa: F401  (the default cards)
    from harness.pipeline import card, cases
    from harness.vocabulary import DTYPES

    expected = {case.id for case in cases.matrix(card.cards(), DTYPES, ["SM8650", "SM8750"])}
    assert {line.split("[", 1)[1].rstrip("]") for line in ids} == expected, "every card x its dtypes x mode x SoC, once"
    assert len(ids) == len(expected)
    assert not any("qnnsuite_health_one_op" in line for line in ids), "the health check's program is never a case"
    assert "health check" not in completed.stderr, "collecting runs nothing on the devices"


@pytest.mark.child_suite
def test_horizon_widens_the_long_driver_s_cases_and_its_absence_keeps_the_default_subset():
    """--horizon N reaches collection (the controller's, as each worker's): the long driver's cases grow from
    its default subset (fp16, the cards that ask for it) to every driven card and dtype."""

    def long_cases(*args: str) -> set[str]:
        completed = _pytest("--collect-only", "--emulate", "SM8650", *args, targets=("suites/test_horizon.py",))
        assert completed.returncode == 0, completed.stderr
        return {
            line.split("[", 1)[1].split("]")[0] for line in completed.stdout.splitlines() if "::test_horizon[" in line
        }

    default, widened = long_cases(), long_cases("--horizon", "300")
    assert default and default < widened
    assert not any("-16a8w-" in case for case in default)
    assert "drv_prefill_decode_kv-16a8w-skip_mutbuf-SM8650-long" in widened


def test_known_failure_patterns_treat_brackets_literally():
    entry = known_failures.load()[0]
    name = entry.pattern.replace("*", "x").replace("?", "x")
    assert entry in known_failures.matching(name)
    assert entry not in known_failures.matching(name.replace("[", "(").replace("]", ")"))
