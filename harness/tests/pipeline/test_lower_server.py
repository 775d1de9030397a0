"""The lowering server (harness/process/services.py LOWERING) against a fresh lower_job, on real lowerings.

A case lowered in a forked child of the server must be the case lowered in a fresh Python: the same
program bytes and the same facts. A crash in one child fails that case and not the server, and with no
server to talk to lowering still works, the slow way.
"""

from __future__ import annotations

import dataclasses

import pytest

from fixtures import zoo  # noqa: F401  (registers the cards)
from harness.pipeline import card as cards
from harness.pipeline.facts import LoweringFacts
from harness.pipeline.lower import lower_case
from harness.process import fork_server
from harness.process.services import LOWERING
from harness.tests import broken_cards
from harness.vocabulary import Case, Mode

pytestmark = pytest.mark.qnn
STEPS = 4
# executorch's QNN context header: this magic, then an 8-byte signature (a time stamp) that differs between
# any two lowerings (measured: two fresh processes' programs differ in exactly these bytes).
QNN_CONTEXT_MAGIC = (0x5678ABCD).to_bytes(4, "little")
SIGNATURE_BYTES = 8


@pytest.fixture(scope="module")
def server(toolchain, tmp_path_factory):
    socket_path = tmp_path_factory.mktemp("lowering") / "lower.sock"
    process = fork_server.spawn_server(LOWERING, socket_path, toolchain.child_env())
    fork_server.wait_until_serving(process, socket_path)
    yield socket_path
    fork_server.stop_server(process)
    assert not socket_path.exists(), "a stopped server removes its socket"


def _comparable(facts: LoweringFacts) -> LoweringFacts:
    """Facts less what differs between any two lowerings: times, and the program's hash (its QNN context
    signature is a time stamp; the bytes are compared below with it masked)."""
    program = dataclasses.replace(facts.program, sha256="") if facts.program else None
    return dataclasses.replace(facts, timings_s={}, program=program)


def _without_signatures(program: bytes) -> bytes:
    masked, start = bytearray(program), 0
    while (found := program.find(QNN_CONTEXT_MAGIC, start)) >= 0:
        start = found + len(QNN_CONTEXT_MAGIC)
        masked[start : start + SIGNATURE_BYTES] = bytes(SIGNATURE_BYTES)
    return bytes(masked)


@pytest.mark.parametrize("dtype", ["fp16", "16a8w"])
def test_served_lowering_is_a_fresh_lowering(server, toolchain, tmp_path, dtype):
    case = Case(cards.find("fixtures.zoo:kv_index_copy_dim1"), dtype, Mode.DELEGATE, "SM8650")
    fresh = lower_case(case, toolchain, tmp_path / "fresh", STEPS, server=tmp_path / "nobody-listens.sock")
    served = lower_case(case, toolchain, tmp_path / "served", STEPS, server=server)
    assert fresh.ok and served.ok, (fresh.failure, served.failure)
    assert QNN_CONTEXT_MAGIC in fresh.pte.read_bytes()
    assert _without_signatures(served.pte.read_bytes()) == _without_signatures(fresh.pte.read_bytes()), (
        "one program, however it was lowered"
    )
    assert _comparable(served.facts) == _comparable(fresh.facts)
    assert served.qnn_errors == fresh.qnn_errors == []


def test_a_crashing_lowering_fails_its_case_and_not_the_server(server, toolchain, tmp_path):
    crashed = lower_case(
        Case(broken_cards.CRASHING, "fp16", Mode.DELEGATE, "SM8650"),
        toolchain,
        tmp_path / "crash",
        STEPS,
        server=server,
    )
    assert not crashed.ok
    assert crashed.failure.startswith("lowering failed: LoweringCrashed: lowering process exited 139 without facts")
    after = lower_case(
        Case(cards.find("fixtures.zoo:counter_add"), "fp16", Mode.DELEGATE, "SM8650"),
        toolchain,
        tmp_path / "after",
        STEPS,
        server=server,
    )
    assert after.ok, after.failure
