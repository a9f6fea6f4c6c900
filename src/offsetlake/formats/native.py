"""The formats' C library: `json_columns.c` (JSON objects) and `flat_avro.c` (flat Avro records) decode a
chunk of values straight into Arrow columns, before Arrow's JSON reader and polars' Avro reader.

It is built with the machine's C compiler alone, at `make install` or on first use (`c_libraries`). Without
a compiler, or with `OFFSETLAKE_NATIVE_FORMATS=0`, every chunk goes to Arrow's and polars' readers, with
the same results and slower. `native_json` and `native_avro` drive it.

    python -m offsetlake.formats.native    # build it now; prints its path or why it cannot be built
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from pathlib import Path

import pyarrow as pa

from offsetlake import c_libraries

log = logging.getLogger("offsetlake.formats.native")

HERE = Path(__file__).parent
SOURCES = [HERE / "arrow_buffers.h", HERE / "json_columns.c", HERE / "flat_avro.c"]
ENABLED_ENV = "OFFSETLAKE_NATIVE_FORMATS"
OK, GIVE_UP = 0, 1


def answered(done: int, what: str) -> bool:
    """Whether a decode (`ol_json_parse`, `ol_avro_parse`) answered; False: it gave up. Out of memory raises."""
    if done not in (OK, GIVE_UP):
        raise MemoryError(f"the native {what} ran out of memory")
    return done == OK


class Column(ctypes.Structure):
    """arrow_buffers.h's ol_column: one column's buffers after a parse."""

    _fields_ = [
        ("length", ctypes.c_int64),
        ("null_count", ctypes.c_int64),
        ("validity", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("data", ctypes.c_void_p),
        ("validity_len", ctypes.c_int64),
        ("values_len", ctypes.c_int64),
        ("data_len", ctypes.c_int64),
    ]

    def validity_buffer(self) -> pa.Buffer | None:
        return copy(self.validity, self.validity_len) if self.null_count else None

    def values_buffer(self) -> pa.Buffer:
        return copy(self.values, self.values_len)

    def data_buffer(self) -> pa.Buffer:
        return copy(self.data, self.data_len)


def build() -> Path:
    """Build the library unless it is there; its path. Raises c_libraries.NativeUnavailable."""
    return c_libraries.build(SOURCES, "formats", [], ["-lm"])


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (logged once, with the reason)."""
    if os.environ.get(ENABLED_ENV, "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (c_libraries.NativeUnavailable, OSError) as err:
        log.warning("the formats' C decoders are not available (%s); Arrow's and polars' readers decode", err)
        return None
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    ints = ctypes.POINTER(i32)
    signatures = {
        "ol_json_parser": ([ints, ints, ctypes.POINTER(ctypes.c_char_p), ints, i32], p),
        "ol_json_parser_free": ([p], None),
        "ol_json_parse": ([p, p, p, i64], ctypes.c_int),
        "ol_json_column": ([p, i32, ctypes.POINTER(Column)], ctypes.c_int),
        "ol_avro_parser": ([ints, ints, ints, i32], p),
        "ol_avro_parser_free": ([p], None),
        "ol_avro_parse": ([p, p, p, i64], ctypes.c_int),
        "ol_avro_column": ([p, i32, ctypes.POINTER(Column)], ctypes.c_int),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def value_buffers(values: pa.Array) -> tuple[int, int] | None:
    """(address of the first value's offset, address of the data) of a binary or string array without
    nulls; None for any other array."""
    if values.null_count or values.type not in (pa.binary(), pa.string()):
        return None
    _, offsets, data = values.buffers()
    return offsets.address + 4 * values.offset, data.address if data is not None else 0


def copy(address: int | None, size: int) -> pa.Buffer:
    """A C buffer copied into one of Arrow's pool (the decoders reuse their own for the next call)."""
    buffer = pa.allocate_buffer(max(int(size), 1))
    if size and address:
        ctypes.memmove(buffer.address, address, int(size))
    return buffer


if __name__ == "__main__":
    try:
        print(build())
    except c_libraries.NativeUnavailable as err:
        print(f"the formats' C decoders cannot be built here: {err}", file=sys.stderr)
        sys.exit(1)
