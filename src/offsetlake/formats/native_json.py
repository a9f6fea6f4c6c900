"""JSON objects into Arrow columns in C (`json_columns.c`), before Arrow's JSON reader.

`arrow_json` asks this first. It reads each value where it lies (no newline-delimited copy of the values),
for a plan of structs, lists, strings, int64, int32, double, boolean and timestamps (`TIMESTAMP`: a string
field read as Arrow's cast to timestamps reads it), and gives up (None) wherever Arrow's reader, and so the
reference parser behind it, might read a value differently: the C source lists where. What it answers
equals Arrow's reader column for column; `tests/unit/test_native_json.py` checks the two on the same
values. Without the formats' C library (`native`), every chunk goes to Arrow's reader, as before.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
from collections.abc import Iterator

import pyarrow as pa

from offsetlake.formats import native

_STRUCT, _LIST, _STRING, _INT64, _INT32, _DOUBLE, _BOOL, _TIMESTAMP = range(1, 9)
TIMESTAMP = pa.timestamp("us", tz="UTC")  # a string read as Arrow's cast reads it (json_columns.c says which)
_SCALARS = {
    pa.string(): _STRING,
    pa.int64(): _INT64,
    pa.int32(): _INT32,
    pa.float64(): _DOUBLE,
    pa.bool_(): _BOOL,
    TIMESTAMP: _TIMESTAMP,
}


def read_objects(values: pa.Array, parsed_as: pa.Schema) -> pa.Table | None:
    """`values` (binary or string, no nulls, each one JSON object) as a table of `parsed_as`'s fields and
    types, undeclared fields left out; None: ask Arrow's reader."""
    lib, plan, buffers = native.library(), _plan(parsed_as), native.value_buffers(values)
    if lib is None or plan is None or buffers is None:
        return None
    parser = _Parser.take(lib, parsed_as, plan)
    try:
        return parser.parse(buffers, len(values))
    finally:
        parser.give_back()


@functools.lru_cache(maxsize=64)
def _plan(parsed_as: pa.Schema) -> tuple[tuple[int, int, bytes], ...] | None:
    """The parser's plan, preorder (kind, child count, name), rooted in a struct; None: a type it lacks."""
    nodes: list[tuple[int, int, bytes]] = [(_STRUCT, len(parsed_as), b"")]

    def add(name: str, type_: pa.DataType) -> bool:
        if pa.types.is_struct(type_):
            nodes.append((_STRUCT, type_.num_fields, name.encode()))
            return all(add(type_.field(i).name, type_.field(i).type) for i in range(type_.num_fields))
        if pa.types.is_list(type_):
            nodes.append((_LIST, 1, name.encode()))
            return add("", type_.value_type)
        if type_ in _SCALARS:
            nodes.append((_SCALARS[type_], 0, name.encode()))
            return True
        return False

    return tuple(nodes) if all(add(f.name, f.type) for f in parsed_as) else None


class _Parser:
    """One C parser of a plan; each is used by one thread at a time (a parse keeps its columns inside)."""

    _idle: dict[pa.Schema, list[_Parser]] = {}
    _lock = threading.Lock()

    def __init__(self, lib: ctypes.CDLL, parsed_as: pa.Schema, plan: tuple[tuple[int, int, bytes], ...]):
        n = len(plan)
        kinds = (ctypes.c_int32 * n)(*(k for k, _, _ in plan))
        counts = (ctypes.c_int32 * n)(*(c for _, c, _ in plan))
        names = (ctypes.c_char_p * n)(*(name for _, _, name in plan))
        lengths = (ctypes.c_int32 * n)(*(len(name) for _, _, name in plan))
        self._names = names  # the C parser points into them
        self._handle = lib.ol_json_parser(kinds, counts, names, lengths, n)
        if not self._handle:
            raise MemoryError("the native JSON parser could not be made")
        self._lib, self._schema = lib, parsed_as

    @classmethod
    def take(cls, lib: ctypes.CDLL, parsed_as: pa.Schema, plan: tuple[tuple[int, int, bytes], ...]) -> _Parser:
        with cls._lock:
            idle = cls._idle.setdefault(parsed_as, [])
            if idle:
                return idle.pop()
        return cls(lib, parsed_as, plan)

    def give_back(self) -> None:
        with self._lock:
            self._idle[self._schema].append(self)

    def parse(self, buffers: tuple[int, int], count: int) -> pa.Table | None:
        if not native.answered(self._lib.ol_json_parse(self._handle, *buffers, count), "JSON parser"):
            return None
        preorder = itertools.count(1)  # the plan's nodes in order, the root (0) left out
        columns = [self._array(f.type, preorder) for f in self._schema]
        return pa.Table.from_arrays(columns, schema=self._schema)

    def _array(self, type_: pa.DataType, preorder: Iterator[int]) -> pa.Array:
        column = native.Column()
        self._lib.ol_json_column(self._handle, next(preorder), column)
        n, nulls, validity = int(column.length), int(column.null_count), column.validity_buffer()
        if pa.types.is_struct(type_):
            children = [self._array(type_.field(i).type, preorder) for i in range(type_.num_fields)]
            return pa.StructArray.from_buffers(type_, n, [validity], null_count=nulls, children=children)
        if pa.types.is_list(type_):
            offsets = column.values_buffer()
            item = self._array(type_.value_type, preorder)
            return pa.ListArray.from_buffers(type_, n, [validity, offsets], null_count=nulls, children=[item])
        buffers = [validity, column.values_buffer()]
        if type_ == pa.string():
            buffers.append(column.data_buffer())
        return pa.Array.from_buffers(type_, n, buffers, null_count=nulls)
