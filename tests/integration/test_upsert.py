"""Upsert mode (`write.mode: upsert`): a keyed table that is the current state of its topic.

Every check is the upsert oracle's (`oracle.check`): the table is the fold of what Kafka returns
under read_committed below the ledger (the last record per key, tombstones deleting), value by value,
the quarantine checked both ways, Kafka against what the producers recorded; and the change data feed
replays to the same table.
"""

from __future__ import annotations

import json
import os
import random
import re
import runpy
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import oracle
from offsetlake import faults
from offsetlake.batch import ingest
from offsetlake.errors import ConfigError, UpsertKeyError
from offsetlake.operations.backfill import backfill
from offsetlake.operations.changes import announcements, commits_after
from offsetlake.operations.maintenance import cleanup
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.table import committed_files
from oracle import assert_exactly_once
from support import (
    JournaledProducer,
    create_topic,
    data_files_on_disk,
    ingest_process,
    load,
    new_pipeline,
    pipeline_commits,
    produce,
    unique,
    wait_for_fault,
    write_pipeline,
)

pytestmark = pytest.mark.slow
KEYS = 40  # few keys, many records: most records update or delete a key the table holds


def keyed_event(rng: random.Random, seq: int) -> tuple[bytes, bytes | None]:
    """A user's latest state, or (one in seven) a tombstone deleting the user."""
    user = rng.randrange(1, KEYS + 1)
    if rng.random() < 1 / 7:
        return str(user).encode(), None
    event = {"event_id": f"e{seq}", "user_id": user, "action": rng.choice(["view", "buy"]), "seq": seq}
    event["amount"] = round(rng.uniform(0, 500), 2)
    return str(user).encode(), json.dumps(event).encode()


# The name offsetlake.storage.parquet.attempt_file_name gives a task's file: in upsert mode, a staging file.
STAGING = re.compile(r"part-\d{8}-[0-9a-f]{16}-t\d{5}-a\d+-\d{3}\.zstd\.parquet$")


def staging_files(cfg) -> list[str]:
    return sorted(f for f in data_files_on_disk(cfg.table_path) if STAGING.search(f))


def new_key(seq: int) -> tuple[bytes, bytes]:
    """A record of a key no other record has."""
    return f"new{seq}".encode(), json.dumps({"event_id": f"n{seq}", "user_id": 10_000 + seq, "seq": seq}).encode()


UPSERT = {"format": {"key": {"type": "string"}}, "write": {"mode": "upsert", "key": ["kafka_key"]}}


def test_updates_deletes_and_reinserts_across_batches_fold_exactly(spark, pipeline):
    cfg, topic = pipeline(partitions=3, batch={"max_records_per_batch": 400, "max_records_per_task": 150}, **UPSERT)
    produce(
        cfg.kafka,
        topic,
        1500,
        transactional_share=0.5,
        abort_share=0.25,
        seed=3,
        make_record=keyed_event,
        bad_share=0.02,
    )
    no_key = JournaledProducer(cfg.kafka.bootstrap_servers)
    for seq in range(3):  # a record without a key can never be found again: quarantined, with why
        no_key.produce(topic, json.dumps({"event_id": f"n{seq}", "user_id": 1}).encode(), bad="write.key column")
    no_key.flush()

    first = [r for r in ingest(spark, cfg) if r.status == "committed"]
    assert len(first) >= 4, "several batches, so updates and deletes cross batch boundaries"
    assert_exactly_once(cfg)
    produce(cfg.kafka, topic, 700, transactional_share=0.5, abort_share=0.25, seed=4, make_record=keyed_event)
    second = [r for r in ingest(spark, cfg) if r.status == "committed"]
    rows = assert_exactly_once(cfg)

    assert 0 < rows <= KEYS
    table = DeltaTable(cfg.table_path)
    assert table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    merged = [r.merged for r in first + second]
    assert all(m is not None for m in merged)
    assert sum(m["updated"] for m in merged) > 0 and sum(m["deleted"] for m in merged) > 0
    # The Asset events say what the MERGEs did, as the batches reported it.
    events = announcements(cfg.name, cfg.table_path, commits_after(cfg.table_location, 0))
    ingests = [e for e in events if e["kind"] == "ingest"]
    for count in ("inserted", "updated", "deleted"):
        assert sum(e[count] for e in ingests) == sum(m[count] for m in merged)
    # The staging files went (the tasks' files, named by their attempt): the table holds the MERGEs' own.
    assert staging_files(cfg) == [] and committed_files(cfg.table_location)
    # cleanup keeps what the change feed reads (the MERGEs' _change_data files), however old.
    for path in Path(cfg.table_path).rglob("*.parquet"):
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    cleanup(cfg.table_location, 3600)
    assert list(Path(cfg.table_path).glob("_change_data/*.parquet"))
    assert_exactly_once(cfg)


def test_a_batch_that_changes_no_row_still_commits_its_offsets(spark, pipeline):
    """delta-rs writes no commit for a MERGE that changes nothing: the offsets must commit anyway, or the
    ledger never passes the batch and every run plans it again."""
    cfg, topic = pipeline(partitions=1, **UPSERT)
    produce(cfg.kafka, topic, 50, transactional_share=0, seed=70, make_record=keyed_event)
    ingest(spark, cfg)
    ghosts = JournaledProducer(cfg.kafka.bootstrap_servers)
    for seq in range(5):  # tombstones of keys the table never held: nothing to delete
        ghosts.produce(topic, None, key=f"ghost{seq}".encode())
    ghosts.flush()
    version = DeltaTable(cfg.table_path).version()

    results = ingest(spark, cfg)

    (result,) = [r for r in results if r.status != "up_to_date"]
    assert result.status == "committed" and result.version == version + 1
    assert DeltaTable(cfg.table_path).version() == version + 1
    assert result.merged == {"inserted": 0, "updated": 0, "deleted": 0}
    assert [r.status for r in ingest(spark, cfg)] == ["up_to_date"]  # the ledger passed it
    assert_exactly_once(cfg)


def test_a_merge_reads_only_the_files_its_batch_key_range_can_touch(spark, pipeline):
    """Keys that grow (an auto-increment id, as Debezium streams them) fill files with narrow key ranges;
    a batch updating recent keys must rewrite those files only, not read the whole table."""
    cfg, topic = pipeline(
        partitions=1, batch={"max_records_per_batch": 100}, write={"mode": "upsert", "key": ["user_id"]}
    )
    producer = JournaledProducer(cfg.kafka.bootstrap_servers)
    for user in range(400):
        producer.produce(topic, json.dumps({"event_id": f"i{user}", "user_id": user, "seq": 0}).encode())
    producer.flush()
    ingest(spark, cfg)
    files_before = len(committed_files(cfg.table_location))
    for seq, user in enumerate(range(350, 360)):
        producer.produce(topic, json.dumps({"event_id": f"u{user}", "user_id": user, "seq": seq + 1}).encode())
    producer.flush()
    ingest(spark, cfg)

    metrics = DeltaTable(cfg.table_path).history(1)[0]["operationMetrics"]
    assert metrics["num_target_rows_updated"] == 10
    assert files_before >= 4 and metrics["num_target_files_scanned"] == 1, metrics
    assert metrics["num_target_files_skipped_during_scan"] == files_before - 1
    assert_exactly_once(cfg)


def test_a_key_in_two_partitions_fails_the_batch_in_one_line_unless_order_by_decides(
    spark, bootstrap, pipelines_dir, lake
):
    topic = unique("t")
    create_topic(bootstrap, topic, 2)
    producer = JournaledProducer(bootstrap)
    sends = [("a", 0, 5), ("a", 1, 9), ("b", 0, 1), ("a", 0, 7), ("b", 1, 3)]  # (key, partition, seq)
    for key, partition, seq in sends:
        value = {"event_id": f"{key}{seq}", "user_id": 1, "seq": seq}
        producer.produce(topic, json.dumps(value).encode(), key=key.encode(), partition=partition)
    # A bad record in the same batch: a refusal that came after the quarantine's commit would leave it there.
    producer.produce(topic, b"not json", key=b"c", partition=0, bad="value is not JSON")
    producer.flush()

    strict = load(pipelines_dir, write_pipeline(pipelines_dir, bootstrap, [topic], lake, **UPSERT))
    with pytest.raises(UpsertKeyError) as refused:
        ingest(spark, strict)
    message = str(refused.value)
    assert "\n" not in message and "key kafka_key='a'" in message and "write.order_by" in message, message
    assert pipeline_commits(strict) == []  # nothing written, the quarantine's commit included
    assert not DeltaTable.is_deltatable(strict.quarantine_path)

    ordered = {"write": {**UPSERT["write"], "order_by": "seq", "deletes": "ignore"}}
    cfg = load(pipelines_dir, write_pipeline(pipelines_dir, bootstrap, [topic], lake, **{**UPSERT, **ordered}))
    ingest(spark, cfg)
    assert_exactly_once(cfg)
    assert _seq_of(cfg, "a") == 9 and _seq_of(cfg, "b") == 3
    # Across batches too: an older value arriving later does not replace a newer one.
    producer.produce(topic, json.dumps({"event_id": "a6", "user_id": 1, "seq": 6}).encode(), key=b"a", partition=0)
    producer.produce(topic, json.dumps({"event_id": "b4", "user_id": 1, "seq": 4}).encode(), key=b"b", partition=0)
    producer.flush()
    ingest(spark, cfg)
    assert_exactly_once(cfg)
    assert _seq_of(cfg, "a") == 9 and _seq_of(cfg, "b") == 4


def _seq_of(cfg, key: str) -> int:
    (row,) = [r for r in DeltaTable(cfg.table_path).to_pyarrow_table().to_pylist() if r["kafka_key"] == key]
    return row["seq"]


@pytest.mark.long
def test_an_upsert_job_killed_at_every_fault_point_then_two_runs_at_once_fold_exactly(spark, pipeline, pipelines_dir):
    cfg, topic = pipeline(partitions=2, **UPSERT)
    produce(cfg.kafka, topic, 600, transactional_share=0.5, abort_share=0.2, seed=5, make_record=keyed_event)
    ingest(spark, cfg)
    for i, point in enumerate(faults.POINTS):
        produce(cfg.kafka, topic, 150, transactional_share=0.5, abort_share=0.2, seed=50 + i, make_record=keyed_event)
        commits = len(pipeline_commits(cfg))
        job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": f"{point}:exit"})
        job.communicate(timeout=300)
        assert job.returncode == -signal.SIGKILL, f"the job was not killed at {point}"
        assert len(pipeline_commits(cfg)) == commits + (point == "after_commit")
        # Below the ledger the table is the fold, whatever the kill left: a quarantine commit may be ahead, by
        # at most the bad records of the one batch killed (150 records, of which 1% bad: a few).
        assert_exactly_once(cfg, caught_up=False, quarantine_ahead=True, bounds={oracle.QUARANTINE_AHEAD: 10})

    # Two runs at once: the ledger lets the batch in once.
    produce(cfg.kafka, topic, 150, transactional_share=0.5, abort_share=0.2, seed=60, make_record=keyed_event)
    jobs = [ingest_process(cfg, pipelines_dir) for _ in range(2)]
    outcomes = [job.communicate(timeout=300) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], [err[-2000:] for _, err in outcomes]
    assert "committed" in "".join(out for out, _ in outcomes)
    assert_exactly_once(cfg)


def test_an_upsert_zombie_finds_its_batch_committed_and_merges_nothing(spark, pipeline, pipelines_dir, tmp_path):
    cfg, topic = pipeline(partitions=2, **UPSERT)
    produce(cfg.kafka, topic, 600, transactional_share=0.5, abort_share=0.2, seed=7, make_record=keyed_event)
    fault_dir = tmp_path / "faults"
    zombie = ingest_process(
        cfg, pipelines_dir, {"OFFSETLAKE_FAULT": "before_commit:pause", "OFFSETLAKE_FAULT_DIR": str(fault_dir)}
    )
    wait_for_fault(fault_dir / "before_commit.reached", zombie)

    ingest(spark, cfg)  # the retry commits the batch
    version = DeltaTable(cfg.table_path).version()
    (fault_dir / "before_commit.release").touch()
    out, err = zombie.communicate(timeout=300)

    assert zombie.returncode == 0, err
    assert "batch 1: already_committed" in out
    assert DeltaTable(cfg.table_path).version() == version
    assert staging_files(cfg) == []
    assert_exactly_once(cfg)


def test_audit_checks_the_table_against_the_fold_and_repair_rebuilds_it_in_one_commit_keeping_the_ledger(
    spark, pipeline, bootstrap
):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from offsetlake.operations.audit import audit, repair
    from oracle import ledger_offsets

    cfg, topic = pipeline(partitions=2, table={"partition_by": ["kafka_partition"]}, **UPSERT)
    lonely = JournaledProducer(cfg.kafka.bootstrap_servers)
    for seq in range(5):  # keys no later record touches, first in partition 0: retention will delete them
        key, value = new_key(seq)
        lonely.produce(topic, value, key=key, partition=0)
    lonely.flush()
    produce(cfg.kafka, topic, 600, transactional_share=0.5, abort_share=0.2, seed=17, make_record=keyed_event)
    ingest(spark, cfg)
    assert_exactly_once(cfg)
    report = audit(cfg)
    assert report.ok, report.format()
    assert report.keys == report.table_rows == DeltaTable(cfg.table_path).to_pyarrow_table().num_rows
    with pytest.raises(ConfigError, match="upsert mode .*backfill is not defined"):
        backfill(spark, cfg, [OffsetRange(topic, 0, 0, 10)])

    # Another tool damages the table: a row deleted, a value changed, a row of no record added.
    table = DeltaTable(cfg.table_path)
    rows = table.to_pyarrow_table().to_pylist()
    gone, changed = rows[0]["kafka_key"], next(r["kafka_key"] for r in rows[1:] if r["amount"] is not None)
    table.delete(f"kafka_key = '{gone}'")
    DeltaTable(cfg.table_path).update({"amount": "amount + 1"}, predicate=f"kafka_key = '{changed}'")
    stray = pa.Table.from_pylist([{**rows[2], "kafka_key": "stray"}], pa.schema(table.schema().to_arrow()))
    write_deltalake(cfg.table_path, stray, mode="append")
    ledger = ledger_offsets(cfg)

    # The oracle's own fold sees each damage, by key (the test's truth: not the product's audit)...
    found = oracle.check(cfg, ledger)
    named = {kind: [message for _, message in found.kinds.get(kind, [])] for kind in found.kinds}
    assert [m for m in named.get(oracle.MISSING, []) if gone in m], found.report()
    assert [m for m in named.get(oracle.WRONG_VALUE, []) if changed in m and "'amount'" in m], found.report()
    assert [m for m in named.get(oracle.UNEXPECTED, []) if "stray" in m], found.report()
    assert found.count(oracle.MISSING, oracle.WRONG_VALUE, oracle.UNEXPECTED) == 3, found.report()
    # ... and offsetlake's audit reports the same three.
    damaged = audit(cfg)
    assert not damaged.ok
    assert (damaged.missing, damaged.wrong, damaged.unexpected) == ([f'["{gone}"]'], [f'["{changed}"]'], ['["stray"]'])
    version = DeltaTable(cfg.table_path).version()
    _, result = repair(spark, cfg)

    assert result.version == version + 1 and DeltaTable(cfg.table_path).version() == version + 1
    assert ledger_offsets(cfg) == ledger  # the ledger where it stood
    assert audit(cfg).ok
    assert_exactly_once(cfg)  # the oracle's own fold: the table is it again, and the change feed replays to it

    # Retention deletes partition 0's head: rows whose record is gone are counted, not taken for damage.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.delete_records([TopicPartition(topic, 0, 20)]).values()
    future.result()
    produce(cfg.kafka, topic, 100, transactional_share=0, seed=18, make_record=keyed_event)
    assert "committed" in [r.status for r in ingest(spark, cfg)]  # the pipeline goes on from the ledger
    later = audit(cfg)
    assert later.ok and later.beyond_retention == 5, later.format()


@pytest.fixture(scope="module")
def upserted(spark, bootstrap, tmp_path_factory):
    """A real upsert table (updates, deletes, aborted and bad records) and the Kafka records it folds."""
    base = tmp_path_factory.mktemp("upsert-oracle")
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=2, **UPSERT)
    produce(
        cfg.kafka, topic, 400, transactional_share=0.5, abort_share=0.2, seed=8, make_record=keyed_event, bad_share=0.05
    )
    ingest(spark, cfg)
    assert oracle.check(cfg).ok and oracle.change_feed_replays(cfg)
    return cfg, oracle.read_committed(cfg.kafka.bootstrap_servers, topic)


def _where(row) -> tuple:
    return (row["kafka_topic"], row["kafka_partition"], row["kafka_offset"])


def _key_is(key: str) -> str:
    return f"kafka_key = '{key}'"


def _rows(path: str) -> list[dict]:
    return sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=lambda r: r["kafka_key"])


def _append_like(path: str, row: dict, **changes) -> None:
    """A row in the table's own schema: `row` with `changes`."""
    schema = DeltaTable(path).to_pyarrow_table().schema
    write_deltalake(path, pa.Table.from_pylist([{**row, **changes}], schema=schema), mode="append")


def a_field_changed(path, rows, kafka):
    DeltaTable(path).update(predicate=_key_is(rows[0]["kafka_key"]), updates={"amount": "amount + 0.01"})
    return oracle.WRONG_VALUE, _where(rows[0])


def an_older_record_wins(path, rows, kafka):
    """The row claims an earlier record of its key than the fold's winner."""
    row = next(r for r in rows if _older_of_key(r, kafka) is not None)
    older = _older_of_key(row, kafka)
    DeltaTable(path).update(predicate=_key_is(row["kafka_key"]), updates={"kafka_offset": str(older[2])})
    return oracle.WRONG_VALUE, older


def a_key_twice(path, rows, kafka):
    _append_like(path, rows[2])
    return oracle.DUPLICATED, _where(rows[2])


def a_key_removed(path, rows, kafka):
    DeltaTable(path).delete(_key_is(rows[0]["kafka_key"]))
    return oracle.MISSING, _where(rows[0])


def a_deleted_key_come_back(path, rows, kafka):
    """A row for a key whose last record is a tombstone, at the tombstone's offset."""
    last = {}
    for where, record in sorted(kafka.items()):
        last[record.key] = (where, record)
    key, (where, _) = next((k, v) for k, v in sorted(last.items()) if v[1].value is None)
    _append_like(path, rows[3], kafka_key=key.decode(), kafka_partition=where[1], kafka_offset=where[2])
    return oracle.UNEXPECTED, where


def a_stray_key(path, rows, kafka):
    _append_like(path, rows[4], kafka_key="stray")
    return oracle.UNEXPECTED, _where(rows[4])


def values_of_another_record(path, rows, kafka):
    """A key's row holding another key's values (its lineage its own)."""
    a, b = rows[5], rows[6]
    DeltaTable(path).update(predicate=_key_is(a["kafka_key"]), updates={"event_id": f"'{b['event_id']}'"})
    return oracle.WRONG_VALUE, _where(a)


def _older_of_key(row: dict, kafka: dict) -> tuple | None:
    """An offset before the row's holding a record of the row's key with a value, if any."""
    key = row["kafka_key"].encode()
    older = [w for w, r in kafka.items() if r.key == key and r.value is not None and w[:2] == _where(row)[:2]]
    older = [w for w in older if w[2] < row["kafka_offset"]]
    return max(older) if older else None


UPSERT_CORRUPTIONS = [
    a_field_changed,
    an_older_record_wins,
    a_key_twice,
    a_key_removed,
    a_deleted_key_come_back,
    a_stray_key,
    values_of_another_record,
]


@pytest.mark.parametrize("corrupt", UPSERT_CORRUPTIONS, ids=lambda corrupt: corrupt.__name__)
def test_the_upsert_oracle_fails_each_corruption_naming_its_offset(upserted, tmp_path, corrupt):
    """The upsert oracle proved: a copy of a real upsert table, corrupted one way, fails with a finding of
    its kind naming the offset of the row (or of the record the fold expects)."""
    from test_oracle import copy_of

    cfg, kafka = upserted
    bad = copy_of(cfg, tmp_path, corrupt.__name__)
    kind, where = corrupt(bad.table_path, _rows(bad.table_path), kafka)

    findings = oracle.check(bad)

    assert where in [w for w, _ in findings.kinds.get(kind, [])], findings.report()


def test_the_upsert_oracle_fails_a_change_feed_that_does_not_replay_to_the_table(upserted, tmp_path):
    """The table right, its change data feed not: a commit that changes no row but records, in a change
    file, the delete of a key the table holds. The fold finds nothing; the replay does, and
    `assert_exactly_once` fails naming the feed."""
    import pyarrow.parquet as pq
    from test_oracle import copy_of

    cfg, _ = upserted
    bad = copy_of(cfg, tmp_path, "feed")
    table = DeltaTable(bad.table_path)
    deleted = table.to_pyarrow_table().slice(0, 1)
    change = Path(bad.table_path) / "_change_data" / "not-a-real-delete.parquet"
    change.parent.mkdir(exist_ok=True)
    pq.write_table(deleted.append_column("_change_type", pa.array(["delete"])), change)
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}},
        {
            "cdc": {
                "path": f"_change_data/{change.name}",
                "partitionValues": {},
                "size": change.stat().st_size,
                "dataChange": False,
            }
        },
    ]
    log = Path(bad.table_path) / "_delta_log" / f"{table.version() + 1:020d}.json"
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))

    assert oracle.check(bad).ok
    assert not oracle.change_feed_replays(bad)
    with pytest.raises(AssertionError, match="change data feed does not replay"):
        assert_exactly_once(bad)


def test_the_docs_change_feed_example_counts_what_the_batches_did(spark, pipeline, capsys, monkeypatch):
    """docs/examples/integrations/change_feed.py on a real upsert table of two batches, the second updating
    and deleting keys of the first: every kind of change is there, pre- and post-images paired, and the
    inserts at least as many as the rows the table holds (each row was inserted once)."""
    cfg, topic = pipeline(partitions=2, **UPSERT)
    for seed in (21, 22):
        produce(cfg.kafka, topic, 300, transactional_share=0.5, abort_share=0.2, seed=seed, make_record=keyed_event)
        ingest(spark, cfg)
    monkeypatch.setenv("OFFSETLAKE_TABLE", cfg.table_path)
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "docs/examples/integrations/change_feed.py"))
    counts = {kind: int(n) for kind, n in re.findall(r"│ (\w+)\s+┆ (\d+)", capsys.readouterr().out)}
    assert set(counts) == {"insert", "update_preimage", "update_postimage", "delete"}, counts
    assert counts["update_preimage"] == counts["update_postimage"]
    assert counts["insert"] >= DeltaTable(cfg.table_path).to_pyarrow_table().num_rows > 0


def test_a_restore_rewinds_the_upserts_and_optimize_keeps_the_fold(spark, pipeline):
    from offsetlake.formats.columns import table_schema
    from offsetlake.operations.compaction import optimize
    from offsetlake.operations.maintenance import restore

    cfg, topic = pipeline(partitions=2, batch={"max_records_per_batch": 200}, **UPSERT)
    produce(cfg.kafka, topic, 300, transactional_share=0.5, abort_share=0.2, seed=9, make_record=keyed_event)
    ingest(spark, cfg)
    early = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 300, transactional_share=0.5, abort_share=0.2, seed=10, make_record=keyed_event)
    ingest(spark, cfg)

    restore(cfg, early)  # the table and its ledger as they were: the later batches are undone
    assert oracle.check(cfg).ok
    again = [r for r in ingest(spark, cfg) if r.status == "committed"]  # and folded again from Kafka
    assert again
    assert_exactly_once(cfg)

    # New keys only: a MERGE that matches nothing adds a file beside the table's (matches rewrite theirs).
    produce(cfg.kafka, topic, 50, transactional_share=0, seed=11, make_record=lambda rng, seq: new_key(seq))
    ingest(spark, cfg)
    files_before = len(committed_files(cfg.table_location))
    outcome = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], 128)
    assert outcome.version is not None and len(committed_files(cfg.table_location)) < files_before
    assert_exactly_once(cfg)


def test_avro_upserts_fold_and_a_new_field_lands_in_the_merge_of_its_offsets(spark, pipeline, schema_registry):
    """Records written by confluent-kafka's AvroSerializer through the registry; version 2 of the schema
    adds a field in the middle of the stream, and tombstones delete."""
    from offsetlake_local.producer import avro_event_maker, registry_client

    client = registry_client(schema_registry.url, schema_registry.user, schema_registry.password)
    registry = {"url": schema_registry.url, "username": schema_registry.user, "password": schema_registry.password}
    cfg, topic = pipeline(
        partitions=2,
        format={"type": "avro", "schema": [], "registry": registry, "key": {"type": "string"}},
        write=UPSERT["write"],
    )

    def few_keys(version: int):
        make = avro_event_maker(client, topic, version, headers=False)

        def made(rng, seq):
            _, value, _ = make(rng, seq)
            return str(rng.randrange(1, 30)).encode(), None if rng.random() < 0.1 else value

        return made

    produce(cfg.kafka, topic, 300, abort_share=0.2, seed=12, make_record=few_keys(1))
    ingest(spark, cfg)
    first_version = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 150, abort_share=0.2, seed=13, make_record=few_keys(1))
    produce(cfg.kafka, topic, 150, abort_share=0.2, seed=14, make_record=few_keys(2))
    results = [r for r in ingest(spark, cfg) if r.status == "committed"]

    assert [r.version for r in results] == [first_version + 1]  # one MERGE, the new column in it
    assert "country" in [f.name for f in DeltaTable(cfg.table_path).schema().fields]
    assert "country" not in [f.name for f in DeltaTable(cfg.table_path, version=first_version).schema().fields]
    assert_exactly_once(cfg, registry=client)
