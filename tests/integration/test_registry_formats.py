"""Avro, Protobuf and JSON Schema through a Schema Registry (real HTTP), keys and headers, schema evolution
in the same commit as the offsets: real broker, real Spark, real Delta tables, checked row by row."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from offsetlake.batch import ingest
from offsetlake.protocol.metadata import CommitMetadata
from offsetlake.table import query
from offsetlake_local import schema_registry as embedded_registry
from offsetlake_local.producer import DEMO_AVRO_V1, DEMO_AVRO_V2, avro_event_maker, registry_client
from proto_messages import message_class
from support import (
    JournaledProducer,
    assert_exactly_once,
    assert_one_line_failure,
    kafka_committed_records,
    produce,
    quarantine_lineage,
    run_cli,
)


@pytest.fixture(params=["confluent", "karapace"])
def schema_registry(request, schema_registry, karapace_registry):
    """Every test here runs against a registry that answers as Confluent's does and one that answers as
    Karapace does (Protobuf schemas as .proto source: offsetlake compiles them)."""
    return schema_registry if request.param == "confluent" else karapace_registry


def registry_section(registry, **extra) -> dict:
    return {"url": registry.url, "username": "${REGISTRY_USER}", "password": "${REGISTRY_PASSWORD}", **extra}


@pytest.fixture
def registry_env(schema_registry, monkeypatch):
    monkeypatch.setenv("REGISTRY_USER", schema_registry.user)
    monkeypatch.setenv("REGISTRY_PASSWORD", schema_registry.password)
    return {"REGISTRY_USER": schema_registry.user, "REGISTRY_PASSWORD": schema_registry.password}


@pytest.fixture
def client(schema_registry):
    return registry_client(schema_registry.url, schema_registry.user, schema_registry.password)


def avro_pipeline(pipeline, registry, batch: dict | None = None, **format_extra):
    return pipeline(
        partitions=3,
        **({"batch": batch} if batch else {}),
        format={
            "type": "avro",
            "schema": [],
            "registry": registry_section(registry),
            "key": {"type": "string"},
            "include_headers": True,
            **format_extra,
        },
    )


def rows_by_offset(cfg, columns: str) -> dict:
    table = query(cfg.table_location, f"SELECT kafka_partition, kafka_offset, {columns} FROM t")
    out = {}
    for row in table.to_pylist():
        out[(row.pop("kafka_partition"), row.pop("kafka_offset"))] = row
    return out


def test_avro_versions_mixed_in_one_batch_and_a_new_field_arrives_with_its_offsets(
    spark, pipeline, schema_registry, registry_env, client
):
    cfg, topic = avro_pipeline(pipeline, schema_registry)
    produce(cfg.kafka, topic, 400, abort_share=0.25, seed=5, make_record=avro_event_maker(client, topic, 1))
    ingest(spark, cfg)
    before = DeltaTable(cfg.table_path)
    assert "country" not in [f.name for f in before.schema().fields]
    first_version = before.version()

    # Version 2 adds a field; both versions interleave inside the next batch.
    for seed in range(3):
        produce(cfg.kafka, topic, 150, abort_share=0.2, seed=10 + seed, make_record=avro_event_maker(client, topic, 1))
        produce(cfg.kafka, topic, 150, abort_share=0.2, seed=20 + seed, make_record=avro_event_maker(client, topic, 2))
    results = [r for r in ingest(spark, cfg) if r.status == "committed"]

    assert len(results) == 1  # one batch held both schema versions
    evolved = DeltaTable(cfg.table_path)
    assert evolved.version() == results[0].version == first_version + 1
    assert "country" in [f.name for f in evolved.schema().fields]
    assert "country" not in [f.name for f in DeltaTable(cfg.table_path, version=first_version).schema().fields]
    # The version that added the column is the one holding these offsets in its userMetadata and txn.
    entry = next(h for h in evolved.history(5) if h["version"] == results[0].version)
    meta = CommitMetadata.parse(entry["userMetadata"])
    assert meta.kind == "ingest" and meta.batch == results[0].batch
    assert_exactly_once(cfg)

    # Row by row against what Kafka holds: every field, the key and the headers, byte-exact.
    truth = kafka_committed_records(cfg.kafka.bootstrap_servers, topic, whole=True)
    rows = rows_by_offset(cfg, "event_id, user_id, action, amount, event_time, seq, country, kafka_key, kafka_headers")
    assert len(rows) == len(truth)
    versions = set()
    for (_t, p, o), (key, value, headers) in truth.items():
        schema_id = struct.unpack(">I", value[1:5])[0]
        writer = fastavro.parse_schema(json.loads(client.get_schema(schema_id).schema_str))
        record = fastavro.schemaless_reader(io.BytesIO(value[5:]), writer, None)
        row = rows[(p, o)]
        versions.add("country" in record)
        assert row["kafka_key"] == key.decode()
        assert row["kafka_headers"] == headers
        assert row["event_id"] == record["event_id"] and row["seq"] == record["seq"]
        assert row["user_id"] == record["user_id"] and row["action"] == record["action"]
        assert row["amount"] == record["amount"] and row["event_time"] == record["event_time"]
        assert row["country"] == record.get("country")
    assert versions == {True, False}


def test_records_a_table_cannot_hold_are_quarantined_per_offset_with_the_reason(
    spark, pipeline, schema_registry, registry_env, client
):
    cfg, topic = avro_pipeline(pipeline, schema_registry)
    produce(cfg.kafka, topic, 100, transactional_share=0, seed=1, make_record=avro_event_maker(client, topic, 1))
    ingest(spark, cfg)

    # user_id as a string: a type Delta cannot change the long column to.
    narrowed = {
        **DEMO_AVRO_V1,
        "fields": [
            f if f["name"] != "user_id" else {"name": "user_id", "type": "string"} for f in DEMO_AVRO_V1["fields"]
        ],
    }
    narrowed_id = client.register_schema(f"{topic}-value", Schema(json.dumps(narrowed), "AVRO"))
    body = io.BytesIO()
    fastavro.schemaless_writer(
        body,
        fastavro.parse_schema(narrowed),
        {"event_id": "x", "user_id": "u-1", "action": "VIEW", "amount": None, "event_time": 0, "seq": 1},
    )
    producer = JournaledProducer(cfg.kafka.bootstrap_servers)
    bad = {
        b"\x00" + struct.pack(">I", narrowed_id) + body.getvalue(): "cannot change a column's type",
        b"\x00" + struct.pack(">I", 987654) + b"\x02": "schema id 987654: unknown to the Schema Registry at",
        b'{"not": "framed"}': "not in the Schema Registry wire format",
        b"\x00" + struct.pack(">I", 1) + b"\xff\xff\xff": "not a valid Avro record",
    }
    for value, reason in bad.items():
        producer.produce(topic, value=value, key=b"k", partition=0, bad=reason)
    producer.flush(10)
    produce(cfg.kafka, topic, 100, transactional_share=0, seed=2, make_record=avro_event_maker(client, topic, 1))

    ingest(spark, cfg)

    quarantine = query(cfg.quarantine_location, "SELECT kafka_offset, value, error FROM t").to_pylist()
    assert len(quarantine) == len(bad)
    for row in quarantine:
        assert bad[row["value"]] in row["error"], row
    assert len(set(quarantine_lineage(cfg))) == len(bad)
    assert_exactly_once(cfg)


def test_an_unreachable_registry_fails_the_batch_in_one_line_and_commits_nothing(
    tmp_path, spark, pipeline, pipelines_dir, monkeypatch
):
    password = "pw-that-must-not-print"
    own = embedded_registry.start(tmp_path / "own-registry", user="u", password=password)
    env = {"REGISTRY_USER": "u", "REGISTRY_PASSWORD": password}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        cfg, topic = avro_pipeline(pipeline, own)
        own_client = registry_client(own.url, "u", password)
        produce(cfg.kafka, topic, 200, seed=3, make_record=avro_event_maker(own_client, topic, 1))
        ingest(spark, cfg)
        version = DeltaTable(cfg.table_path).version()
        produce(cfg.kafka, topic, 200, seed=4, make_record=avro_event_maker(own_client, topic, 2))
    finally:
        embedded_registry.stop(own.pid)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), env=env)

    assert_one_line_failure(failed, "Schema Registry at", own.url, "unreachable", "nothing was committed")
    assert password not in failed.stdout + failed.stderr
    assert DeltaTable(cfg.table_path).version() == version

    again = embedded_registry.start(tmp_path / "own-registry", port=own.port, user="u", password=password)
    try:
        done = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), env=env)
        assert done.returncode == 0, done.stderr
        assert password not in done.stdout + done.stderr
        assert_exactly_once(cfg)
        assert "country" in [f.name for f in DeltaTable(cfg.table_path).schema().fields]
    finally:
        embedded_registry.stop(again.pid)


def order_message_type():
    """A Protobuf message built at run time (no protoc here): nested message, enum, repeated, map, a
    Timestamp, an `optional` field, and a message imported from another file (a schema reference)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, timestamp_pb2
    from google.protobuf.message_factory import GetMessageClass

    F = descriptor_pb2.FieldDescriptorProto
    money = descriptor_pb2.FileDescriptorProto(
        name="offsetlake_test/money.proto", package="offsetlake.common", syntax="proto3"
    )
    amount = money.message_type.add(name="Money")
    amount.field.add(name="currency", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    amount.field.add(name="cents", number=2, type=F.TYPE_SINT64, label=F.LABEL_OPTIONAL)
    file = descriptor_pb2.FileDescriptorProto(
        name="offsetlake_test_order.proto",
        package="offsetlake.test",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "offsetlake_test/money.proto"],
    )
    order = file.message_type.add(name="Order")
    address = order.nested_type.add(name="Address")
    address.field.add(name="city", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    address.field.add(name="zip", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    entry = order.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    status = order.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    order.field.add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    order.field.add(name="amount_cents", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    order.field.add(
        name="created", number=3, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".google.protobuf.Timestamp"
    )
    order.field.add(name="tags", number=4, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    order.field.add(
        name="counts",
        number=5,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".offsetlake.test.Order.CountsEntry",
    )
    order.field.add(
        name="status", number=6, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL, type_name=".offsetlake.test.Order.Status"
    )
    order.field.add(
        name="address",
        number=7,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".offsetlake.test.Order.Address",
    )
    order.oneof_decl.add(name="_note")
    order.field.add(
        name="note", number=8, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0, proto3_optional=True
    )
    order.field.add(
        name="price", number=9, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=".offsetlake.common.Money"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(money)
    pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName("offsetlake.test.Order"))


def test_protobuf_and_json_schema_records_land_field_by_field(spark, pipeline, schema_registry, registry_env, client):
    import datetime as dt

    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    Order = order_message_type()
    cfg, topic = pipeline(
        partitions=2,
        format={
            "type": "protobuf",
            "schema": [],
            "include_headers": True,
            "registry": registry_section(schema_registry),
            "key": {"type": "json", "schema": [{"name": "id", "type": "long"}]},
        },
    )
    serialize = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    created = dt.datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=dt.UTC)
    for i in range(60):
        order = Order(
            id=f"o{i}",
            amount_cents=i * 100,
            tags=[f"t{i}", "x"],
            status=i % 2,
            address={"city": "Pune", "zip": 411000 + i} if i % 3 else None,
        )
        order.counts["a"] = i
        order.price.currency, order.price.cents = "EUR", -i
        order.created.FromDatetime(created + dt.timedelta(seconds=i))
        if i % 4 == 0:
            order.note = "" if i % 8 == 0 else f"n{i}"
        producer.produce(
            topic,
            key=json.dumps({"id": i}).encode(),
            value=serialize(order, SerializationContext(topic, MessageField.VALUE)),
            headers=[("h", bytes([i])), ("h", None)],
        )
    producer.flush(10)

    # A Karapace registry (3.16) refuses the serialized form of a schema with references (HTTP 500) and
    # answers its text form, the .proto source, with the references: offsetlake reads that and compiles it.
    subject = f"{topic}-value"
    if schema_registry.answers == "karapace":
        with pytest.raises(SchemaRegistryError) as refused:
            client.get_latest_version(subject, fmt="serialized")
        assert refused.value.http_status_code == 500
    answered = client.get_latest_version(subject).schema
    assert answered.schema_str.startswith('syntax = "proto3";') == (schema_registry.answers == "karapace")
    assert [r.name for r in answered.references] == ["offsetlake_test/money.proto"]

    ingest(spark, cfg)

    assert_exactly_once(cfg, protobuf={"value": Order})
    rows = rows_by_offset(
        cfg, "id, amount_cents, created, tags, counts, status, address, note, price, kafka_key, kafka_headers"
    )
    truth = kafka_committed_records(cfg.kafka.bootstrap_servers, topic, whole=True)
    assert len(rows) == len(truth) == 60
    for (_t, p, o), (key, _value, headers) in truth.items():
        row = rows[(p, o)]
        i = json.loads(key)["id"]
        assert row["kafka_key"] == {"id": i} and row["kafka_headers"] == headers
        assert row["id"] == f"o{i}" and row["amount_cents"] == i * 100 and row["tags"] == [f"t{i}", "x"]
        assert row["created"] == created + dt.timedelta(seconds=i)
        assert row["counts"] == [("a", i)] and row["status"] == ("PAID" if i % 2 else "NEW")
        assert row["address"] == ({"city": "Pune", "zip": 411000 + i} if i % 3 else None)
        assert row["note"] == (None if i % 4 else "" if i % 8 == 0 else f"n{i}")  # `optional`: set "" is not null
        assert row["price"] == {"currency": "EUR", "cents": -i}  # a message from an imported file (a reference)

    # JSON Schema: nested object, array, date-time and date formats, a $ref to another subject's schema (a
    # registry reference) and into its definitions; a record breaking the schema quarantined.
    place = {
        "type": "object",
        "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "definitions": {"city": {"type": "string"}},
    }
    place_subject = f"{topic}-place"
    client.register_schema(place_subject, Schema(json.dumps(place), "JSON"))
    schema = {
        "type": "object",
        "title": "Reading",
        "properties": {
            "sensor": {"type": "string"},
            "value": {"type": "number"},
            "at": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "place": {"$ref": "place.json"},
            "city": {"$ref": "place.json#/definitions/city"},
        },
        "required": ["sensor", "value"],
    }
    cfg2, topic2 = pipeline(
        partitions=1, format={"type": "json_schema", "schema": [], "registry": registry_section(schema_registry)}
    )
    reference = SchemaReference("place.json", place_subject, 1)
    serialize_json = JSONSerializer(Schema(json.dumps(schema), "JSON", [reference]), client)
    context = SerializationContext(topic2, MessageField.VALUE)
    for i in range(30):
        producer.produce(
            topic2,
            value=serialize_json(
                {
                    "sensor": f"s{i}",
                    "value": i / 4,
                    "at": f"2026-11-23T10:00:{i:02d}Z",
                    "day": "2026-11-23",
                    "tags": ["a"] * (i % 3),
                    "place": {"lat": 18.5, "lon": 73.8},
                    "city": "Pune",
                },
                context,
            ),
        )
    framing = serialize_json({"sensor": "ok", "value": 1}, context)[:5]
    producer.produce(topic2, value=framing + b'{"sensor": "bad", "value": "not a number"}')
    producer.flush(10)

    ingest(spark, cfg2)

    assert_exactly_once(cfg2)
    got = query(
        cfg2.table_location, "SELECT sensor, value, at, day, tags, place, city FROM t ORDER BY kafka_offset"
    ).to_pylist()
    assert len(got) == 30
    assert got[7] == {
        "sensor": "s7",
        "value": 7 / 4,
        "at": dt.datetime(2026, 11, 23, 10, 0, 7, tzinfo=dt.UTC),
        "day": dt.date(2026, 11, 23),
        "tags": ["a"],
        "place": {"lat": 18.5, "lon": 73.8},
        "city": "Pune",
    }
    errors = query(cfg2.quarantine_location, "SELECT error FROM t").column(0).to_pylist()
    assert len(errors) == 1 and "value.value: expected a number" in errors[0]


READING = """
syntax = "proto3";
package offsetlake.test;
import "google/protobuf/timestamp.proto";
message Reading {
  enum Level { LOW = 0; HIGH = 1; }
  message Place { string city = 1; int32 zip = 2; }
  string id = 1; google.protobuf.Timestamp at = 2; Level level = 3; repeated string tags = 4; Place place = 5;
  uint64 total = 6; optional string note = 7;
}
"""


def test_protobuf_decoded_a_batch_at_a_time_lands_as_the_oracle_decodes_it_and_bad_records_alone_are_quarantined(
    spark, pipeline, schema_registry, registry_env, client
):
    import random

    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    Reading = message_class(READING, "offsetlake.test.Reading")  # no map: decoded a batch at a time
    cfg, topic = pipeline(
        partitions=2, format={"type": "protobuf", "schema": [], "registry": registry_section(schema_registry)}
    )
    serialize = ProtobufSerializer(Reading, client, {"use.deprecated.format": False})
    context = SerializationContext(topic, MessageField.VALUE)
    rng = random.Random(60)
    producer = JournaledProducer(cfg.kafka.bootstrap_servers)
    frame = b""
    for i in range(9000):  # partition 0's range over decode_group's SPLIT_AT: halved around the bad records
        reading = Reading(id=f"r{i}", level=i % 3, tags=["t"] * (i % 3), total=rng.randrange(2**64))
        reading.at.seconds, reading.at.nanos = rng.randrange(-(10**10), 10**10), rng.randrange(10**9)
        if i % 4:
            reading.place.city, reading.place.zip = "Pune", 411000 + i
        if i % 5 == 0:
            reading.note = "" if i % 10 == 0 else f"n{i}"
        value = serialize(reading, context)
        frame = value[: len(value) - len(reading.SerializeToString())]
        producer.produce(topic, value=value, partition=i % 2)
        if i == 1500:  # in partition 0 only: quarantined alone, with the reason; partition 1 decodes whole
            producer.produce(topic, value=frame + b"\x0a\x05ab", partition=0, bad="not a valid Protobuf message")
            beyond = Reading(id="late")
            beyond.at.seconds = 253_402_300_800  # 10000-01-01: no timestamp a Delta column holds
            producer.produce(
                topic, value=frame + beyond.SerializeToString(), partition=0, bad="not a valid Protobuf message"
            )
    producer.flush(10)
    assert frame == b"\x00" + frame[1:5] + b"\x00"  # the usual frame: the first message type, index path [0]

    ingest(spark, cfg)

    assert_exactly_once(cfg, protobuf={"value": Reading})
    errors = query(cfg.quarantine_location, "SELECT error FROM t").column(0).to_pylist()
    assert len(errors) == 2 and all("not a valid Protobuf message" in e for e in errors), errors
    columns = pa.schema(DeltaTable(cfg.table_location).schema().to_arrow())
    assert columns.field("total").type == pa.decimal128(20, 0) and columns.field("level").type == pa.string()


def test_a_registry_key_and_an_avro_schema_file_without_a_registry(
    spark, pipeline, schema_registry, registry_env, client, tmp_path
):
    from confluent_kafka.schema_registry.avro import AvroSerializer

    key_schema = {
        "type": "record",
        "name": "OrderKey",
        "fields": [{"name": "shop", "type": "string"}, {"name": "n", "type": "long"}],
    }
    cfg, topic = pipeline(
        partitions=2,
        format={"type": "avro", "schema": [], "registry": registry_section(schema_registry), "key": {"type": "avro"}},
    )
    key_serializer = AvroSerializer(client, json.dumps(key_schema))
    value_maker = avro_event_maker(client, topic, 2, headers=False)
    keys = iter(range(10_000))

    def make(rng, seq):
        _, value, _ = value_maker(rng, seq)
        n = next(keys)
        key = (
            None
            if n % 10 == 0
            else key_serializer({"shop": f"s{n % 3}", "n": n}, SerializationContext(topic, MessageField.KEY))
        )
        return key, value

    produce(cfg.kafka, topic, 200, abort_share=0.2, seed=8, make_record=make)

    ingest(spark, cfg)

    assert_exactly_once(cfg)
    keys_seen = query(cfg.table_location, "SELECT kafka_key FROM t").column(0).to_pylist()
    assert sum(k is None for k in keys_seen) == 20  # a record without a key keeps a null key, not quarantined
    assert {k["shop"] for k in keys_seen if k} == {"s0", "s1", "s2"}

    # Plain Avro values (no framing) written with a schema file.
    schema_file = tmp_path / "event.avsc"
    schema_file.write_text(json.dumps(DEMO_AVRO_V2))
    cfg2, topic2 = pipeline(partitions=1, format={"type": "avro", "schema": [], "schema_file": str(schema_file)})
    parsed = fastavro.parse_schema(DEMO_AVRO_V2)
    producer = Producer({"bootstrap.servers": cfg2.kafka.bootstrap_servers})
    for i in range(25):
        body = io.BytesIO()
        fastavro.schemaless_writer(
            body,
            parsed,
            {
                "event_id": f"e{i}",
                "user_id": i,
                "action": "VIEW",
                "amount": None,
                "event_time": 1_700_000_000_000 + i,
                "seq": i,
                "country": "IN",
            },
        )
        producer.produce(topic2, value=body.getvalue())
    producer.flush(10)
    ingest(spark, cfg2)
    assert_exactly_once(cfg2)
    got = query(cfg2.table_location, "SELECT event_id, seq, country FROM t ORDER BY seq").to_pylist()
    assert got[24] == {"event_id": "e24", "seq": 24, "country": "IN"} and len(got) == 25


def test_a_nested_field_added_on_a_partitioned_table_lands_with_its_offsets(
    spark, pipeline, schema_registry, registry_env, client
):
    from confluent_kafka.schema_registry.avro import AvroSerializer

    inner_v1 = {"type": "record", "name": "Place", "fields": [{"name": "city", "type": "string"}]}
    inner_v2 = {**inner_v1, "fields": [*inner_v1["fields"], {"name": "zip", "type": ["null", "int"], "default": None}]}

    def schema(inner):
        return {
            "type": "record",
            "name": "Visit",
            "fields": [
                {"name": "n", "type": "long"},
                {"name": "place", "type": inner},
                {"name": "tags", "type": {"type": "array", "items": "string"}},
            ],
        }

    cfg, topic = pipeline(
        partitions=2,
        table={"partition_by": ["kafka_partition"]},
        format={"type": "avro", "schema": [], "registry": registry_section(schema_registry)},
    )
    v1 = AvroSerializer(client, json.dumps(schema(inner_v1)))
    v2 = AvroSerializer(client, json.dumps(schema(inner_v2)))
    context = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    for n in range(100):
        producer.produce(topic, value=v1({"n": n, "place": {"city": "Pune"}, "tags": ["a"]}, context), partition=n % 2)
    producer.flush(10)
    ingest(spark, cfg)
    for n in range(100, 200):
        record = {"n": n, "place": {"city": "Goa", "zip": n}, "tags": []}
        producer.produce(
            topic,
            value=(v2 if n % 2 else v1)(record if n % 2 else {**record, "place": {"city": "Goa"}}, context),
            partition=n % 2,
        )
    producer.flush(10)

    committed = [r for r in ingest(spark, cfg) if r.status == "committed"]

    assert len(committed) == 1
    table = DeltaTable(cfg.table_path)
    assert table.metadata().partition_columns == ["kafka_partition"]
    place = next(f for f in table.schema().fields if f.name == "place")
    assert [f.name for f in place.type.fields] == ["city", "zip"]
    assert_exactly_once(cfg)
    rows = {r["n"]: r for r in query(cfg.table_location, "SELECT n, place, tags, kafka_partition FROM t").to_pylist()}
    assert len(rows) == 200
    assert rows[5] == {"n": 5, "place": {"city": "Pune", "zip": None}, "tags": ["a"], "kafka_partition": 1}
    assert rows[151] == {"n": 151, "place": {"city": "Goa", "zip": 151}, "tags": [], "kafka_partition": 1}
    assert rows[150]["place"] == {"city": "Goa", "zip": None}
