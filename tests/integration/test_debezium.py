"""Debezium change streams (`format.envelope: debezium`) into an upsert table.

The events are Debezium's envelope as its connectors write it: snapshot reads, inserts, updates, deletes
(with PostgreSQL's default replica identity, `before` holds the key only) each followed by the tombstone
Debezium writes for compaction; in JSON with and without the converter's schema wrapper, and in Avro
written by confluent-kafka's AvroSerializer through the embedded registry. The upsert oracle folds what
Kafka returns under read_committed with its own reading of the envelope (`oracle.debezium_row`).
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from offsetlake.batch import ingest
from oracle import assert_exactly_once, change_feed_state
from support import JournaledProducer, produce

pytestmark = pytest.mark.slow

ROW_FIELDS = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "email", "type": "string"},
]
UPSERT_BY_ID = {"mode": "upsert", "key": ["id"]}


class SourceTable:
    """A PostgreSQL table as Debezium streams it: a snapshot, then inserts, updates and deletes, each event
    with its LSN; a delete is followed by its tombstone. Events for `produce` (key, value)."""

    def __init__(self, rows: int, wrap_share: float = 0.0, version: int = 1):
        self.live: set[int] = set()
        self.snapshot = list(range(1, rows + 1))
        self.next_id = rows + 1
        self.lsn = 1000
        self.tombstone: int | None = None
        self.wrap_share, self.version = wrap_share, version

    def event(self, rng: random.Random, seq: int) -> tuple[bytes, dict | None]:
        if self.tombstone is not None:
            key, self.tombstone = self.tombstone, None
            return self.key(key), None
        self.lsn += rng.randrange(8, 200)
        if self.snapshot:
            row_id, op = self.snapshot.pop(0), "r"
        else:
            op = rng.choices(["c", "u", "d"], [2, 5, 2])[0] if self.live else "c"
            row_id = self.next_id if op == "c" else rng.choice(sorted(self.live))
        if op == "c":
            self.next_id += 1
        row = {"id": row_id, "name": f"customer {row_id}.{seq}", "email": f"c{row_id}@example.com"}
        if self.version >= 2:
            row["country"] = rng.choice(["DE", "IN", "BR"])
        before = None
        if op == "d":
            before, row = {"id": row_id, "name": None, "email": None}, None
            if self.version >= 2:
                before["country"] = None
            self.live.discard(row_id)
            self.tombstone = row_id
        else:
            self.live.add(row_id)
        source = {
            "version": "2.7.3.Final",
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1_700_000_000_000 + seq,
            "snapshot": "true" if op == "r" else "false",
            "db": "shop",
            "schema": "public",
            "table": "customers",
            "txId": 500 + seq,
            "lsn": self.lsn,
        }
        event = {"before": before, "after": row, "source": source, "op": op, "ts_ms": source["ts_ms"] + 5}
        event["transaction"] = None
        return self.key(row_id), event

    @staticmethod
    def key(row_id: int) -> bytes:
        return json.dumps({"id": row_id}).encode()


def json_events(table: SourceTable):
    def make(rng: random.Random, seq: int):
        key, event = table.event(rng, seq)
        if event is not None and rng.random() < table.wrap_share:  # the JSON converter with schemas.enable
            event = {"schema": {"type": "struct", "name": "pg.public.customers.Envelope"}, "payload": event}
        return key, None if event is None else json.dumps(event).encode()

    return make


def test_json_change_events_fold_to_the_source_table_with_deletes_and_snapshot_reads(spark, pipeline):
    cfg, topic = pipeline(
        partitions=3,
        batch={"max_records_per_batch": 250},
        format={"type": "json", "schema": ROW_FIELDS, "envelope": "debezium", "debezium": {"truncate": "quarantine"}},
        write=UPSERT_BY_ID,
    )
    source = SourceTable(rows=60, wrap_share=0.3)
    produce(cfg.kafka, topic, 700, transactional_share=0.5, abort_share=0.2, seed=21, make_record=json_events(source))
    strange = JournaledProducer(cfg.kafka.bootstrap_servers)
    lsn = {"lsn": 1, "ts_ms": 0}
    for value, why in [
        ({"op": "t", "before": None, "after": None, "source": lsn}, "op 't' (a truncate)"),
        ({"op": "u", "before": None, "after": None, "source": lsn}, "op 'u' without an object in 'after'"),
        ({"op": "c", "after": {"id": 9999}, "source": {"ts_ms": 1}}, "source has no field 'lsn'"),
        ({"op": "c", "after": {"id": "x"}, "source": lsn}, "id"),
        ({"before": None, "after": {"id": 5}}, "not a change event"),
    ]:
        strange.produce(topic, json.dumps(value).encode(), key=b"{}", bad=why)
    strange.flush()

    committed = [r for r in ingest(spark, cfg) if r.status == "committed"]
    assert len(committed) >= 3
    produce(cfg.kafka, topic, 300, transactional_share=0.5, abort_share=0.2, seed=22, make_record=json_events(source))
    ingest(spark, cfg)
    rows = assert_exactly_once(cfg)

    table = DeltaTable(cfg.table_path).to_pyarrow_table().to_pylist()
    assert rows == len(table) > 0
    assert {"u", "c"} <= {r["_debezium_op"] for r in table} <= {"r", "u", "c"}
    assert all(isinstance(r["_debezium_position"], int) for r in table)
    # The change feed replays to the table and holds the deletes.
    assert sorted(r["id"] for r in change_feed_state(cfg)) == sorted(r["id"] for r in table)
    changes = pa.table(DeltaTable(cfg.table_path).load_cdf(starting_version=0).read_all()).to_pylist()
    assert any(c["_change_type"] == "delete" for c in changes)
    assert any(c["_change_type"] == "insert" and c["_debezium_op"] == "r" for c in changes)  # the snapshot


AVRO_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "pg.public.customers",
    "fields": [
        {"name": "before", "type": ["null", "Value"], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "version", "type": "string"},
                    {"name": "connector", "type": "string"},
                    {"name": "name", "type": "string"},
                    {"name": "ts_ms", "type": "long"},
                    {"name": "snapshot", "type": ["null", "string"], "default": None},
                    {"name": "db", "type": "string"},
                    {"name": "schema", "type": "string"},
                    {"name": "table", "type": "string"},
                    {"name": "txId", "type": ["null", "long"], "default": None},
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {
            "name": "transaction",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "block",
                    "namespace": "event",
                    "fields": [
                        {"name": "id", "type": "string"},
                        {"name": "total_order", "type": "long"},
                        {"name": "data_collection_order", "type": "long"},
                    ],
                },
            ],
            "default": None,
        },
    ],
}


def avro_envelope(version: int) -> dict:
    """Debezium's Avro envelope of public.customers; version 2 after `ALTER TABLE ADD COLUMN country`."""
    value = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": ["null", "string"], "default": None},
            {"name": "email", "type": ["null", "string"], "default": None},
            *([{"name": "country", "type": ["null", "string"], "default": None}] if version >= 2 else []),
        ],
    }
    schema = json.loads(json.dumps(AVRO_ENVELOPE))
    schema["fields"][0]["type"] = ["null", value]
    return schema


def avro_events(client, topic: str, table: SourceTable):
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(client, json.dumps(avro_envelope(table.version)), conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)

    def make(rng: random.Random, seq: int):
        key, event = table.event(rng, seq)
        return key, None if event is None else serialize(event, context)

    return make


def test_avro_change_events_fold_and_a_column_added_at_the_source_lands_in_its_merge(spark, pipeline, schema_registry):
    from offsetlake_local.producer import registry_client

    client = registry_client(schema_registry.url, schema_registry.user, schema_registry.password)
    registry = {"url": schema_registry.url, "username": schema_registry.user, "password": schema_registry.password}
    cfg, topic = pipeline(
        partitions=2,
        format={"type": "avro", "schema": [], "registry": registry, "envelope": "debezium"},
        write={**UPSERT_BY_ID, "order_by": "_debezium_position"},
    )
    source = SourceTable(rows=40)
    produce(cfg.kafka, topic, 400, abort_share=0.2, seed=31, make_record=avro_events(client, topic, source))
    ingest(spark, cfg)
    first_version = DeltaTable(cfg.table_path).version()
    assert_exactly_once(cfg, registry=client)
    source.version = 2
    produce(cfg.kafka, topic, 200, abort_share=0.2, seed=32, make_record=avro_events(client, topic, source))
    results = [r for r in ingest(spark, cfg) if r.status == "committed"]

    assert [r.version for r in results] == [first_version + 1]  # one MERGE, the new column in it
    fields = {f.name: f for f in DeltaTable(cfg.table_path).schema().fields}
    assert "country" in fields and "before" not in fields and "source" not in fields
    assert fields["_debezium_position"].type.type == "long"
    rows = assert_exactly_once(cfg, registry=client)
    assert 0 < rows < source.next_id - 1  # some rows deleted


def test_a_truncate_empties_the_table_in_its_batchs_commit_even_with_nothing_after_it(spark, pipeline):
    """TRUNCATE (op `t`, `format.debezium.truncate: apply`): the rows before it go; a TRUNCATE of an empty
    table, or with nothing after it in its batch, still commits its offsets (delta-rs writes no commit for a
    DELETE that removes nothing, so the ledger would never pass the batch)."""
    cfg, topic = pipeline(
        partitions=1,
        format={"type": "json", "schema": ROW_FIELDS, "envelope": "debezium"},
        write={**UPSERT_BY_ID, "order_by": "_debezium_position"},
    )
    events = JournaledProducer(cfg.kafka.bootstrap_servers)

    def send(op: str, row_id: int | None, lsn: int) -> None:
        row = None if row_id is None else {"id": row_id, "name": f"n{row_id}", "email": None}
        value = {"op": op, "before": None, "after": row, "source": {"lsn": lsn, "ts_ms": lsn}}
        events.produce(topic, json.dumps(value).encode(), key=None if row_id is None else SourceTable.key(row_id))

    for lsn, row_id in enumerate([1, 2, 3], start=10):
        send("c", row_id, lsn)
    events.flush()
    ingest(spark, cfg)
    send("c", 4, 20)
    send("t", None, 21)  # the batch ends with it: a DELETE of every row, and the offsets with it
    events.flush()
    ingest(spark, cfg)
    table = DeltaTable(cfg.table_path)
    assert table.to_pyarrow_table().num_rows == 0
    emptied = table.version()
    send("t", None, 22)  # the table is empty: nothing to delete, the offsets still commit
    events.flush()
    assert "committed" in [r.status for r in ingest(spark, cfg)]
    assert DeltaTable(cfg.table_path).version() == emptied + 1
    send("c", 5, 23)
    events.flush()
    ingest(spark, cfg)
    assert DeltaTable(cfg.table_path).to_pyarrow_table().column("id").to_pylist() == [5]
