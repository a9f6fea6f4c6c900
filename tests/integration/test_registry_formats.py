"""Avro, Protobuf and JSON Schema through a Schema Registry (real HTTP), keys and headers, schema evolution
in the same commit as the offsets: real broker, real Spark, real Delta tables, checked row by row."""
from __future__ import annotations

import io
import json
import struct

import fastavro
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from offsetlake.batch import ingest
from offsetlake.local import schema_registry as embedded_registry
from offsetlake.local.producer import DEMO_AVRO_V1, DEMO_AVRO_V2, avro_event_maker, produce, registry_client
from offsetlake.metadata import CommitMetadata
from offsetlake.table import query
from support import (assert_exactly_once, assert_one_line_failure, kafka_committed_records, quarantine_lineage,
                     run_cli)


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


def avro_pipeline(pipeline, registry, **format_extra):
    return pipeline(partitions=3, format={"type": "avro", "schema": [], "registry": registry_section(registry),
                                          "key": {"type": "string"}, "include_headers": True, **format_extra})


def rows_by_offset(cfg, columns: str) -> dict:
    table = query(cfg.table_path, f"SELECT kafka_partition, kafka_offset, {columns} FROM t")
    out = {}
    for row in table.to_pylist():
        out[(row.pop("kafka_partition"), row.pop("kafka_offset"))] = row
    return out


def test_avro_versions_mixed_in_one_batch_and_a_new_field_arrives_with_its_offsets(spark, pipeline, schema_registry,
                                                                                 registry_env, client):
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
    for (t, p, o), (key, value, headers) in truth.items():
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


def test_records_a_table_cannot_hold_are_quarantined_per_offset_with_the_reason(spark, pipeline, schema_registry,
                                                                             registry_env, client):
    cfg, topic = avro_pipeline(pipeline, schema_registry)
    produce(cfg.kafka, topic, 100, transactional_share=0, seed=1, make_record=avro_event_maker(client, topic, 1))
    ingest(spark, cfg)

    # user_id as a string: a type Delta cannot change the long column to.
    narrowed = {**DEMO_AVRO_V1, "fields": [f if f["name"] != "user_id" else {"name": "user_id", "type": "string"}
                                           for f in DEMO_AVRO_V1["fields"]]}
    narrowed_id = client.register_schema(f"{topic}-value", Schema(json.dumps(narrowed), "AVRO"))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(narrowed),
                               {"event_id": "x", "user_id": "u-1", "action": "VIEW", "amount": None,
                                "event_time": 0, "seq": 1})
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap_servers})
    bad = {
        b"\x00" + struct.pack(">I", narrowed_id) + body.getvalue(): "cannot change a column's type",
        b"\x00" + struct.pack(">I", 987654) + b"\x02": "unknown schema id 987654",
        b'{"not": "framed"}': "not in the Schema Registry wire format",
        b"\x00" + struct.pack(">I", 1) + b"\xff\xff\xff": "not a valid avro record",
    }
    for value in bad:
        producer.produce(topic, value=value, key=b"k", partition=0)
    producer.flush(10)
    produce(cfg.kafka, topic, 100, transactional_share=0, seed=2, make_record=avro_event_maker(client, topic, 1))

    ingest(spark, cfg)

    quarantine = query(cfg.quarantine_path, "SELECT kafka_offset, value, error FROM t").to_pylist()
    assert len(quarantine) == len(bad)
    for row in quarantine:
        assert bad[row["value"]] in row["error"], row
    assert len(set(quarantine_lineage(cfg))) == len(bad)
    assert_exactly_once(cfg)


def test_an_unreachable_registry_fails_the_batch_in_one_line_and_commits_nothing(tmp_path, spark, pipeline,
                                                                                pipelines_dir):
    own = embedded_registry.start(tmp_path / "own-registry", user="u", password="pw-that-must-not-print")
    env = {"REGISTRY_USER": "u", "REGISTRY_PASSWORD": "pw-that-must-not-print"}
    try:
        import os
        os.environ.update(env)
        cfg, topic = avro_pipeline(pipeline, own)
        own_client = registry_client(own.url, "u", "pw-that-must-not-print")
        produce(cfg.kafka, topic, 200, seed=3, make_record=avro_event_maker(own_client, topic, 1))
        ok = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), env=env)
        assert ok.returncode == 0, ok.stderr
        version = DeltaTable(cfg.table_path).version()
        produce(cfg.kafka, topic, 200, seed=4, make_record=avro_event_maker(own_client, topic, 2))
    finally:
        embedded_registry.stop(own.pid)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), env=env)

    assert_one_line_failure(failed, "Schema Registry at", own.url, "unreachable", "nothing was committed")
    assert "pw-that-must-not-print" not in failed.stdout + failed.stderr
    assert DeltaTable(cfg.table_path).version() == version

    again = embedded_registry.start(tmp_path / "own-registry", port=own.port, user="u", password="pw-that-must-not-print")
    try:
        done = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir), env=env)
        assert done.returncode == 0, done.stderr
        assert "pw-that-must-not-print" not in done.stdout + done.stderr
        assert_exactly_once(cfg)
        assert "country" in [f.name for f in DeltaTable(cfg.table_path).schema().fields]
    finally:
        embedded_registry.stop(again.pid)
