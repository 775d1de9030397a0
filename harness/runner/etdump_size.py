"""How large executorch's parser would make an ETDump, found before it parses it (--profile-level).

The devtools Inspector turns an ETDump (a flatbuffer) into JSON with flatc in a temporary folder, then into
Python objects. A flatbuffer may point many times at one table, string or vector, and each pointer becomes a
copy: measured, a 68-140 KB hostile ETDump expanded to 115 MB-1.2 GB of temporary JSON (a worker's RSS 728
MB). So the ETDump is walked first, here, along executorch 1.5's schema (executorch/devtools/etdump/
etdump_schema_flatcc.fbs), counting what each node costs as flatc would print it, once per distinct node;
one over the bound is refused in one line before anything is expanded or written.
"""

from __future__ import annotations

import struct
from functools import cache

# A table's slots this walk follows: slot -> (kind, what). kind: "table" (one child table of type what),
# "tables" (a vector of them), "string", "scalars" (a vector of numbers of what bytes each). The other slots
# are scalars, counted in the table's own cost.
SCHEMA: dict[str, dict[int, tuple[str, object]]] = {
    "ETDump": {1: ("tables", "RunData")},
    "RunData": {0: ("string", None), 2: ("tables", "Allocator"), 3: ("tables", "Event")},
    "Allocator": {0: ("string", None)},
    "Event": {0: ("table", "ProfileEvent"), 1: ("table", "AllocationEvent"), 2: ("table", "DebugEvent")},
    "ProfileEvent": {0: ("string", None), 4: ("string", None), 5: ("scalars", 1)},
    "AllocationEvent": {},
    "DebugEvent": {2: ("table", "Value"), 4: ("string", None), 5: ("string", None)},
    "Value": {
        1: ("table", "Tensor"),
        2: ("table", "TensorList"),
        3: ("table", "Int"),
        4: ("table", "Float"),
        5: ("table", "Double"),
        6: ("table", "Bool"),
        7: ("table", "Bool"),
    },
    "Tensor": {1: ("scalars", 8), 2: ("scalars", 8)},
    "TensorList": {0: ("tables", "Tensor")},
    "Int": {},
    "Float": {},
    "Double": {},
    "Bool": {},
}
# JSON bytes as flatc --json --defaults-json prints them, rounded up: a table with its scalar fields, a string
# character (\u00XX at worst), a number of a vector.
TABLE_BYTES, CHARACTER_BYTES, NUMBER_BYTES = 256, 6, 24


class MalformedEtdump(ValueError):
    """An offset outside the file: not an ETDump."""


def expanded_bytes(data: bytes, limit: int) -> int:
    """About how many bytes of JSON executorch's parser makes of data (a size-prefixed ETDump); stops
    counting, returning more than limit, as soon as that is certain. MalformedEtdump for a broken file."""
    walk = _Walk(data, limit)
    return walk.table(_offset(data, 4), "ETDump")


class _Walk:
    def __init__(self, data: bytes, limit: int) -> None:
        self.data, self.limit = data, limit
        self.table = cache(self._table)  # by position and type: a node pointed at many times is walked once

    def _table(self, position: int, kind: str) -> int:
        data, total = self.data, TABLE_BYTES
        vtable = position - _signed(data, position)
        for slot, (shape, what) in SCHEMA[kind].items():
            field = _field(data, position, vtable, slot)
            if field is None:
                continue
            target = _offset(data, field)
            if shape == "table":
                total += self.table(target, what)
            elif shape == "string":
                total += CHARACTER_BYTES * _length(data, target, 1)
            elif shape == "scalars":
                total += NUMBER_BYTES * _length(data, target, what)
            else:
                for index in range(_length(data, target, 4)):
                    total += self.table(_offset(data, target + 4 + 4 * index), what)
                    if total > self.limit:
                        return total
            if total > self.limit:
                return total
        return total


def _unpack(form: str, data: bytes, at: int) -> int:
    if at < 0 or at + struct.calcsize(form) > len(data):
        raise MalformedEtdump(f"an offset ({at}) outside the file's {len(data)} bytes")
    return struct.unpack_from(form, data, at)[0]


def _signed(data: bytes, at: int) -> int:
    return _unpack("<i", data, at)


def _offset(data: bytes, at: int) -> int:
    """Where the unsigned offset at `at` points (always forward: a flatbuffer's nodes form no cycle)."""
    return at + _unpack("<I", data, at)


def _field(data: bytes, table: int, vtable: int, slot: int) -> int | None:
    """Where a table's field is, None when the table leaves it out."""
    entry = 4 + 2 * slot
    if entry + 2 > _unpack("<H", data, vtable):
        return None
    relative = _unpack("<H", data, vtable + entry)
    return table + relative if relative else None


def _length(data: bytes, vector: int, element_bytes: int) -> int:
    """A vector's (or string's) length, once its elements are known to lie inside the file."""
    count = _unpack("<I", data, vector)
    if vector + 4 + count * element_bytes > len(data):
        raise MalformedEtdump(f"a vector of {count} elements past the file's {len(data)} bytes")
    return count
