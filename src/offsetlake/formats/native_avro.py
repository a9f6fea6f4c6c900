"""Flat Avro records into Arrow columns in C (`flat_avro.c`), before polars' Avro reader.

`avro.FlatAvro` asks this first: the payloads are decoded where they lie, field by field, into columns of
Avro's plain types (as avro.py maps them; an enum as its symbol), and None comes back wherever polars or fastavro
might read a payload differently (the C source lists where). `tests/unit/test_native_avro.py` checks it
against polars and fastavro on the same payloads. Without the formats' C library (`native`) polars decodes
every group, as before.
"""

from __future__ import annotations

import ctypes
import threading

import pyarrow as pa

from offsetlake.formats import native

_KINDS = {"boolean": 1, "int": 2, "long": 3, "float": 4, "double": 5, "string": 6, "bytes": 7}
_ENUM = 8
_NULLABLE = {False: 0, "null first": 1, "null last": 2}


class FlatDecoder:
    """The C decoder of one flat schema: `fields` as avro.FlatAvro holds them (name, plain Avro type or enum
    schema, where a union puts null or False, logical type); `plain_types`: each plain Avro type's Arrow
    type."""

    def __init__(self, lib: ctypes.CDLL, fields: list[tuple], plain_types: dict[str, pa.DataType]):
        n = len(fields)
        kinds = (ctypes.c_int32 * n)(*(_ENUM if isinstance(k, dict) else _KINDS[k] for _, k, _, _ in fields))
        nullables = (ctypes.c_int32 * n)(*(_NULLABLE[nullable] for _, _, nullable, _ in fields))
        symbols = (ctypes.c_int32 * n)(*(len(k["symbols"]) if isinstance(k, dict) else 0 for _, k, _, _ in fields))
        self._handle = lib.ol_avro_parser(kinds, nullables, symbols, n)
        if not self._handle:
            raise MemoryError("the native Avro decoder could not be made")
        self._lib, self._fields, self._plain_types = lib, fields, plain_types
        self._lock = threading.Lock()  # a decode keeps its columns inside until they are copied out

    @staticmethod
    def of(fields: list[tuple], plain_types: dict[str, pa.DataType]) -> FlatDecoder | None:
        lib = native.library()
        return None if lib is None else FlatDecoder(lib, fields, plain_types)

    def decode(self, payloads: pa.Array) -> list[pa.Array] | None:
        """One column a field, of its plain type (an enum as its symbols' strings); None: ask polars."""
        buffers = native.value_buffers(payloads)
        if buffers is None:
            return None
        with self._lock:
            if not native.answered(self._lib.ol_avro_parse(self._handle, *buffers, len(payloads)), "Avro decoder"):
                return None
            return [self._column(i, kind) for i, (_, kind, _, _) in enumerate(self._fields)]

    def _column(self, index: int, kind) -> pa.Array:
        column = native.Column()
        self._lib.ol_avro_column(self._handle, index, column)
        n, nulls, validity = int(column.length), int(column.null_count), column.validity_buffer()
        if isinstance(kind, dict):
            indexes = pa.Array.from_buffers(pa.int32(), n, [validity, column.values_buffer()], null_count=nulls)
            return pa.DictionaryArray.from_arrays(indexes, pa.array(kind["symbols"], pa.string())).cast(pa.string())
        buffers = [validity, column.values_buffer()]
        if kind in ("string", "bytes"):
            buffers.append(column.data_buffer())
        return pa.Array.from_buffers(self._plain_types[kind], n, buffers, null_count=nulls)

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.ol_avro_parser_free(handle)
