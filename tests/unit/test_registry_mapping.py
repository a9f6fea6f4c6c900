"""Registry formats without services: the schema -> Delta column mapping, evolution rules, the wire
framing, config validation and secrets. The end-to-end checks are in tests/integration/test_registry_formats.py."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import struct

import fastavro
import pyarrow as pa
import pytest

from offsetlake.config import parse_pipeline
from offsetlake.errors import ConfigError
from offsetlake.formats.avro import AvroDecoder
from offsetlake.formats.evolution import Incompatible, adds_columns, merge_schema, merge_type
from offsetlake.formats.json_schema import JsonSchemaDecoder, json_schema_to_arrow
from offsetlake.formats.registry import Decoders, UnusableSchema, split_frame
from offsetlake.formats.registry_client import redacted_url
from offsetlake.formats.schema_decoder import TIMESTAMP
from offsetlake.formats.wire_values import decode_values

EVERY_AVRO_CONSTRUCT = {
    "type": "record",
    "name": "Everything",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "nested", "type": {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]}},
        {"name": "list", "type": {"type": "array", "items": "long"}},
        {"name": "map", "type": {"type": "map", "values": "string"}},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "BLUE"]}},
        {"name": "maybe", "type": ["null", "string"], "default": None},
        {"name": "fixed", "type": {"type": "fixed", "name": "Two", "size": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "money", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "clock", "type": {"type": "int", "logicalType": "time-millis"}},
    ],
}


def test_every_supported_avro_construct_maps_to_its_delta_column_and_decodes_into_it():
    decoder = AvroDecoder(EVERY_AVRO_CONSTRUCT)
    expected = pa.struct(
        [
            ("b", pa.bool_()),
            ("i", pa.int32()),
            ("l", pa.int64()),
            ("f", pa.float32()),
            ("d", pa.float64()),
            ("s", pa.string()),
            ("raw", pa.binary()),
            ("nested", pa.struct([("x", pa.int32())])),
            ("list", pa.list_(pa.int64())),
            ("map", pa.map_(pa.string(), pa.string())),
            ("colour", pa.string()),
            ("maybe", pa.string()),
            ("fixed", pa.binary()),
            ("day", pa.date32()),
            ("ms", TIMESTAMP),
            ("us", TIMESTAMP),
            ("money", pa.decimal128(12, 2)),
            ("id", pa.string()),
            ("clock", pa.int32()),
        ]
    )
    assert decoder.arrow_type == expected
    when = dt.datetime(2026, 11, 23, 12, 1, 2, 345678, tzinfo=dt.UTC)
    record = {
        "b": True,
        "i": -5,
        "l": 2**40,
        "f": 1.5,
        "d": 2.25,
        "s": "é",
        "raw": b"\x00\xff",
        "nested": {"x": 7},
        "list": [1, 2],
        "map": {"k": "v"},
        "colour": "BLUE",
        "maybe": None,
        "fixed": b"ab",
        "day": dt.date(2026, 11, 23),
        "ms": when,
        "us": when,
        "money": decimal.Decimal("1234.56"),
        "id": "6c1d3c9e-6b1a-4a55-9a49-2c7e6f0f3d10",
        "clock": 1000,
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(EVERY_AVRO_CONSTRUCT), record)
    row = pa.array([decoder.decode(body.getvalue())], expected).to_pylist()[0]
    assert row == {**record, "map": [("k", "v")], "ms": when.replace(microsecond=345000)}


@pytest.mark.parametrize(
    "schema, reason",
    [
        (["string", "long"], "several non-null branches"),
        ({"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}, "recursive"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}, "wider than Delta's 38 digits"),
    ],
)
def test_avro_constructs_a_delta_column_cannot_hold_are_named(schema, reason):
    with pytest.raises(UnusableSchema, match=reason):
        AvroDecoder(schema)


def test_an_avro_field_may_name_a_type_an_earlier_field_defined_as_debeziums_envelope_does():
    value = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "long"}]}
    kind = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
    envelope = {
        "type": "record",
        "name": "Envelope",
        "namespace": "pg.public.t",
        "fields": [
            {"name": "before", "type": ["null", value]},
            {"name": "after", "type": ["null", "Value"]},
            {"name": "kind", "type": kind},
            {"name": "kinds", "type": {"type": "array", "items": "Kind"}},
        ],
    }
    row = pa.struct([pa.field("id", pa.int64())])
    assert AvroDecoder(envelope).arrow_type == pa.struct(
        [("before", row), ("after", row), ("kind", pa.string()), ("kinds", pa.list_(pa.string()))]
    )


def test_json_schema_maps_objects_arrays_maps_formats_refs_and_nullable_types():
    schema = {
        "type": "object",
        "definitions": {"p": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "v": {"type": ["number", "null"]},
            "ok": {"type": "boolean"},
            "xs": {"type": "array", "items": {"$ref": "#/definitions/p"}},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "one": {"oneOf": [{"type": "null"}, {"type": "string"}]},
        },
    }
    assert json_schema_to_arrow(schema, schema, set()) == pa.struct(
        [
            ("at", TIMESTAMP),
            ("day", pa.date32()),
            ("v", pa.float64()),
            ("ok", pa.bool_()),
            ("xs", pa.list_(pa.struct([("n", pa.int64())]))),
            ("m", pa.map_(pa.string(), pa.int64())),
            ("one", pa.string()),
        ]
    )
    decoder = JsonSchemaDecoder(schema)
    assert decoder.decode(b'{"at": "2026-11-23T01:02:03Z", "xs": [{"n": 1}], "m": {"a": 2}}')["m"] == [("a", 2)]
    with pytest.raises(ValueError, match="value.xs\\[0\\].n: expected an integer"):
        decoder.decode(b'{"xs": [{"n": "1"}]}')
    with pytest.raises(UnusableSchema, match="several non-null types"):
        JsonSchemaDecoder({"type": ["string", "integer"]})


def test_json_schema_refs_to_other_subjects_resolve_by_reference_name_or_id_and_refuse_in_one_line():
    place = {
        "$id": "https://example.com/schemas/place.json",
        "type": "object",
        "properties": {"lat": {"type": "number"}, "city": {"$ref": "#/definitions/city"}},
        "definitions": {"city": {"type": "string"}, "a/b": {"type": "integer"}},
    }
    documents = {"place.json": place}
    schema = {
        "type": "object",
        "properties": {
            "by_name": {"$ref": "place.json"},
            "by_id": {"$ref": "https://example.com/schemas/place.json#/definitions/city"},
            "escaped": {"$ref": "place.json#/definitions/a~1b"},
        },
    }
    place_type = pa.struct([("lat", pa.float64()), ("city", pa.string())])  # its own local ref, in its own file
    assert json_schema_to_arrow(schema, schema, set(), documents) == pa.struct(
        [("by_name", place_type), ("by_id", pa.string()), ("escaped", pa.int64())]
    )
    # A schema with an $id resolves a relative ref against it (place.json next to order.json).
    order = {"$id": "https://example.com/schemas/order.json", "properties": {"p": {"$ref": "place.json"}}}
    assert JsonSchemaDecoder(order | {"type": "object"}, documents).arrow_type == pa.struct([("p", place_type)])

    def refused(ref: str, docs: dict) -> str:
        node = {"type": "object", "properties": {"x": {"$ref": ref}}}
        with pytest.raises(UnusableSchema) as err:
            json_schema_to_arrow(node, node, set(), docs)
        return str(err.value)

    assert "does not list among the schema's references" in refused("other.json", documents)
    assert "points at nothing" in refused("place.json#/definitions/street", documents)
    assert "points at nothing" in refused("#/definitions/none", documents)
    loop = {"a.json": {"$ref": "b.json"}, "b.json": {"$ref": "a.json"}}
    assert "recursive" in refused("a.json", loop)


def test_evolution_adds_columns_and_nested_fields_and_refuses_changed_types():
    table = pa.schema([("a", pa.int64()), ("s", pa.struct([("x", pa.int32())])), ("f", pa.float64())])
    writer = pa.schema(
        [
            ("a", pa.int32()),
            ("s", pa.struct([("x", pa.int32()), ("y", pa.string())])),
            ("f", pa.float32()),
            ("new", pa.string()),
        ]
    )
    merged = merge_schema(table, writer)
    assert merged == pa.schema(
        [
            ("a", pa.int64()),
            ("s", pa.struct([("x", pa.int32()), ("y", pa.string())])),
            ("f", pa.float64()),
            ("new", pa.string()),
        ]
    )
    assert adds_columns(table, merged) and not adds_columns(merged, merged)
    assert not adds_columns(table, merge_schema(table, pa.schema([("a", pa.int16())])))  # a narrower int fits
    with pytest.raises(Incompatible, match="field 'a' is string in this schema but int64 in the table"):
        merge_type(pa.struct(list(table)), pa.struct([("a", pa.string())]), "")
    with pytest.raises(Incompatible, match="field 's.x' is int64"):  # widening is a type change Delta cannot make
        merge_type(pa.struct(list(table)), pa.struct([("s", pa.struct([("x", pa.int64())]))]), "")


def test_wire_framing_is_parsed_by_the_clients_own_reader():
    assert split_frame(b"\x00" + struct.pack(">I", 42) + b"payload", "AVRO") == (42, None, (), b"payload")
    # Protobuf adds the message index path: [1, 0] as zigzag varints after the id (count 2, then 1, 0).
    assert split_frame(b"\x00" + struct.pack(">I", 7) + bytes([4, 2, 0]) + b"p", "PROTOBUF")[2:] == ((1, 0), b"p")
    for bad in (None, b"", b"\x00\x00", b'{"json": 1}', b"\x07" + b"\x00" * 8):
        with pytest.raises(ValueError):
            split_frame(bad, "AVRO")


def base(**fmt):
    return {
        "name": "orders",
        "topics": ["orders"],
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "table": {"path": "/lake/orders"},
        "format": fmt,
    }


@pytest.mark.parametrize(
    "fmt, expected",
    [
        ({"type": "avro"}, "needs either a 'registry' or a 'schema_file'"),
        ({"type": "protobuf"}, "format 'protobuf' needs a 'registry'"),
        ({"type": "avro", "registry": {"url": "localhost:8081"}}, "key 'format.registry.url'"),
        ({"type": "avro", "registry": {"url": "http://r", "subject_name_strategy": "record"}}, "needs 'record_name'"),
        ({"type": "avro", "registry": {"url": "http://r", "username": "u"}}, "both 'username' and 'password'"),
        (
            {"type": "json_schema", "registry": {"url": "http://r"}, "schema": [{"name": "a", "type": "long"}]},
            "takes no 'schema'",
        ),
        ({"type": "raw", "key": {"type": "string"}}, "takes no 'key' section"),
        ({"type": "json", "schema": [{"name": "a", "type": "long"}], "key": {"type": "avro"}}, "needs a 'registry'"),
        ({"type": "json", "schema": [{"name": "kafka_key", "type": "long"}], "key": {"type": "raw"}}, "clashes"),
        ({"type": "avro", "schema_file": "x.avsc", "registry": {"url": "http://r"}}, "not both"),
    ],
)
def test_format_mistakes_name_their_key(fmt, expected):
    with pytest.raises(ConfigError) as err:
        parse_pipeline(base(**fmt), "orders.yaml")
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_registry_credentials_never_show_in_the_config_or_messages():
    cfg = parse_pipeline(
        base(
            type="avro", registry={"url": "https://reg.example:8081", "username": "svc", "password": "hunter2-secret"}
        ),
        "orders.yaml",
    )
    assert "hunter2-secret" not in repr(cfg) and "hunter2-secret" not in str(cfg.format.registry)
    assert cfg.format.registry.password.get_secret_value() == "hunter2-secret"
    assert redacted_url("https://svc:hunter2@reg.example:8081/x") == "https://***@reg.example:8081/x"
    assert cfg.format.registry.subject("orders") == "orders-value"
    assert cfg.format.registry.subject("orders", key=True) == "orders-key"


def test_subject_name_strategies():
    def subject(strategy, **extra):
        cfg = parse_pipeline(
            base(type="avro", registry={"url": "http://r", "subject_name_strategy": strategy, **extra}), "o.yaml"
        )
        return cfg.format.registry.subject("orders")

    assert subject("topic") == "orders-value"
    assert subject("record", record_name="com.acme.Order") == "com.acme.Order"
    assert subject("topic_record", record_name="com.acme.Order") == "orders-com.acme.Order"


def test_a_non_record_schema_becomes_one_value_column():
    from offsetlake.formats.registry import _record

    decoder = _record(AvroDecoder("string"))
    assert decoder.arrow_type == pa.struct([("value", pa.string())])
    assert decoder.decode(b"\x06abc") == {"value": "abc"}


FLAT = {
    "type": "record",
    "name": "Flat",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "maybe", "type": ["null", "double"]},
        {"name": "last", "type": ["string", "null"]},
        {"name": "ok", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "raw", "type": "bytes"},
        {"name": "colour", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    ],
}


def flat_payloads(count: int) -> list[bytes]:
    import random

    rng, parsed, out = random.Random(7), fastavro.parse_schema(FLAT), []
    for i in range(count):
        body = io.BytesIO()
        fastavro.schemaless_writer(
            body,
            parsed,
            {
                "id": "é" * rng.randrange(0, 70),
                "n": rng.choice([0, -1, 63, -64, 64, 2**62, -(2**63), rng.randrange(-(10**12), 10**12)]),
                "small": rng.randrange(-(2**31), 2**31),
                "maybe": None if i % 3 else rng.random(),
                "last": None if i % 5 == 0 else f"s{i}",
                "ok": i % 2 == 0,
                "f": 0.5,
                "raw": bytes(rng.randrange(0, 200)),
                "colour": ["RED", "GREEN", "BLUE"][i % 3],
                "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=rng.randrange(10**10)),
                "at_us": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randrange(10**12)),
                "day": dt.date(2026, 1, 1) + dt.timedelta(days=i),
            },
        )
        out.append(body.getvalue())
    return out


def test_flat_avro_records_decoded_together_equal_record_by_record_decoding():
    decoder = AvroDecoder(FLAT)
    payloads = flat_payloads(500)
    together = decoder.decode_many(payloads)
    assert together is not None and together.type == decoder.arrow_type
    assert together.to_pylist() == pa.array([decoder.decode(p) for p in payloads], decoder.arrow_type).to_pylist()


@pytest.mark.parametrize("damage", ["a byte too many", "a byte too few", "two records in one"])
def test_one_payload_out_of_step_sends_the_batch_record_by_record(damage):
    decoder = AvroDecoder(FLAT)
    payloads = flat_payloads(200)
    if damage == "a byte too many":
        payloads[50] += b"\x00"
    elif damage == "a byte too few":
        payloads[50] = payloads[50][:-1]
    else:
        payloads[50] += payloads[51]
    assert decoder.decode_many(payloads) is None  # the caller then decodes one by one and words any error


class FlatSchemas(Decoders):
    """Schema ids 1 and 2 are FLAT, each its own decoder (as two registered versions are); 3 is unusable."""

    def __init__(self):
        super().__init__("avro", None)

    def _build(self, schema_id, guid, indexes):
        if schema_id == 3:
            raise UnusableSchema("a map of maps")
        return AvroDecoder(FLAT)


def confluent_framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


@pytest.mark.parametrize("mix", ["one schema", "two schemas, a null, a stray value and an unusable schema"])
def test_framed_values_decode_together_each_at_its_position(mix):
    payloads = flat_payloads(300)
    if mix == "one schema":
        raw: list[bytes | None] = [confluent_framed(1, p) for p in payloads]
    else:
        raw = [confluent_framed(1 + i % 2, p) for i, p in enumerate(payloads)]
        raw[10], raw[20], raw[30] = None, b"junk", confluent_framed(3, payloads[30])
    chunks = pa.chunked_array([pa.array(raw[:150], pa.binary()), pa.array(raw[150:], pa.binary())])
    values, _, errors = decode_values(FlatSchemas(), chunks, None, "value", nulls_allowed=True)
    one_by_one = AvroDecoder(FLAT)
    expected = [None if i in errors or raw[i] is None else one_by_one.decode(p) for i, p in enumerate(payloads)]
    assert values.to_pylist() == pa.array(expected, one_by_one.arrow_type).to_pylist()
    assert sorted(errors) == ([] if mix == "one schema" else [20, 30])
    assert all(type(position) is int for position in errors)
    assert "a map of maps" in errors.get(30, "a map of maps")


def test_nested_schemas_take_the_record_by_record_path():
    assert AvroDecoder(EVERY_AVRO_CONSTRUCT).decode_many([b""] * 100) is None
