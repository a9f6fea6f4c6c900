"""Avro in the registry formats: fastavro's reader record by record, a vectorised path for flat records,
and the mapping of an Avro schema to one Arrow type (docs/usage/registry-formats.md lists it). Runs in
executors and on the driver: no deltalake import here."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa

from offsetlake.formats.arrays import one_array
from offsetlake.formats.native_avro import FlatDecoder
from offsetlake.formats.registry_client import UnusableSchema
from offsetlake.formats.schema_decoder import TIMESTAMP, SchemaDecoder


class AvroDecoder(SchemaDecoder):
    """fastavro's schemaless reader with the writer's schema, record by record; and for flat records (the
    usual event) a vectorised path: `decode_many` (see FlatAvro)."""

    kind_name = "Avro"

    def __init__(self, schema: dict | list | str, named: dict | None = None):
        import fastavro

        self._parsed = fastavro.parse_schema(plain_logical_types(schema), named_schemas=named)
        self.arrow_type = avro_to_arrow(self._parsed, set())
        self._read = fastavro.schemaless_reader
        self.batches = FlatAvro.of(self._parsed, self.arrow_type)

    def decode(self, payload: bytes) -> Any:
        return self._read(io.BytesIO(payload), self._parsed, None)


class FlatAvro:
    """Many Avro records of one flat schema decoded in one call: in C (`native_avro`), or by polars' Rust
    Avro reader where the C decoder is not sure or not built.

    The payloads are concatenated into one block of an in-memory Avro container file. A block has no
    record boundaries, so one payload with bytes too many or too few would shift every record after
    it; so the decoded values are checked against the payloads: each record's Avro encoding length,
    computed column by column from the values (varint sizes, string lengths, union indexes), must equal
    its payload's length. Starting aligned at the first record, equal lengths mean every record was
    read from exactly its own bytes. Anything else (a mismatch, a polars error, a non-canonical
    encoding) returns None and the caller decodes record by record with fastavro, which words errors.
    Flat: fields of primitive types, enums, `["null", T]` unions of those, date and timestamp logical
    types. Other schemas always take the per-record path.
    """

    MIN_RECORDS = 64  # below this the per-record path is as fast
    _PRIMITIVE = {"boolean", "int", "long", "float", "double", "string", "bytes"}

    def __init__(self, fields: list[tuple[str, Any, str | bool, str | None]], arrow_type: pa.DataType):
        import fastavro

        # (name, plain avro type, False or where the union puts null, logical type)
        self._fields, self.arrow_type = fields, arrow_type
        # A union keeps the writer's branch order: the index in the data is a position in it.
        plain = {
            "type": "record",
            "name": "Flat",
            "fields": [
                {"name": name, "type": _union(kind, str(nullable)) if nullable else kind}  # "null first"/"last"
                for name, kind, nullable, _ in fields
            ],
        }
        header = io.BytesIO()
        self._sync = b"offsetlake-flat!"  # 16 bytes, any value: the block ends with it
        fastavro.write.Writer(header, fastavro.parse_schema(plain), codec="null", sync_marker=self._sync).flush()
        self._header = header.getvalue()
        self._native = FlatDecoder.of(fields, _AVRO_PRIMITIVES)

    @staticmethod
    def of(parsed, arrow_type: pa.DataType) -> FlatAvro | None:
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            return None
        fields: list[tuple[str, Any, str | bool, str | None]] = []
        for f in parsed["fields"]:
            kind, logical = f["type"], None
            nullable: str | bool = False
            if isinstance(kind, list):
                branches = [b for b in kind if b != "null"]
                if len(kind) != 2 or len(branches) != 1:
                    return None
                kind, nullable = branches[0], "null first" if kind[0] == "null" else "null last"
            if isinstance(kind, dict):
                if kind.get("logicalType") in ("date", "timestamp-millis", "timestamp-micros"):
                    kind, logical = kind["type"], kind["logicalType"]
                elif kind.get("type") == "enum" and not kind.get("logicalType"):
                    kind = {"type": "enum", "name": kind["name"].rsplit(".", 1)[-1], "symbols": kind["symbols"]}
                else:
                    return None
            elif kind not in FlatAvro._PRIMITIVE:
                return None
            fields.append((f["name"], kind, nullable, logical))
        return FlatAvro(fields, arrow_type)

    def decode(self, payloads: list[bytes] | pa.BinaryArray) -> pa.Array | None:
        """The payloads as one StructArray of `arrow_type`, or None: record by record. In C where it is sure
        (native_avro), else by polars."""
        if self._native is not None and isinstance(payloads, pa.Array):
            columns = self._native.decode(payloads)
            if columns is not None:
                return self._struct(columns)
        return self.decode_by_polars(payloads)

    def decode_by_polars(self, payloads: list[bytes] | pa.BinaryArray) -> pa.Array | None:
        import polars

        body, lengths = _concatenated(payloads)
        counts = _zigzag_varint(len(lengths)) + _zigzag_varint(len(body))
        container = b"".join([self._header, counts, body, self._sync])  # the payloads copied once
        try:
            table = polars.read_avro(io.BytesIO(container)).to_arrow()
        except (Exception, polars.exceptions.PanicException):  # polars 2.1 panics on a nullable enum
            return None
        if table.num_rows != len(lengths):
            return None
        sizes = np.zeros(len(lengths), dtype=np.int64)
        columns = []
        for (_name, kind, nullable, _logical), column in zip(self._fields, table.columns):
            column = one_array(column)
            if isinstance(kind, dict):  # enum: polars gives a dictionary column
                column = column.cast(pa.string())
            sizes += _avro_sizes(column, kind, nullable)
            columns.append(column)
        if not np.array_equal(sizes, lengths):
            return None
        return self._struct(columns)

    def _struct(self, columns: list[pa.Array]) -> pa.StructArray:
        """Each field's column as decoded (Avro's plain types) in its table type."""
        targets = [_to_target(c, f[3], t.type) for c, f, t in zip(columns, self._fields, self.arrow_type)]
        return pa.StructArray.from_arrays(targets, fields=list(self.arrow_type))


def _concatenated(payloads: list[bytes] | pa.BinaryArray) -> tuple[bytes | memoryview, np.ndarray]:
    """(the payloads' bytes end to end, each payload's length); an Arrow array gives both without a
    Python object per payload, or a copy."""
    if not isinstance(payloads, pa.Array):
        return b"".join(payloads), np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)[
        payloads.offset : payloads.offset + len(payloads) + 1
    ]
    data = payloads.buffers()[2]
    body = memoryview(data)[int(offsets[0]) : int(offsets[-1])] if data is not None else b""
    return body, np.diff(offsets).astype(np.int64)


def _union(kind, nullable: str) -> list:
    return ["null", kind] if nullable == "null first" else [kind, "null"]


def _zigzag_varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_sizes(values) -> np.ndarray:
    """Bytes of each value's zigzag varint (Avro int and long)."""
    x = np.asarray(values, dtype=np.int64)
    z = ((x << 1) ^ (x >> 63)).astype(np.uint64)
    n = np.ones(len(z), dtype=np.int64)
    for k in range(1, 10):
        n += z >= (np.uint64(1) << np.uint64(7 * k))
    return n


def _avro_sizes(column: pa.Array, kind, nullable: str | bool) -> np.ndarray:
    """Each value's Avro binary encoding length."""
    import pyarrow.compute as pc

    if isinstance(kind, dict):
        index = pc.index_in(column, value_set=pa.array(kind["symbols"])).fill_null(0)
        sizes = _varint_sizes(index.to_numpy(zero_copy_only=False))
    elif kind in ("string", "bytes"):
        lengths = pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        sizes = _varint_sizes(lengths) + lengths
    elif kind in ("int", "long"):
        sizes = _varint_sizes(column.fill_null(0).to_numpy(zero_copy_only=False))
    else:
        sizes = np.full(len(column), {"boolean": 1, "float": 4, "double": 8}[kind], dtype=np.int64)
    if nullable:  # the union's branch index (0 or 1: one byte), then the value when not null
        sizes = np.where(column.is_valid().to_numpy(zero_copy_only=False), sizes, 0) + 1
    return sizes


def _to_target(column: pa.Array, logical: str | None, target: pa.DataType) -> pa.Array:
    """polars' column (large strings; dates and times read as their plain ints) as the mapped Arrow type."""
    if logical in ("timestamp-millis", "timestamp-micros"):
        unit = "ms" if logical == "timestamp-millis" else "us"
        return column.cast(pa.int64()).cast(pa.timestamp(unit, tz="UTC")).cast(target)
    if logical == "date":
        return column.cast(pa.int32()).cast(pa.date32())
    return column.cast(target)


# Logical types that become their own Arrow type; every other logical type (uuid, time-*, local-timestamp-*,
# duration) is read as its underlying Avro type, so fastavro hands us a value Arrow takes as is.
_AVRO_LOGICAL = {"date", "timestamp-millis", "timestamp-micros", "decimal"}


def plain_logical_types(schema):
    if isinstance(schema, dict):
        out = {k: plain_logical_types(v) for k, v in schema.items()}
        if out.get("logicalType") not in (None, *_AVRO_LOGICAL):
            out.pop("logicalType")
        return out
    if isinstance(schema, list):
        return [plain_logical_types(s) for s in schema]
    return schema


_AVRO_PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def avro_to_arrow(schema, seen: set[str], defined: dict[str, pa.DataType] | None = None) -> pa.DataType:
    """The Arrow type of a parsed Avro schema. Every column is nullable (a newer schema may drop a field).
    `defined`: the named types met so far, by full name: a later field may name one (Debezium's envelope
    types `after` as the `Value` record `before` defines); one that names itself is recursive."""
    defined = {} if defined is None else defined
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema]
        if schema in defined and schema not in seen:
            return defined[schema]
        raise UnusableSchema(f"Avro type {schema!r} is recursive or unknown, which a Delta table cannot hold")
    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) != 1:
            raise UnusableSchema(
                f"Avro union {_avro_name(schema)} has several non-null branches, which a Delta "
                f'column cannot hold (only ["null", T] unions are supported)'
            )
        return avro_to_arrow(branches[0], seen, defined)
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "date":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros"):
        return TIMESTAMP
    if logical == "decimal":
        precision, scale = schema["precision"], schema.get("scale", 0)
        if precision > 38:
            raise UnusableSchema(f"Avro decimal({precision}, {scale}) is wider than Delta's 38 digits")
        return pa.decimal128(precision, scale)
    if kind == "record":
        name = schema.get("name")
        if name in seen:
            raise UnusableSchema(f"Avro record {name!r} is recursive, which a Delta table cannot hold")
        inner = seen | {name}
        defined[name] = record = pa.struct(
            [pa.field(f["name"], avro_to_arrow(f["type"], inner, defined)) for f in schema["fields"]]
        )
        return record
    if kind in ("enum", "fixed"):
        defined[schema.get("name")] = named = pa.string() if kind == "enum" else pa.binary()
        return named
    if kind == "array":
        return pa.list_(avro_to_arrow(schema["items"], seen, defined))
    if kind == "map":
        return pa.map_(pa.string(), avro_to_arrow(schema["values"], seen, defined))
    return avro_to_arrow(kind, seen, defined)


def _avro_name(schema) -> str:
    return json.dumps([s if isinstance(s, str) else s.get("name", s.get("type")) for s in schema])
