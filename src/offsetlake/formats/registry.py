"""Schema Registry formats: Avro, Protobuf and JSON Schema in the Confluent wire format.

A value (or key) in the wire format is a magic byte, a schema id (4 bytes; or a
16-byte GUID after magic byte 1) and the payload; Protobuf adds the index path of
the message type. confluent-kafka's Schema Registry client does the HTTP (its
cache holds each schema once per process, so once per Spark worker) and parses
the framing (`SchemaId`); fastavro and protobuf decode the payloads.

Each schema maps to one Arrow type (`SchemaDecoder.arrow_type`, docs/usage/registry-formats.md
lists the mapping) and decodes a payload into the Python value of that type, so
a batch becomes Arrow in one `pa.array` call per schema type. Two kinds of failure,
kept apart on purpose:
- `RegistryError`: the registry is unreachable or refuses us. Not bad data: the
  batch fails with one line naming the registry and nothing is committed.
- `UnusableSchema`: an unknown schema id, or a construct a Delta table cannot hold
  (a union of several types, a recursive message). The records that use it are
  quarantined with this reason; the batch goes on.
Runs in executors and on the driver: no deltalake import here.
"""

from __future__ import annotations

import functools
import io
import json
from typing import Any

import numpy as np
import pyarrow as pa

from offsetlake.config import RegistrySettings
from offsetlake.formats.registry_client import Registry, UnusableSchema, registry_for
from offsetlake.formats.schema_decoder import TIMESTAMP, SchemaDecoder

# ---- the wire format ----------------------------------------------------------------------------


def split_frame(data: bytes | None, schema_type: str):
    """(schema id, GUID, message indexes, payload) of a wire-format value; ValueError when it is not one."""
    from confluent_kafka.schema_registry.serde import SchemaId

    if data is None:
        raise ValueError("value is null (tombstone)")
    if len(data) < 5 or data[0] not in (0, 1):
        raise ValueError("value is not in the Schema Registry wire format (magic byte 0 and a 4-byte schema id)")
    frame = SchemaId(schema_type)
    try:
        rest = frame.from_bytes(io.BytesIO(data))
    except Exception as err:
        raise ValueError(f"value is not in the Schema Registry wire format: {err}") from err
    return frame.id, frame.guid, tuple(frame.message_indexes or ()), rest.read()


class AvroDecoder(SchemaDecoder):
    """fastavro's schemaless reader with the writer's schema, record by record; and for flat records (the
    usual event) a vectorised path: `decode_many` (see FlatAvro)."""

    kind_name = "Avro"

    def __init__(self, schema: dict | list | str, named: dict | None = None):
        import fastavro

        self._parsed = fastavro.parse_schema(_plain_logical_types(schema), named_schemas=named)
        self.arrow_type = avro_to_arrow(self._parsed, set())
        self._read = fastavro.schemaless_reader
        self._flat = FlatAvro.of(self._parsed, self.arrow_type)

    def decode(self, payload: bytes) -> Any:
        return self._read(io.BytesIO(payload), self._parsed, None)

    def decode_many(self, payloads: list[bytes] | pa.BinaryArray) -> pa.Array | None:
        """All payloads at once as a StructArray of `arrow_type`, or None: decode them one by one."""
        return self._flat.decode(payloads) if self._flat is not None and len(payloads) >= FlatAvro.MIN_RECORDS else None


class FlatAvro:
    """Many Avro records of one flat schema decoded in one call, by polars' Rust Avro reader.

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
        import polars

        body, lengths = _concatenated(payloads)
        container = self._header + _zigzag_varint(len(lengths)) + _zigzag_varint(len(body)) + body + self._sync
        try:
            table = polars.read_avro(io.BytesIO(container)).to_arrow()
        except Exception:
            return None
        if table.num_rows != len(lengths):
            return None
        sizes = np.zeros(len(lengths), dtype=np.int64)
        columns = []
        for (_name, kind, nullable, logical), column, target in zip(self._fields, table.columns, self.arrow_type):
            column = column.combine_chunks()
            if isinstance(kind, dict):  # enum: polars gives a dictionary column
                column = column.cast(pa.string())
            sizes += _avro_sizes(column, kind, nullable)
            columns.append(_to_target(column, logical, target.type))
        if not np.array_equal(sizes, lengths):
            return None
        return pa.StructArray.from_arrays(columns, fields=list(self.arrow_type))


def _concatenated(payloads: list[bytes] | pa.BinaryArray) -> tuple[bytes, np.ndarray]:
    """(the payloads' bytes end to end, each payload's length); an Arrow array gives both without a
    Python object per payload."""
    if not isinstance(payloads, pa.Array):
        return b"".join(payloads), np.fromiter(map(len, payloads), dtype=np.int64, count=len(payloads))
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)[
        payloads.offset : payloads.offset + len(payloads) + 1
    ]
    data = payloads.buffers()[2]
    body = data[int(offsets[0]) : int(offsets[-1])].to_pybytes() if data is not None else b""
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


def _plain_logical_types(schema):
    if isinstance(schema, dict):
        out = {k: _plain_logical_types(v) for k, v in schema.items()}
        if out.get("logicalType") not in (None, *_AVRO_LOGICAL):
            out.pop("logicalType")
        return out
    if isinstance(schema, list):
        return [_plain_logical_types(s) for s in schema]
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


# ---- building decoders from the registry, cached per process ------------------------------------


class Decoders:
    """The decoders one pipeline side (value or key) needs, built once per schema id in this process."""

    def __init__(self, kind: str, settings: RegistrySettings | None, schema_file: str | None = None, key: bool = False):
        self.kind = kind  # avro | protobuf | json_schema
        self.key = key
        self.settings = settings
        self._schema_type = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}[kind]
        self._file = (
            _labelled(_record(AvroDecoder(_schema_file(schema_file))), f"schema file {schema_file}")
            if schema_file
            else None
        )
        self._cache: dict[tuple, SchemaDecoder | UnusableSchema] = {}

    @staticmethod
    @functools.lru_cache(maxsize=16)
    def shared(
        kind: str, settings: RegistrySettings | None, schema_file: str | None = None, key: bool = False
    ) -> Decoders:
        """One per pipeline side per process (a Spark worker keeps its schemas from task to task)."""
        return Decoders(kind, settings, schema_file, key)

    def file_type(self) -> pa.DataType:
        """The record type of the schema file (format avro without a registry)."""
        assert self._file is not None, "a pipeline with a schema_file"
        return self._file.arrow_type

    def decoder(self, schema_id, guid, indexes: tuple) -> SchemaDecoder:
        """The decoder for a framed record; raises UnusableSchema (cached too) or RegistryError (not cached)."""
        key = (schema_id, guid, indexes)
        found = self._cache.get(key)
        if found is None:
            label = f"schema id {schema_id}" if guid is None else f"schema GUID {guid}"
            try:
                found = _labelled(self._build(schema_id, guid, indexes), label)
            except UnusableSchema as err:
                found = UnusableSchema(f"{label}: {err}")
            self._cache[key] = found
        if isinstance(found, UnusableSchema):
            raise found
        return found

    def split(self, data: bytes | None):
        """(decoder, payload) for one raw value that `framed_groups` did not read."""
        if self._file is not None:
            if data is None:
                raise ValueError("value is null (tombstone)")
            return self._file, data
        schema_id, guid, indexes, payload = split_frame(data, self._schema_type)
        return self.decoder(schema_id, guid, indexes), payload

    def framed_groups(self, values: pa.Array) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """The usual frame read for all values at once: ({schema id: positions}, positions of the others,
        which `split` reads one by one). Protobuf (message indexes follow the id) always goes one by one."""
        import pyarrow.compute as pc

        if self._file is not None or self.kind == "protobuf" or len(values) == 0:
            return {}, np.arange(len(values))
        usual = pc.and_(
            pc.greater_equal(pc.binary_length(values), 5),
            pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(b"\x00", pa.binary())),
        )
        usual = usual.fill_null(False).to_numpy(zero_copy_only=False)
        framed = np.nonzero(usual)[0]
        ids_bytes = pc.binary_slice(values.take(pa.array(framed)), 1, 5).cast(pa.binary(4))
        ids = np.frombuffer(ids_bytes.buffers()[1], dtype=">u4")[ids_bytes.offset : ids_bytes.offset + len(framed)]
        groups = {int(i): framed[ids == i] for i in np.unique(ids)}
        return groups, np.nonzero(~usual)[0]

    def _build(self, schema_id, guid, indexes: tuple) -> SchemaDecoder:
        registry = registry_for(self.settings)
        if self.kind == "protobuf":
            from offsetlake.formats.protobuf import fetch_schema

            schema = fetch_schema(lambda fmt: registry.schema_by_id(schema_id, guid, fmt=fmt))
        else:
            schema = registry.schema_by_id(schema_id, guid)
        return decoder_for(registry, self.kind, schema, indexes, record=not self.key)


def _schema_file(path: str):
    from offsetlake.errors import ConfigError

    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"format.schema_file {path}: {err}") from err


class _Record(SchemaDecoder):
    """A schema that is not a record (an Avro "string", a JSON Schema array) becomes one column, `value`."""

    def __init__(self, inner: SchemaDecoder):
        self._inner = inner
        self.kind_name = inner.kind_name
        self.arrow_type = pa.struct([pa.field("value", inner.arrow_type)])

    def decode(self, payload: bytes) -> Any:
        return {"value": self._inner.decode(payload)}


def _labelled(decoder: SchemaDecoder, label: str) -> SchemaDecoder:
    decoder.label = label  # names the schema in quarantine reasons
    return decoder


def decoder_for(registry: Registry, kind: str, schema, indexes: tuple = (0,), record: bool = True) -> SchemaDecoder:
    """A decoder for a registry `Schema` (with its references resolved through `registry`); `record`: a
    non-record schema is wrapped as one field `value` (the value side; a key stays a scalar column)."""
    decoder = _decoder_for(registry, kind, schema, indexes)
    return _record(decoder) if record else decoder


def _record(decoder: SchemaDecoder) -> SchemaDecoder:
    return decoder if pa.types.is_struct(decoder.arrow_type) else _Record(decoder)


def _decoder_for(registry: Registry, kind: str, schema, indexes: tuple) -> SchemaDecoder:
    """A decoder for a registry `Schema` (with its references resolved through `registry`)."""
    if kind == "avro":
        named: dict = {}
        _avro_references(registry, schema, named)
        return AvroDecoder(json.loads(schema.schema_str), named)
    if kind == "json_schema":
        from offsetlake.formats.json_schema import JsonSchemaDecoder, referenced_documents

        return JsonSchemaDecoder(json.loads(schema.schema_str), referenced_documents(registry, schema))
    from offsetlake.formats.protobuf import ProtobufDecoder, proto_message

    return ProtobufDecoder(proto_message(registry, schema, indexes or (0,)))


def _avro_references(registry: Registry, schema, named: dict) -> None:
    import fastavro

    for ref in schema.references or []:
        referenced = registry.version(ref.subject, ref.version)
        _avro_references(registry, referenced.schema, named)
        fastavro.parse_schema(_plain_logical_types(json.loads(referenced.schema.schema_str)), named_schemas=named)


def latest_arrow_type(settings: RegistrySettings, kind: str, topic: str, key: bool = False) -> pa.DataType:
    """The Arrow type of the subject's latest schema: what a new table is created with."""
    registry = registry_for(settings)
    subject = settings.subject(topic, key)
    if kind == "protobuf":
        from offsetlake.formats.protobuf import fetch_schema

        schema = fetch_schema(lambda fmt: registry.latest(subject, fmt=fmt).schema)
    else:
        schema = registry.latest(subject).schema
    return decoder_for(registry, kind, schema, record=not key).arrow_type
