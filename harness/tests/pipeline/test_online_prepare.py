"""Online prepare (docs/FINDINGS.md#F19): the card option reaches the compiler spec and the lowering
key, and no manifest entry expects the runner's crash at loading an online-prepared program (the suite bridges
F19: harness/tests/qnn/test_compose_bridge.py)."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

import harness.checks  # noqa: F401  (registers the checks' signatures, which the manifest is checked against)
from fixtures import online_prepare
from harness.check_registry import CheckFailure
from harness.known_failures import matching
from harness.pipeline import cache, card as cards, stages
from harness.verdicts import decide
from harness.vocabulary import DEFAULT_CARD_MODULES, Case, Mode, Verdict

CARDS = [card for card in cards.cards() if card.module == online_prepare.__name__]
CRASH_HEAD = "runner on 127.0.0.1:46163 crashed with signal 11 SIGSEGV (exit 139) (last words: Segmentation fault)"
# The failure measured on 2026-12-03 (emulated SM8650, the suite's compiled runner, executorch 1.5.1, QAIRT 2.51):
# the message execute.py builds from the runner's exit and its log's tail.
ONLINE_PREPARE_CRASH = (
    f"{CRASH_HEAD}; its log:\n"
    "runner: heap pattern 0x40\n"
    "[INFO] [Qnn ExecuTorch]: QnnContextCustomProtocol expected magic number: 0x5678abcd but get: 0x4034b50\n"
    "[INFO] [Qnn ExecuTorch]: Deserializing processed data using Dlc\n"
    "[INFO] [Qnn ExecuTorch]: Creating new backend bundle.\n"
    "[INFO] [Qnn ExecuTorch]: create QNN Logger with log_level 1\n"
    "[WARNING] [Qnn ExecuTorch]: Qnn API version 2.40.0 is used. The version is tested against 2.27.0.\n"
    "[INFO] [Qnn ExecuTorch]: Initialize Qnn backend parameters for Qnn executorch backend type 2\n"
    "[INFO] [Qnn ExecuTorch]: Caching: Caching is in RESTORE MODE.\n"
    "[INFO] [Qnn ExecuTorch]: QnnContextCustomProtocol expected magic number: 0x5678abcd but get: 0x4034b50\n"
    "[WARNING] [Qnn ExecuTorch]: Failed to interpret QNN context binary. Error code 30010. Try verifying binary "
    "with online-prepare format.\n"
    "[INFO] [Qnn ExecuTorch]: create QNN Logger with log_level 1\n"
    "[ERROR] [Qnn ExecuTorch]:  <E> unexpected GraphHtpSettings option 66\n"
    "\n"
    "Segmentation fault"
)
# The emulated device's fault switch runner_crash (docs/FAULTS.md row 16): the same signal, another cause.
FAULT_SWITCH_CRASH = (
    f"{CRASH_HEAD}; its log:\nrunner: heap pattern 0x40\nrunner: crashing (fault switch)\nSegmentation fault"
)
# The same load path failing cleanly (what executorch could say instead): not a crash, so not F19.
CLEAN_LOAD_ERROR = ONLINE_PREPARE_CRASH.replace(
    "crashed with signal 11 SIGSEGV (exit 139) (last words: Segmentation fault)",
    "exited 1 (last words: Can't compose graph from dlc. Error 1.)",
)


def test_the_family_is_in_the_default_matrix_online_prepared_and_narrowed():
    assert online_prepare.__name__ in DEFAULT_CARD_MODULES
    assert {card.name for card in CARDS} == {"online_prepare_counter", "online_prepare_kv_write"}
    assert all(card.online_prepare and card.name.startswith("online_prepare_") for card in CARDS)
    assert {dtype for card in CARDS for dtype in card.dtypes} == {"fp16", "16a8w"}
    assert not any(card.online_prepare for card in cards.cards() if card.module != online_prepare.__name__)


@pytest.mark.parametrize(
    ("name", "offline"), [("online_prepare_counter", "counter_add"), ("online_prepare_kv_write", "kv_gather_written")]
)
def test_each_card_is_a_zoo_card_prepared_online(name, offline):
    """A variant, not a copy: the zoo card's model, steps and buffers, so a difference from its offline results
    is the prepare path's alone; only the name, module, tags, dtypes and online_prepare differ."""
    card, zoo_card = cards.find(f"{online_prepare.__name__}:{name}"), cards.find(f"fixtures.zoo:{offline}")
    assert (card.build, card.steps, card.mutated_buffers) == (zoo_card.build, zoo_card.steps, zoo_card.mutated_buffers)
    assert card.online_prepare and not zoo_card.online_prepare and card.tags == zoo_card.tags | {"online_prepare"}
    assert card.module == online_prepare.__name__ and zoo_card.module == "fixtures.zoo"


def test_a_variant_leaves_its_card_as_it_was():
    zoo_card = cards.find("fixtures.zoo:counter_add")
    changed = cards.variant(zoo_card, "counter_add_online", "my.cards", tags=frozenset({"x"}), online_prepare=True)
    assert (changed.name, changed.module, changed.online_prepare) == ("counter_add_online", "my.cards", True)
    assert changed.tags == zoo_card.tags | {"x"} and changed.build is zoo_card.build
    assert (zoo_card.name, zoo_card.online_prepare, zoo_card.tags) == ("counter_add", False, frozenset({"counter"}))


@pytest.mark.parametrize("option", ["online_prepare", "shared_buffer"])  # ModelCard's compiler-spec options
@pytest.mark.parametrize("value", [False, True])
def test_lower_puts_the_cards_option_in_the_compiler_spec(monkeypatch, option, value):
    from executorch.backends.qualcomm.utils import utils

    seen = {}

    def spec(**options):
        seen.update(options)
        return ["spec"]

    monkeypatch.setattr(utils, "generate_qnn_executorch_compiler_spec", spec)
    monkeypatch.setattr(utils, "to_edge_transform_and_lower_to_qnn", lambda model, example, specs, **kw: specs)
    assert stages.lower({"forward": object()}, {"forward": ()}, "SM8650", "fp16", False, **{option: value}) == ["spec"]
    assert seen.pop(option) is value
    assert stages.lower({"prefill": object()}, {"prefill": ()}, "SM8650", "fp16", False, **{option: value}) == ["spec"]
    assert seen.pop(option) is value, "a multi-method card's option reaches its one compiler spec too"


def test_an_online_prepared_lowering_writes_and_reads_its_dlc_in_a_private_folder(monkeypatch, tmp_path):
    """QNN's IR backend writes forward.dlc to the working directory and executorch reads it back by that name
    (measured: a suite run left forward.dlc in the tree it ran from). Attack: a forward.dlc planted in the
    folder the suite runs from must be neither read into the program nor overwritten."""
    from executorch.backends.qualcomm.utils import utils

    planted = tmp_path / "forward.dlc"
    planted.write_text("planted")
    seen = []

    def lower_like_qnn_ir(model, example, specs, **kw):  # what the IR backend and IrContext do with the file
        folder = Path.cwd()
        Path("forward.dlc").write_text("composed")
        seen.append((folder, stat.S_IMODE(folder.stat().st_mode), Path("forward.dlc").read_text()))
        return specs

    monkeypatch.setattr(utils, "generate_qnn_executorch_compiler_spec", lambda **options: [options])
    monkeypatch.setattr(utils, "to_edge_transform_and_lower_to_qnn", lower_like_qnn_ir)
    monkeypatch.chdir(tmp_path)
    stages.lower({"forward": object()}, {"forward": ()}, "SM8650", "fp16", False, online_prepare=True)
    ((folder, mode, read),) = seen
    assert folder != tmp_path and mode == 0o700 and read == "composed"
    assert not folder.exists(), "the private folder goes with the lowering"
    assert planted.read_text() == "planted" and os.listdir(tmp_path) == ["forward.dlc"]
    assert Path.cwd() == tmp_path


@pytest.mark.qnn
def test_an_online_prepared_program_has_a_lowering_key_of_its_own(toolchain):
    card = next(card for card in CARDS if card.name == "online_prepare_counter")
    online = Case(card, "fp16", Mode.DELEGATE, "SM8650")
    offline = Case(dataclasses.replace(card, online_prepare=False), "fp16", Mode.DELEGATE, "SM8650")
    assert cache.key(online, 4, toolchain) != cache.key(offline, 4, toolchain)


ONLINE_TESTS = [
    "test_state[online_prepare_counter-fp16-delegate_mutbuf-SM8650]",
    "test_initial_state[online_prepare_kv_write-16a8w-skip_mutbuf-SM8750]",
    "test_address_sharing[online_prepare_kv_write-fp16-delegate_mutbuf-SM8650]",
]


@pytest.mark.parametrize(
    "name",
    [
        *ONLINE_TESTS,
        "test_state[kv_gather_written-fp16-delegate_mutbuf-SM8650]",  # the same shape, prepared offline
        "test_export[online_prepare_counter-fp16-delegate_mutbuf-SM8650]",
    ],
)
def test_no_test_expects_the_online_prepare_crash(name):
    """F19 is bridged (harness/qnn/system_bridge.c), not expected: where the bridge is on, the crash cannot
    happen, and where it is off and the crash happens anyway, it must be a failure someone reads. Neither the
    crash nor another one (a fault switch, a clean load error) is ever an expected failure."""
    expected = matching(name)
    for failure in (ONLINE_PREPARE_CRASH, FAULT_SWITCH_CRASH, CLEAN_LOAD_ERROR):
        assert decide(CheckFailure(failure, signature="not_run"), expected, name)[0] is Verdict.FAILED
