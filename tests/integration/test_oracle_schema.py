"""The oracle's schema checks proved on real tables of every format: each case corrupts a copy of a table that
the oracle found right, in the one way a single check must catch, and expects that check's own finding
(a finding no other check makes), so removing the check fails its case.

Checks: a column of another type (per format: raw, JSON with a decimal, a JSON key and headers, Avro,
Protobuf with nested fields, JSON Schema, a Debezium envelope), a column in no schema, a payload column
that is not nullable, writer schemas that clash, a column of another type than its registered schema's, and
the columns a user added (gone, retyped, written to)."""

from __future__ import annotations

import functools
import io
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable, write_deltalake
from test_oracle import _retyped, copy_of
from test_registry_formats import order_message_type

import oracle
from offsetlake.batch import ingest
from offsetlake_local.producer import DEMO_AVRO_V1, DEMO_AVRO_V2, avro_event_maker, demo_event, registry_client
from support import JSON_SCHEMA, JournaledProducer, new_pipeline, produce

pytestmark = pytest.mark.slow
FORMATS = ("raw", "json", "avro", "protobuf", "json_schema", "debezium")


@dataclass
class Ingested:
    cfg: object
    topic: str
    check: dict = field(default_factory=dict)  # what oracle.check needs for this format (the Protobuf class)


@pytest.fixture(scope="module")
def tables(spark, bootstrap, schema_registry, tmp_path_factory) -> dict[str, Ingested]:
    """One real table per format, ingested and found right by the oracle."""
    base = tmp_path_factory.mktemp("oracle-schema")
    registry = {"url": schema_registry.url, "username": schema_registry.user, "password": schema_registry.password}
    client = registry_client(schema_registry.url, schema_registry.user, schema_registry.password)
    made = {name: make(bootstrap, base / name, registry, client) for name, make in MAKERS.items()}
    for ingested in made.values():
        ingest(spark, ingested.cfg)
        found = oracle.check(ingested.cfg, **ingested.check)
        assert found.ok, f"{ingested.cfg.format.type}: {found.report()}"
    return made


def _raw(bootstrap, base, registry, client) -> Ingested:
    cfg, topic = new_pipeline(
        bootstrap, base / "pipelines", base / "lake", partitions=1, format={"type": "raw", "schema": []}
    )
    produce(cfg.kafka, topic, 20, transactional_share=0, abort_share=0, seed=61)
    return Ingested(cfg, topic)


def _json(bootstrap, base, registry, client) -> Ingested:
    """Declared fields with a decimal, a JSON key (a struct column) and the headers."""
    fmt = {
        "type": "json",
        "schema": [*JSON_SCHEMA, {"name": "price", "type": "decimal(10,2)"}],
        "key": {"type": "json", "schema": [{"name": "id", "type": "long"}]},
        "include_headers": True,
    }
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=1, format=fmt)

    def priced(rng, seq):
        _, value = demo_event(rng, seq)
        event = {**json.loads(value), "price": f"{rng.randrange(10**6) / 100:.2f}"}
        return json.dumps({"id": seq}).encode(), json.dumps(event).encode(), [("source", b"schema-test")]

    produce(cfg.kafka, topic, 20, transactional_share=0, abort_share=0, seed=62, make_record=priced)
    # One price with more places than the scale: the oracle's judge must find it bad for the reason it is.
    producer = JournaledProducer(bootstrap)
    event = {"event_id": "e", "user_id": 1, "price": "1.234"}
    producer.produce(topic, json.dumps(event).encode(), key=b'{"id": 99}', bad="decimal places")
    producer.flush()
    return Ingested(cfg, topic)


def _avro(bootstrap, base, registry, client) -> Ingested:
    """Version 1 records; version 2 (a `country` field) registered too, with no record of it. Two more records
    written with schemas of other subjects: `extra` a string in one, a long in the other (the second is
    quarantined: it would change the column's type)."""
    fmt = {"type": "avro", "schema": [], "registry": registry}
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=1, format=fmt)
    produce(
        cfg.kafka, topic, 20, transactional_share=0, abort_share=0, seed=63, make_record=avro_event_maker(client, topic)
    )
    client.register_schema(f"{topic}-value", Schema(json.dumps(DEMO_AVRO_V2), "AVRO"))
    producer = Producer({"bootstrap.servers": bootstrap})
    for name, extra_type, value in (("a", "string", "x"), ("b", "long", 7)):
        schema = {**DEMO_AVRO_V1, "fields": [*DEMO_AVRO_V1["fields"], {"name": "extra", "type": extra_type}]}
        schema_id = client.register_schema(f"{topic}-{name}", Schema(json.dumps(schema), "AVRO"))
        event = {"event_id": name, "user_id": 1, "action": "VIEW", "amount": None, "event_time": 0, "seq": 0}
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(schema), {**event, "extra": value})
        producer.produce(topic, value=b"\x00" + struct.pack(">I", schema_id) + body.getvalue())
    producer.flush(10)
    return Ingested(cfg, topic)


def _protobuf(bootstrap, base, registry, client) -> Ingested:
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    order = order_message_type()
    fmt = {"type": "protobuf", "schema": [], "registry": registry}
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=1, format=fmt)
    serialize = ProtobufSerializer(order, client, {"use.deprecated.format": False})
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        message = order(id=f"o{i}", amount_cents=i, tags=["x"], address={"city": "Pune", "zip": 411000 + i})
        producer.produce(topic, value=serialize(message, SerializationContext(topic, MessageField.VALUE)))
    producer.flush(10)
    return Ingested(cfg, topic, {"protobuf": {"value": order}})


def _json_schema(bootstrap, base, registry, client) -> Ingested:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    schema = {
        "type": "object",
        "properties": {
            "sensor": {"type": "string"},
            "value": {"type": "number"},
            "place": {"type": "object", "properties": {"lat": {"type": "number"}}},
        },
    }
    fmt = {"type": "json_schema", "schema": [], "registry": registry}
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=1, format=fmt)
    serialize = JSONSerializer(json.dumps(schema), client)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        value = serialize(
            {"sensor": f"s{i}", "value": i / 4, "place": {"lat": 18.5}}, SerializationContext(topic, MessageField.VALUE)
        )
        producer.produce(topic, value=value)
    producer.flush(10)
    return Ingested(cfg, topic)


def _debezium(bootstrap, base, registry, client) -> Ingested:
    fmt = {
        "type": "json",
        "envelope": "debezium",
        "schema": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}],
    }
    write = {"mode": "upsert", "key": ["id"], "order_by": "_debezium_position"}
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=1, format=fmt, write=write)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        event = {
            "op": "c" if i < 8 else "u",
            "before": None,
            "after": {"id": i % 8, "name": f"n{i}"},
            "source": {"lsn": 100 + i},
        }
        producer.produce(topic, key=str(i % 8).encode(), value=json.dumps(event).encode())
    producer.flush(10)
    return Ingested(cfg, topic)


MAKERS: dict[str, Callable[..., Ingested]] = {
    "raw": _raw,
    "json": _json,
    "avro": _avro,
    "protobuf": _protobuf,
    "json_schema": _json_schema,
    "debezium": _debezium,
}


# -- the corruptions --------------------------------------------------------------------------------------


def retyped(name: str, arrow_type: pa.DataType) -> Callable[[pa.Table], pa.Table]:
    return functools.partial(_retyped, name=name, arrow_type=arrow_type)


def added(name: str, arrow_type: pa.DataType, first: object = None) -> Callable[[pa.Table], pa.Table]:
    """A column added: null, or `first` in the first row."""

    def corrupt(table: pa.Table) -> pa.Table:
        values = [first] + [None] * (table.num_rows - 1)
        return table.append_column(pa.field(name, arrow_type), pa.array(values, arrow_type))

    return corrupt


def not_nullable(name: str) -> Callable[[pa.Table], pa.Table]:
    def corrupt(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index(name)
        return table.cast(table.schema.set(index, table.schema.field(name).with_nullable(False)))

    return corrupt


@dataclass(frozen=True)
class Case:
    check: str  # the oracle's check this case proves
    table: str  # which of `tables`
    corrupt: Callable[[pa.Table], pa.Table]
    finding: tuple[str, str, str]  # (kind, the column or offset's topic it names, a fragment of its text)
    user_columns: dict | None = None

    def __str__(self) -> str:
        return f"{self.check} ({self.table})"


CASES = [
    # A column of another type, in each format, and in each kind of column.
    Case("type: raw", "raw", retyped("value", pa.string()), (oracle.SCHEMA, "value", "is string")),
    Case(
        "type: decimal", "json", retyped("price", pa.decimal128(12, 2)), (oracle.SCHEMA, "price", "decimal128(10, 2)")
    ),
    Case(
        "type: key",
        "json",
        retyped("kafka_key", pa.struct([("id", pa.int32())])),
        (oracle.SCHEMA, "kafka_key", "int32"),
    ),
    Case(
        "type: headers",
        "json",
        retyped("kafka_headers", pa.map_(pa.string(), pa.string())),
        (oracle.SCHEMA, "kafka_headers", "map<string, string>"),
    ),
    Case("type: avro", "avro", retyped("seq", pa.float64()), (oracle.SCHEMA, "seq", "is double")),
    Case(
        "type: nested (protobuf)",
        "protobuf",
        retyped("address", pa.struct([("city", pa.string()), ("zip", pa.int64())])),
        (oracle.SCHEMA, "address", "zip: int64"),
    ),
    Case("type: json_schema", "json_schema", retyped("value", pa.float32()), (oracle.SCHEMA, "value", "is float")),
    Case(
        "type: debezium",
        "debezium",
        retyped("_debezium_position", pa.string()),
        (oracle.SCHEMA, "_debezium_position", "is string"),
    ),
    # The other schema checks.
    Case("column in no schema", "json", added("surprise", pa.string()), (oracle.SCHEMA, "surprise", "in no schema")),
    Case("payload nullable", "avro", not_nullable("action"), (oracle.SCHEMA, "action", "not nullable")),
    # The table was created from the subject's latest schema (version 2): `country`, which no record has yet.
    Case(
        "registered type",
        "avro",
        retyped("country", pa.int32()),
        (oracle.SCHEMA, "country", "its schema's is string"),
    ),
    Case(
        "user column gone",
        "json",
        lambda t: t,
        (oracle.SCHEMA, "note", "is gone"),
        user_columns={"note": pa.string()},
    ),
    Case(
        "user column retyped",
        "json",
        added("note", pa.int32()),
        (oracle.SCHEMA, "note", "the user added it as string"),
        user_columns={"note": pa.string()},
    ),
    Case(
        "user column written",
        "json",
        added("note", pa.string(), first="written"),
        (oracle.WRONG_VALUE, "", "'note', which the pipeline does not write"),
        user_columns={"note": pa.string()},
    ),
]


def writers_clash(ingested: Ingested, copy) -> None:
    """The table without `extra` (as a table that never got it), holding rows for both records written with
    the other subjects' schemas: a string `extra` and a long one."""
    table = DeltaTable(copy.table_path).to_pyarrow_table().drop_columns(["extra"])
    kafka = oracle.read_committed(copy.kafka.bootstrap_servers, ingested.topic)
    odd = sorted(
        w for w, r in kafka.items() if r.value and struct.unpack(">I", r.value[1:5])[0] not in _v1_ids(ingested)
    )
    assert len(odd) == 2, odd
    rows = [r for r in table.to_pylist() if (r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) not in odd]
    template = rows[0]
    for where in odd:
        rows.append(
            {
                **template,
                "kafka_partition": where[1],
                "kafka_offset": where[2],
                "kafka_timestamp": kafka[where].timestamp,
            }
        )
    write_deltalake(
        copy.table_path, pa.Table.from_pylist(rows, schema=table.schema), mode="overwrite", schema_mode="overwrite"
    )
    DeltaTable(copy.quarantine_path).delete(f"kafka_offset IN ({', '.join(str(w[2]) for w in odd)})")


def _v1_ids(ingested: Ingested) -> set[int]:
    """The ids of the value subject's two versions (the demo event's)."""
    settings = ingested.cfg.format.registry
    user, password = settings.username.get_secret_value(), settings.password.get_secret_value()
    client = registry_client(settings.url, user, password)
    return {client.get_version(f"{ingested.topic}-value", v).schema_id for v in (1, 2)}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_each_schema_check_fails_its_corruption(tables, tmp_path, case: Case):
    ingested = tables[case.table]
    copy = copy_of(ingested.cfg, tmp_path, case.check.replace(" ", "-").replace(":", ""))
    table = DeltaTable(copy.table_path).to_pyarrow_table()
    write_deltalake(copy.table_path, case.corrupt(table), mode="overwrite", schema_mode="overwrite")

    findings = oracle.check(copy, user_columns=case.user_columns, **ingested.check)

    kind, name, fragment = case.finding
    found = findings.kinds.get(kind, [])
    named = [text for where, text in found if where[0] == name or (name == "" and fragment in text)]
    assert any(fragment in text for text in named), f"no {kind} naming {name!r} with {fragment!r}:\n{findings.report()}"


def test_writer_schemas_that_clash_in_the_table_are_a_schema_finding(tables, tmp_path):
    ingested = tables["avro"]
    copy = copy_of(ingested.cfg, tmp_path, "clash")
    writers_clash(ingested, copy)

    findings = oracle.check(copy)

    clashes = [text for where, text in findings.kinds.get(oracle.SCHEMA, []) if where[0] == "value"]
    assert any("clashing types" in text and "extra" in text for text in clashes), findings.report()


def test_every_format_and_every_schema_check_has_its_case():
    assert {case.table for case in CASES} == set(FORMATS)
    checks = {case.check.split(":")[0] for case in CASES}
    assert checks >= {"type", "column in no schema", "payload nullable", "registered type"}
    assert {c.check for c in CASES if c.check.startswith("user column")} == {
        "user column gone",
        "user column retyped",
        "user column written",
    }
