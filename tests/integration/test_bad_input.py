"""Bad records and bad operational input, against the real broker, Spark and Delta.

Bad records never stop a batch: they land in the quarantine table (raw bytes,
offsets, error) and the ledger covers them. Bad operational input stops the
job with one line naming the cause, a non-zero exit, and no commit.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from offsetlake.batch import ingest
from offsetlake.table import query
from offsetlake_local import broker as embedded_broker
from support import (
    JournaledProducer,
    assert_exactly_once,
    assert_lake_untouched,
    assert_one_line_failure,
    data_files_on_disk,
    ingest_process,
    new_pipeline,
    produce,
    run_cli,
    unique,
    write_pipeline,
)

pytestmark = pytest.mark.slow
BIG = 600_000  # above the pipeline's max_value_bytes below, within the broker's 1 MB message limit


def send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, str | None]]) -> None:
    """(key, value, the reason it must be quarantined with, or None), told to the oracle's journal."""
    producer = JournaledProducer(bootstrap, **{"message.max.bytes": 2_000_000})
    for key, value, bad in records:
        producer.produce(topic, value=value, key=key, partition=0, bad=bad)
    producer.flush(30)


def good(n: int, **extra) -> bytes:
    return json.dumps(
        {
            "event_id": f"e{n}",
            "user_id": n,
            "action": "view",
            "amount": 1.5,
            "event_time": "2026-11-22T10:00:00Z",
            "seq": n,
            **extra,
        }
    ).encode()


BAD_RECORDS = [  # (key, value, the error the quarantine row must carry; None = a table row)
    (b"k0", good(0), None),
    (None, good(1), None),  # null key: a normal record
    (b"k2", good(2, coupon="X1", tags=["a"]), None),  # schema drift: a new field
    (b"k3", b'{"event_id": "broken', "value is not JSON"),
    (b"k4", json.dumps({"event_id": "e4", "user_id": "4"}).encode(), "field 'user_id': expected an integer, got str"),
    (b"k5", json.dumps({"action": "view"}).encode(), "required field 'event_id' is missing or null"),
    (b"k6", b"\xff\xfe not utf-8", "value is not"),
    (b"k7", None, "value is null (tombstone)"),
    (
        b"k8",
        json.dumps({"event_id": "e8", "user_id": 8, "amount": "12.50"}).encode(),
        "field 'amount': expected a number, got str",
    ),  # drift: a declared field changed type
    (b"k9", good(9, note="x" * BIG), "above format.max_value_bytes (100000)"),
    (b"k10", json.dumps({"event_id": "e10", "user_id": None}).encode(), "required field 'user_id'"),
    (b"k11", good(11), None),
    (
        b"k12",
        b'{"event_id": "e\\ud800x", "user_id": 12}',
        "field 'event_id': text holds a lone surrogate escape",
    ),  # not Unicode
    (
        b"k13",
        b'{"event_id": "e13", "user_id": 13, "score": NaN}',
        None,
    ),  # NaN in an undeclared field: Python's JSON takes it
]
KEEP_UNKNOWN_ERRORS = {13: "undeclared fields: Out of range float values are not JSON compliant"}


@pytest.mark.parametrize("unknown_fields", ["keep", "drop"])  # drop: the fast decoder; keep: the reference only
def test_bad_records_are_quarantined_and_the_batch_goes_on(spark, bootstrap, pipelines_dir, lake, unknown_fields):
    cfg, topic = new_pipeline(
        bootstrap,
        pipelines_dir,
        lake,
        partitions=1,
        format={"unknown_fields": unknown_fields, "max_value_bytes": 100_000},
    )
    keep = unknown_fields == "keep"
    send(
        bootstrap,
        topic,
        [(k, v, KEEP_UNKNOWN_ERRORS.get(i) if keep and not e else e) for i, (k, v, e) in enumerate(BAD_RECORDS)],
    )
    produce(cfg.kafka, topic, 200, seed=3, abort_share=0.3, bad_share=0.1)  # more, among aborted transactions

    committed = [r for r in ingest(spark, cfg) if r.status == "committed"]
    assert len(committed) == 1 and committed[0].quarantined >= len([e for *_, e in BAD_RECORDS if e])
    assert_exactly_once(cfg)  # table rows + quarantine rows = every record Kafka holds, each once

    n = len(BAD_RECORDS)
    rows = query(
        cfg.quarantine_location,
        f"SELECT kafka_offset, key, value, error FROM t WHERE kafka_offset < {n} ORDER BY kafka_offset",
    ).to_pylist()
    errors = {i: e for i, (*_, e) in enumerate(BAD_RECORDS)}
    if unknown_fields == "keep":
        errors.update(KEEP_UNKNOWN_ERRORS)
    expected = {
        offset: (key, value, errors[offset]) for offset, (key, value, _) in enumerate(BAD_RECORDS) if errors[offset]
    }
    assert [r["kafka_offset"] for r in rows] == sorted(expected)
    for r in rows:
        key, value, error = expected[r["kafka_offset"]]
        assert error in r["error"], (r["kafka_offset"], r["error"])
        assert bytes(r["key"]) == key and (None if r["value"] is None else bytes(r["value"])) == value
    table = {
        r["kafka_offset"]: r for r in query(cfg.table_location, f"SELECT * FROM t WHERE kafka_offset < {n}").to_pylist()
    }
    assert sorted(table) == sorted(set(range(n)) - set(expected))
    assert table[1]["event_id"] == "e1" and table[1]["amount"] == 1.5
    if unknown_fields == "keep":
        assert json.loads(table[2]["_unknown_fields"]) == {"coupon": "X1", "tags": ["a"]}
        assert table[0]["_unknown_fields"] is None
    else:
        assert "_unknown_fields" not in table[2] and table[13]["event_id"] == "e13"

    versions = DeltaTable(cfg.table_path).version(), DeltaTable(cfg.quarantine_path).version()
    assert {r.status for r in ingest(spark, cfg)} == {"up_to_date"}
    assert (DeltaTable(cfg.table_path).version(), DeltaTable(cfg.quarantine_path).version()) == versions


def test_deleted_topic_is_named_and_nothing_is_committed(spark, bootstrap, pipelines_dir, lake):
    cfg, topic = new_pipeline(bootstrap, pipelines_dir, lake, partitions=2, records=100)
    ingest(spark, cfg)
    version = DeltaTable(cfg.table_path).version()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    proc = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, f"unknown topic '{topic}'")
    assert DeltaTable(cfg.table_path).version() == version


def test_broker_lost_mid_read_fails_in_one_line_and_leaves_nothing(tmp_path, pipelines_dir, lake):
    own = embedded_broker.start(tmp_path / "own-broker")  # this test stops its broker
    try:
        cfg, _ = new_pipeline(
            own.bootstrap_servers,
            pipelines_dir,
            lake,
            partitions=2,
            records=300,
            batch={"read_timeout_seconds": 4},
            kafka={"retry_seconds": 5},
        )
        faults = tmp_path / "faults"
        proc = ingest_process(
            cfg, pipelines_dir, env={"OFFSETLAKE_FAULT": "after_plan:pause", "OFFSETLAKE_FAULT_DIR": str(faults)}
        )
        deadline = time.monotonic() + 60
        while not (faults / "after_plan.reached").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        embedded_broker.stop(own.pid)  # the plan is made; now every read finds no broker
        (faults / "after_plan.release").touch()
        _, stderr = proc.communicate(timeout=240)
    finally:
        embedded_broker.stop(own.pid)
    lines = stderr.strip().splitlines()
    assert proc.returncode == 1 and lines[-1].startswith("offsetlake: error: ")
    assert "stalled" in lines[-1] and own.bootstrap_servers in lines[-1], lines[-1]
    assert DeltaTable(cfg.table_path).version() == 0  # created, never committed to
    assert data_files_on_disk(cfg.table_path) == set()


def test_authentication_failure_is_named(pipelines_dir, lake, bootstrap, monkeypatch):
    monkeypatch.setenv("OFFSETLAKE_TEST_PASSWORD", "pw-" + unique("s"))
    name = write_pipeline(
        pipelines_dir,
        bootstrap,
        ["t"],
        lake,
        kafka={
            "timeout_seconds": 3,
            "client": {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "offsetlake",
                "sasl.password": "${OFFSETLAKE_TEST_PASSWORD}",
            },
        },
    )
    proc = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir), timeout=60)
    assert_one_line_failure(proc, "authentication failed", "SASL")
    assert os.environ["OFFSETLAKE_TEST_PASSWORD"] not in proc.stderr + proc.stdout
    assert_lake_untouched(lake)


def test_unwritable_table_path_is_named_before_reading(bootstrap, pipelines_dir, lake, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the table's parent directory should be")
    cfg, _ = new_pipeline(
        bootstrap, pipelines_dir, lake, partitions=1, records=50, table={"path": str(blocker / "events")}
    )
    proc = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, "cannot create Delta table", str(blocker / "events"))
    assert blocker.is_file() and not Path(cfg.quarantine_path).exists()


def test_table_with_another_schema_is_refused_untouched(spark, bootstrap, pipelines_dir, lake):
    cfg, topic = new_pipeline(bootstrap, pipelines_dir, lake, partitions=1, records=50)
    ingest(spark, cfg)
    version = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 50, seed=9)
    path = pipelines_dir / f"{cfg.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["format"]["schema"][1]["type"] = "string"  # user_id: long in the table, string in the pipeline
    path.write_text(yaml.safe_dump(doc))
    proc = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, cfg.table_path, "'user_id'", "string")
    doc["format"]["schema"][1]["type"] = "long"
    doc["format"]["unknown_fields"] = "keep"  # a column the table does not have
    path.write_text(yaml.safe_dump(doc))
    proc = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, "no column '_unknown_fields'")
    assert DeltaTable(cfg.table_path).version() == version
    assert_exactly_once(cfg, caught_up=False)
