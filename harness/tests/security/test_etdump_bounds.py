"""A profiled run's ETDump (--profile-level detailed) read as data a device wrote: its cost is bounded
before executorch's parser expands it."""

from __future__ import annotations

import os
import struct
import tempfile
import time
from pathlib import Path

import flatbuffers
import pytest

from harness.runner import etdump_size
from harness.runner.profile import EXPANDED_MAX_BYTES, ProfileError, bounded_etdump, read_etdump


def _repeated(builder: flatbuffers.Builder, offset: int, count: int) -> int:
    """A vector of `count` offsets, all to one node."""
    builder.StartVector(4, count, 4)
    for _ in range(count):
        builder.PrependUOffsetTRelative(offset)
    return builder.EndVector()


def _table(builder: flatbuffers.Builder, slots: int, children: dict[int, int]) -> int:
    builder.StartObject(slots)
    for slot, child in children.items():
        builder.PrependUOffsetTRelativeSlot(slot, child, 0)
    return builder.EndObject()


def _hostile(copies: int = 30000, runs: int = 10, name_bytes: int = 1000) -> bytes:
    """One profile event with a long name, pointed at `copies` times from one events vector, which `runs`
    run_data entries all point at: 121 KB that flatc prints as a copy per pointer (over a GB of JSON)."""
    builder = flatbuffers.Builder(0)
    profile_event = _table(builder, 8, {0: builder.CreateString("x" * name_bytes)})
    event = _table(builder, 3, {0: profile_event})
    run = _table(builder, 4, {3: _repeated(builder, event, copies)})
    root = _table(builder, 2, {1: _repeated(builder, run, runs)})
    builder.FinishSizePrefixed(root, b"ED00")
    return bytes(builder.Output())


def _legit(steps: int, ops: int) -> bytes:
    """An ETDump as executorch serializes one (size-prefixed, as the runner's flatcc writes it)."""
    from executorch.devtools.etdump import schema_flatcc as schema
    from executorch.devtools.etdump.serialize import serialize_to_etdump_flatcc

    events = [
        schema.Event(
            schema.ProfileEvent(f"op_{op} (cycles)", 0, -1, op, None, None, step * 1000 + op, step * 1000 + op + 5),
            None,
            None,
        )
        for step in range(steps)
        for op in range(ops)
    ]
    data = serialize_to_etdump_flatcc(schema.ETDumpFlatCC(0, [schema.RunData("run", -1, [], events)]))
    return struct.pack("<I", len(data)) + data


def test_a_hostile_etdump_is_refused_before_anything_expands(tmp_path, monkeypatch):
    """The attack: 121 KB that executorch's parser writes out as over a GB of temporary JSON and reads back
    (measured before: 115 MB-1.2 GB, a worker at 728 MB RSS). Now refused in one line, in well under a
    second, with nothing written to the temporary folder."""
    data = _hostile()
    assert len(data) < 140 * 1024
    path = tmp_path / "profile.etdp"
    path.write_bytes(data)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    started = time.monotonic()
    with pytest.raises(ProfileError, match=r"would expand to more than 64 MB .*refused unparsed") as refused:
        read_etdump(path, 8)
    assert time.monotonic() - started < 5 and "\n" not in str(refused.value)
    assert not list(scratch.iterdir()), "nothing expanded into the temporary folder"


def test_the_count_is_above_what_flatc_prints_and_a_real_sized_profile_passes(tmp_path):
    """The bound counts no less than the JSON flatc makes (so the refusal holds), and a profile of a real
    run's size (8 steps of 50 events) is read as before."""
    from executorch.devtools.etdump.serialize import _convert_from_flatcc

    for data in (_legit(8, 50), _hostile(200, 2, 50)):
        assert etdump_size.expanded_bytes(data, 1 << 40) >= len(_convert_from_flatcc(data))
    path = tmp_path / "profile.etdp"
    path.write_bytes(_legit(8, 50))
    assert bounded_etdump(path) == path.read_bytes()
    assert etdump_size.expanded_bytes(_legit(8, 50), 1 << 40) < EXPANDED_MAX_BYTES


def test_an_offset_outside_the_file_or_a_fifo_is_one_line(tmp_path):
    broken = tmp_path / "broken.etdp"
    broken.write_bytes(_hostile(10, 1, 10)[:-40])
    with pytest.raises(ProfileError, match="broken.etdp: not an ETDump"):
        bounded_etdump(broken)
    fifo = tmp_path / "fifo.etdp"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="fifo.etdp: not a regular file"):
        bounded_etdump(fifo)
    big = tmp_path / "big.etdp"
    with big.open("wb") as file:
        file.truncate(9 << 20)
    with pytest.raises(ProfileError, match="big.etdp: more than 8 MB"):
        bounded_etdump(big)


def test_the_refusal_is_the_profile_s_failure_not_the_worker_s():
    """case_store records a ProfileError as the profiled run's note (outcome.profile_note) and goes on."""
    source = (Path(__file__).resolve().parents[2] / "case_store.py").read_text()
    assert "except ProfileError as error:" in source
    assert 'outcome.profile_note = f"--profile-level: {error}"' in source
