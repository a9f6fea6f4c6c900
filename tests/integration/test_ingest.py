"""Ingest on a real broker, real Spark and real Delta tables, checked row by row against Kafka."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable

import oracle
from offsetlake.batch import ingest
from offsetlake.errors import DataLossError
from offsetlake.protocol.ledger import partition_app_id, pipeline_app_id, pipeline_history
from offsetlake.read_job import job_group
from offsetlake.table import query
from support import (
    JournaledProducer,
    assert_exactly_once,
    assert_quarantine_accounts_for_the_rest,
    ledger_offsets,
    pipeline_commits,
    produce,
    table_lineage,
    unique,
    wait_for_markers,
)


def committed(results):
    return [r for r in results if r.status == "committed"]


def test_only_committed_records_reach_the_table(spark, pipeline):
    cfg, topic = pipeline(partitions=3)
    report = produce(cfg.kafka, topic, 3000, transactional_share=0.7, abort_share=0.3, seed=11)
    assert report.aborted > 0 and report.transactions > 0  # the workload really mixes aborted transactions in

    results = ingest(spark, cfg)

    assert len(committed(results)) == 1 and results[-1].status == "up_to_date"
    assert assert_exactly_once(cfg) == report.committed
    offsets = sorted(o for _, _, o in table_lineage(cfg.table_path))
    assert offsets[-1] > report.committed / 3  # aborted records and markers took offsets: not dense


def test_rerun_with_nothing_new_makes_no_commit(spark, pipeline):
    cfg, topic = pipeline(partitions=3)
    produce(cfg.kafka, topic, 500, seed=2)
    ingest(spark, cfg)
    version = DeltaTable(cfg.table_path).version()

    results = ingest(spark, cfg)

    assert [r.status for r in results] == ["up_to_date"]
    assert DeltaTable(cfg.table_path).version() == version
    assert_exactly_once(cfg)


def test_backlog_is_split_into_batches_that_tile_the_offsets(spark, pipeline):
    cfg, topic = pipeline(partitions=3, batch={"max_records_per_batch": 700, "max_records_per_task": 150})
    produce(cfg.kafka, topic, 3000, abort_share=0.2, seed=3)

    results = ingest(spark, cfg)

    assert len(committed(results)) >= 4
    history = pipeline_commits(cfg)
    assert [h.meta.batch for h in history] == list(range(1, len(history) + 1))
    next_start: dict[tuple[str, str], int] = {}
    for h in history:
        span = 0
        for t, parts in h.meta.ranges.items():
            for p, (start, end) in parts.items():
                assert start == next_start.get((t, p), 0), f"gap or overlap at batch {h.meta.batch} {t}[{p}]"
                assert end > start
                next_start[(t, p)] = end
                span += end - start
        assert span <= 700
    assert {p: o for (_, p), o in ledger_offsets(cfg).items()} == {int(p): o for (_, p), o in next_start.items()}
    assert_exactly_once(cfg)


def test_partition_added_later_is_read_from_its_earliest_offset(spark, pipeline, bootstrap):
    cfg, topic = pipeline(partitions=2)
    produce(cfg.kafka, topic, 400, seed=4)
    ingest(spark, cfg)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result()
    producer = JournaledProducer(bootstrap)
    for i in range(50):
        producer.produce(topic, partition=2, value=json.dumps({"event_id": f"e{i}", "user_id": i}).encode())
    producer.flush(10)

    ingest(spark, cfg)

    rows = table_lineage(cfg.table_path)
    assert sorted(o for _, p, o in rows if p == 2) == list(range(50))
    assert_exactly_once(cfg)


def test_open_transaction_holds_the_batch_at_the_lso(spark, pipeline, bootstrap):
    cfg, topic = pipeline(partitions=1)
    produce(cfg.kafka, topic, 100, transactional_share=0.0, seed=5)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("open")})
    tx.init_transactions(10)
    tx.begin_transaction()
    for i in range(20):
        tx.produce(topic, value=json.dumps({"event_id": f"open{i}", "user_id": i}).encode())
    tx.flush(10)
    produce(cfg.kafka, topic, 30, settle=False, transactional_share=0.0, seed=6)  # after the open transaction

    ingest(spark, cfg)

    assert ledger_offsets(cfg)[(topic, 0)] == 100  # stops before the open transaction's first record
    assert len(table_lineage(cfg.table_path)) == 100
    tx.commit_transaction(10)
    wait_for_markers({"bootstrap.servers": bootstrap}, topic)  # the commit's markers land after its answer

    ingest(spark, cfg)

    assert len(table_lineage(cfg.table_path)) == 150
    assert_exactly_once(cfg)


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_records_deleted_below_the_ledger(spark, pipeline, bootstrap, policy):
    from confluent_kafka import TopicPartition

    cfg, topic = pipeline(partitions=1, on_data_loss=policy)
    produce(cfg.kafka, topic, 100, transactional_share=0.0, seed=7)
    ingest(spark, cfg)
    produce(cfg.kafka, topic, 100, transactional_share=0.0, seed=8)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    before = oracle.read_committed(bootstrap, topic)  # what the first hundred rows were made of
    for future in admin.delete_records([TopicPartition(topic, 0, 150)]).values():
        future.result()
    version = DeltaTable(cfg.table_path).version()

    if policy == "fail":
        with pytest.raises(DataLossError, match=rf"{topic}\[0\] offsets \[100, 150\)"):
            ingest(spark, cfg)
        assert DeltaTable(cfg.table_path).version() == version
        return
    ingest(spark, cfg)
    last = pipeline_commits(cfg)[-1]
    assert last.meta.lost == {topic: {"0": [100, 150]}}
    assert last.meta.ranges == {topic: {"0": [150, 200]}}
    offsets = sorted(o for _, _, o in table_lineage(cfg.table_path))
    assert offsets == list(range(100)) + list(range(150, 200))
    # Rows 150-199 value by value against Kafka; rows 0-99, whose records retention deleted since, against
    # the records as Kafka returned them before.
    assert_exactly_once(cfg, bounds={oracle.BEYOND_RETENTION: 100, oracle.PRODUCED_BEYOND_RETENTION: 150})
    decoder = oracle.Decoder(cfg)
    table = query(cfg.table_location, "SELECT * FROM t WHERE kafka_offset < 100 ORDER BY kafka_offset")
    for row in table.to_pylist():
        want = decoder.row(before[(topic, 0, row["kafka_offset"])], table.schema)
        assert {column: row[column] for column in want} == want, row["kafka_offset"]


def test_restore_rewinds_the_ledger_and_the_next_ingest_rereads(spark, pipeline):
    cfg, topic = pipeline(partitions=2)
    produce(cfg.kafka, topic, 300, seed=9)
    ingest(spark, cfg)
    restore_to = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 300, seed=10)
    ingest(spark, cfg)
    rows_before = len(table_lineage(cfg.table_path))

    DeltaTable(cfg.table_path).restore(restore_to)
    assert len(table_lineage(cfg.table_path)) < rows_before  # the second batch's rows are gone...
    results = ingest(spark, cfg)

    assert len(committed(results)) == 1
    last = pipeline_commits(cfg)[-1]
    assert last.meta.rewind.restored_version == restore_to
    assert len(table_lineage(cfg.table_path)) == rows_before  # ...and are back, once each
    assert_exactly_once(cfg)


def test_commit_holds_ranges_offsets_and_statistics(spark, pipeline):
    cfg, topic = pipeline(partitions=3)
    produce(cfg.kafka, topic, 900, seed=12)
    ingest(spark, cfg)

    table = DeltaTable(cfg.table_path)
    offsets = ledger_offsets(cfg)
    assert table.transaction_version(pipeline_app_id(cfg.name)) == 1
    for (t, p), offset in offsets.items():
        assert table.transaction_version(partition_app_id(cfg.name, t, p)) == offset
    meta = pipeline_history(cfg.table_location, table, cfg.name)[-1].meta
    assert meta.kind == "ingest" and meta.batch == 1 and meta.records.rows == 900
    assert meta.ranges == {topic: {str(p): [0, o] for (_, p), o in sorted(offsets.items())}}
    assert meta.run.by == "cli"
    from offsetlake.kafka import KafkaCluster

    mirrored = KafkaCluster(cfg.kafka).group_offsets(cfg.consumer_group, sorted(offsets))
    assert mirrored == offsets  # lag tools see the ledger through the consumer group
    adds = table.get_add_actions(flatten=True)
    import pyarrow as pa

    adds = pa.table(adds)
    assert sum(adds.column("num_records").to_pylist()) == 900
    assert all(v is not None for v in adds.column("min.kafka_offset").to_pylist())
    assert_exactly_once(cfg)


def test_bad_records_are_quarantined_and_every_record_is_accounted_for(spark, pipeline):
    cfg, topic = pipeline(partitions=2)
    produce(cfg.kafka, topic, 1000, bad_share=0.05, seed=21)

    results = ingest(spark, cfg)

    assert_quarantine_accounts_for_the_rest(cfg)
    assert sum(r.quarantined for r in results) > 0


def test_a_quarantine_keeps_the_headers_and_one_made_before_it_did_gains_the_column(spark, pipeline):
    """With format.include_headers the quarantine holds each bad record's headers, in order, as the table
    does (the oracle compares them). A quarantine created before it kept headers (its columns as they
    were) gains the column in the commit of its next bad records, and is read as before."""
    from offsetlake.formats.columns import QUARANTINE_SCHEMA
    from offsetlake.table import open_table

    cfg, topic = pipeline(partitions=2, format={"include_headers": True})
    open_table(cfg.quarantine_location, QUARANTINE_SCHEMA)  # as an older offsetlake left it
    producer = JournaledProducer(cfg.kafka.bootstrap_servers)
    producer.produce(topic, b"not json", key=b"k", headers=[("h", b"1"), ("h", None)], partition=0, bad="not JSON")
    producer.produce(topic, b"{}", key=b"k", headers=[("trace", b"x")], partition=1, bad="required field")
    producer.flush()
    produce(cfg.kafka, topic, 100, seed=22)

    ingest(spark, cfg)

    quarantine = DeltaTable(cfg.quarantine_path)
    assert "kafka_headers" in [f.name for f in quarantine.schema().fields]
    rows = sorted(query(cfg.quarantine_location, "SELECT kafka_partition, kafka_headers FROM t").to_pylist(), key=str)
    assert [r["kafka_headers"] for r in rows] == [[("h", b"1"), ("h", None)], [("trace", b"x")]]
    assert_exactly_once(cfg)


def test_more_ranges_than_cores_run_as_one_spark_task_per_core_and_stay_exact(spark, pipeline):
    # local[2] and six or more ranges: two Spark tasks, each reading its share of them in order, fetching the
    # next while it writes the last (tasks.run_tasks_in_order)
    cfg, topic = pipeline(partitions=3, batch={"max_records_per_task": 200})
    report = produce(cfg.kafka, topic, 1200, seed=21)
    tracker = spark.sparkContext.statusTracker()

    results = ingest(spark, cfg)

    assert len(committed(results)) == 1
    [commit] = pipeline_commits(cfg)
    [job] = tracker.getJobIdsForGroup(job_group(commit.meta.attempt))  # the batch's one job of read tasks
    [stage] = tracker.getJobInfo(job).stageIds
    assert tracker.getStageInfo(stage).numTasks == 2
    ranges = sum(-(-(hi - lo) // 200) for parts in commit.meta.ranges.values() for lo, hi in parts.values())
    assert ranges >= 6 and len(DeltaTable(cfg.table_path).file_uris()) == ranges  # a file per range, none lost
    assert assert_exactly_once(cfg) == report.committed


def test_a_small_batch_is_read_by_the_driver_and_a_larger_one_by_a_spark_job(spark, pipeline):
    # batch.driver_reads_up_to: the same reading, converting and staging, in the driver's thread, no Spark job
    cfg, topic = pipeline(partitions=3, batch={"driver_reads_up_to": 2000, "max_records_per_task": 150})
    tracker = spark.sparkContext.statusTracker()
    small = produce(cfg.kafka, topic, 600, transactional_share=0.6, abort_share=0.3, seed=31)
    assert committed(ingest(spark, cfg))
    large = produce(cfg.kafka, topic, 3000, seed=32)
    assert committed(ingest(spark, cfg))

    first, second = pipeline_commits(cfg)
    offsets = [sum(hi - lo for parts in c.meta.ranges.values() for lo, hi in parts.values()) for c in (first, second)]
    assert offsets[0] <= 2000 < offsets[1]
    assert list(tracker.getJobIdsForGroup(job_group(first.meta.attempt))) == []  # read by the driver
    assert len(tracker.getJobIdsForGroup(job_group(second.meta.attempt))) == 1  # read by a Spark job
    assert assert_exactly_once(cfg) == small.committed + large.committed
