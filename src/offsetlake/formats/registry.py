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
from offsetlake.formats.avro import AvroDecoder, plain_logical_types
from offsetlake.formats.registry_client import Registry, UnusableSchema, registry_for
from offsetlake.formats.schema_decoder import SchemaDecoder

# ---- the wire format ----------------------------------------------------------------------------


def split_frame(data: bytes | None, schema_type: str) -> tuple[int | None, Any, tuple[int, ...], bytes]:
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
        # The frame `framed_groups` reads in bulk: (its length, the message indexes it stands for). Protobuf's
        # usual frame names the first message type, index path [0], in one byte 0 after the id.
        self.usual_frame: tuple[int, tuple[int, ...]] = (6, (0,)) if kind == "protobuf" else (5, ())

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

    def bulk_groups(self, values: pa.Array) -> tuple[list[tuple[Any, np.ndarray, pa.Array]], np.ndarray]:
        """The usual frame (`usual_frame`) read for all values at once: [(the schema's decoder, or the
        UnusableSchema why not; positions; payloads)], and the positions of the others, which `split` reads
        one by one (a GUID, Protobuf's other message types)."""
        import pyarrow.compute as pc

        if self._file is not None or len(values) == 0:
            return [], np.arange(len(values))
        length, indexes = self.usual_frame
        usual = pc.and_(
            pc.greater_equal(pc.binary_length(values), length),
            pc.equal(pc.binary_slice(values, 0, 1), pa.scalar(b"\x00", pa.binary())),
        )
        if indexes:
            usual = pc.and_(usual, pc.equal(pc.binary_slice(values, 5, 6), pa.scalar(b"\x00", pa.binary())))
        usual = usual.fill_null(False).to_numpy(zero_copy_only=False)
        framed = np.nonzero(usual)[0]
        if len(framed) == 0:
            return [], np.arange(len(values))
        # Cut before taken: a value's frame is a few bytes of it, its payload most of it (copied once).
        every_framed = len(framed) == len(values)  # the usual case: no copy of the ids, no take
        ids_bytes = pc.binary_slice(values, 1, 5)
        ids_bytes = (ids_bytes if every_framed else ids_bytes.take(pa.array(framed))).cast(pa.binary(4))
        ids = np.frombuffer(ids_bytes.buffers()[1], dtype=">u4")[ids_bytes.offset : ids_bytes.offset + len(framed)]
        # An explicit stop: binary_slice without one fails in pyarrow 26 ("Negative buffer resize").
        payloads = pc.binary_slice(values, length, 2**31 - 1)
        groups: list[tuple[Any, np.ndarray, pa.Array]] = []
        one_schema = bool((ids == ids[0]).all())  # the usual case again: no sort of the ids
        for schema_id in ids[:1] if one_schema else np.unique(ids):
            positions = framed if one_schema else framed[ids == schema_id]
            try:
                decoder: Any = self.decoder(int(schema_id), None, indexes)
            except UnusableSchema as err:
                groups.append((err, positions, None))
                continue
            every = len(positions) == len(values)
            groups.append((decoder, positions, payloads if every else payloads.take(pa.array(positions))))
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
        fastavro.parse_schema(plain_logical_types(json.loads(referenced.schema.schema_str)), named_schemas=named)


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
