"""Living with a table for a year: optimize, vacuum, checkpoints and log clean-up, on a real broker,
Spark and Delta tables. Every check of the data is row by row against Kafka."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from offsetlake.batch import ingest
from offsetlake.errors import ConfigError, TableError
from offsetlake.formats.columns import table_schema
from offsetlake.operations.audit import audit, repair
from offsetlake.operations.backfill import backfill
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import checkpoint, restore, vacuum
from offsetlake.protocol.ledger import read_ledger
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.storage.parquet import write_file
from offsetlake.streaming import stream
from offsetlake.table import committed_files, query
from support import (
    assert_exactly_once,
    data_files_on_disk,
    ingest_process,
    ledger_offsets,
    pipeline_commits,
    produce,
    run_cli,
)

SMALL_BATCHES = {"max_records_per_batch": 300, "max_records_per_task": 100}


def full_rows(cfg) -> list[dict]:
    return query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_topic, kafka_partition, kafka_offset").to_pylist()


def compact(cfg, **kwargs):
    return optimize(
        cfg.table_location,
        cfg.name,
        table_schema(cfg),
        cfg.table.partition_by,
        cfg.maintenance.target_file_mb,
        **kwargs,
    )


def log_actions(cfg, version: int) -> list[dict]:
    text = (Path(cfg.table_path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_optimize_compacts_without_changing_a_row_or_the_ledger(pipeline):
    cfg, topic = pipeline(partitions=2, records=2000, ingest=True, batch=SMALL_BATCHES)
    before, ledger = full_rows(cfg), ledger_offsets(cfg)
    files_before = committed_files(cfg.table_location)

    result = compact(cfg, zorder_by=["user_id", "amount"])

    assert result.version is not None and result.files_removed == len(files_before) > result.files_added
    assert len(committed_files(cfg.table_location)) == result.files_added
    assert full_rows(cfg) == before and ledger_offsets(cfg) == ledger
    actions = log_actions(cfg, result.version)
    assert all(a[k]["dataChange"] is False for a in actions for k in ("add", "remove") if k in a)
    assert not any("txn" in a for a in actions)  # the ledger is not rewritten, only carried over
    assert pipeline_commits(cfg)[-1].meta.kind == "optimize"
    assert compact(cfg).version is None  # nothing left to compact
    assert_exactly_once(cfg)


def test_backfill_audit_and_repair_work_on_compacted_files(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=1500, ingest=True, batch=SMALL_BATCHES)
    compact(cfg)
    before = full_rows(cfg)

    result = backfill(spark, cfg, [OffsetRange(topic, 0, 50, 400)])

    assert result.files_rewritten >= 1  # the compacted file holds rows of many batches: rewritten around the range
    assert full_rows(cfg) == before
    DeltaTable(cfg.table_path).delete("kafka_partition = 1 AND kafka_offset < 30")
    assert not audit(cfg).ok
    repair(spark, cfg)
    assert audit(cfg).ok
    assert_exactly_once(cfg)


def test_optimize_running_beside_an_ingest_loses_and_duplicates_nothing(pipeline, pipelines_dir):
    cfg, topic = pipeline(
        partitions=3, records=200, ingest=True, batch={"max_records_per_batch": 150, "max_records_per_task": 50}
    )
    produce(cfg.kafka, topic, 3000, transactional_share=0.5, abort_share=0.2, seed=11)
    job = ingest_process(cfg, pipelines_dir)
    optimized = 0
    while job.poll() is None:
        optimized += compact(cfg).version is not None
        time.sleep(0.2)
    out, err = job.communicate()

    assert job.returncode == 0, err
    optimized += compact(cfg).version is not None
    assert optimized >= 2
    history = pipeline_commits(cfg)
    batches = [h.meta.batch for h in history if h.meta.kind == "ingest"]
    assert batches == list(range(1, len(batches) + 1))
    assert audit(cfg).ok
    assert_exactly_once(cfg)


def test_stream_compacts_what_it_wrote(spark, pipeline):
    cfg, topic = pipeline(
        partitions=2,
        records=100,
        batch={"max_records_per_batch": 50, "max_records_per_task": 25},
        maintenance={"compact_every_batches": 3},
    )
    stop, failures = threading.Event(), []

    def run_stream():
        try:
            stream(spark, cfg, stop, 0.2)
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread, which fails with it
            failures.append(err)

    worker = threading.Thread(target=run_stream)
    worker.start()
    try:
        _caught_up(cfg, worker, failures)
        for seed in range(4):  # each lot committed before the next: two batches of at most 50 per lot
            produce(cfg.kafka, topic, 60, transactional_share=0.0, seed=100 + seed)
            _caught_up(cfg, worker, failures)
    finally:
        stop.set()
        worker.join(300)
    assert not worker.is_alive(), "the stream did not stop within 300 s of being asked to"
    assert not failures, failures

    kinds = [h.meta.kind for h in pipeline_commits(cfg)]
    assert kinds.count("ingest") >= 6 and kinds.count("optimize") >= 1, kinds
    # Every `compact_every_batches` batches the stream folds their files together: far fewer files than batches.
    assert len(committed_files(cfg.table_location)) < kinds.count("ingest")
    assert_exactly_once(cfg)


def _caught_up(cfg, worker: threading.Thread, failures: list, timeout: float = 120) -> None:
    """Until the stream running in `worker` has committed up to the LSO of every partition."""
    deadline = time.monotonic() + timeout
    while not (DeltaTable.is_deltatable(cfg.table_path) and ledger_offsets(cfg) == _lso(cfg)):
        assert worker.is_alive() and not failures, f"the stream stopped: {failures}"
        assert time.monotonic() < deadline, f"the stream did not catch up with Kafka in {timeout} s"
        time.sleep(0.2)


def _lso(cfg) -> dict:
    from offsetlake.kafka import KafkaCluster

    cluster = KafkaCluster(cfg.kafka)
    return cluster.end_offsets(cluster.partitions(cfg.topics), "read_committed")


def test_vacuum_keeps_what_an_attempt_in_flight_or_a_restore_needs(spark, pipeline, pipelines_dir, tmp_path):
    cfg, topic = pipeline(
        partitions=2, records=1200, ingest=True, batch=SMALL_BATCHES, maintenance={"deleted_file_retention_hours": 1}
    )
    before_optimize = DeltaTable(cfg.table_path).version()
    rows_then = full_rows(cfg)
    compact(cfg)  # removes the small files: now tombstones, younger than any retention
    stale = _tombstone_from_two_hours_ago(cfg)  # the one file vacuum may delete
    # A checkpoint drops tombstones older than the table's retention: from then on only the files on
    # disk say the stale file is garbage (a "lite" vacuum, reading tombstones, would keep it forever).
    checkpoint(cfg.table_location)
    produce(cfg.kafka, topic, 300, seed=12)
    faults = tmp_path / "faults"
    zombie = ingest_process(
        cfg, pipelines_dir, {"OFFSETLAKE_FAULT": "after_files_written:pause", "OFFSETLAKE_FAULT_DIR": str(faults)}
    )
    try:
        _wait_for(faults / "after_files_written.reached", zombie)
        in_flight = data_files_on_disk(cfg.table_path) - committed_files(cfg.table_location) - _tombstoned(cfg)
        assert in_flight

        with pytest.raises(ConfigError, match="below the clean-up safety window"):
            vacuum(cfg.table_location, cfg.name, retention_hours=0)
        result = vacuum(cfg.table_location, cfg.name, retention_hours=1)

        assert result.deleted == [stale]
        assert in_flight <= data_files_on_disk(cfg.table_path)  # the attempt in flight keeps its files
    finally:
        (faults / "after_files_written.release").touch()
        zombie.communicate(timeout=300)
    assert zombie.returncode == 0
    # A RESTORE to a version inside the retention still has every file it needs.
    restore(cfg, before_optimize)
    assert full_rows(cfg) == rows_then
    ingest(spark, cfg)
    assert_exactly_once(cfg)


def _tombstone_from_two_hours_ago(cfg) -> str:
    """Test setup: an empty file written, added and removed two hours ago (no rows: the data stays
    exact). Only such a file is old enough for a one-hour vacuum."""
    empty = pa.Table.from_pylist([], schema=table_schema(cfg))
    f = write_file(cfg.table_location, "stale-empty-file.parquet", empty, {})
    table = DeltaTable(cfg.table_path)
    table.create_write_transaction(
        [AddAction(f.path, f.size, {}, f.modification_time, False, f.stats)], mode="append", schema=table_schema(cfg)
    )
    removed_at = int((time.time() - 2 * 3600) * 1000)
    DeltaTable(cfg.table_path).create_write_transaction(
        [RemoveAction(f.path, False, removed_at, f.size, None)], mode="append", schema=table_schema(cfg)
    )
    os.utime(Path(cfg.table_path) / f.path, (removed_at / 1000, removed_at / 1000))
    return f.path


def _tombstoned(cfg) -> set[str]:
    out = set()
    for path in (Path(cfg.table_path) / "_delta_log").glob("*.json"):
        for line in path.read_text().splitlines():
            if '"remove"' in line:
                out.add(json.loads(line)["remove"]["path"])
    return out


def _wait_for(path: Path, proc, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, f"never reached {path.name}"
        time.sleep(0.2)


def test_the_ledger_survives_checkpoints_and_log_clean_up(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=1500, ingest=True, batch=SMALL_BATCHES)
    DeltaTable(cfg.table_path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    ledger = ledger_offsets(cfg)

    version = checkpoint(cfg.table_location)

    log_dir = Path(cfg.table_path) / "_delta_log"
    assert not (log_dir / f"{1:020d}.json").exists()  # the commit files before the checkpoint are gone...
    assert (log_dir / f"{version:020d}.checkpoint.parquet").exists()  # ...the checkpoint holds the state
    assert read_ledger(cfg.table_location, cfg.table_location.delta_table(), cfg.name, _tps(cfg)).offsets == ledger
    # Back to a normal retention from here on (a RESTORE brings table properties back too: we restore
    # to this version, whose ledger is the checkpoint's).
    DeltaTable(cfg.table_path).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    restore_to = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 400, seed=13)
    ingest(spark, cfg)  # more batches after the checkpoint
    # A RESTORE to a version the log still holds is detected: the ledger rewinds to it, and the next
    # ingest reads those offsets again into the restored table.
    DeltaTable(cfg.table_path).restore(restore_to)
    assert read_ledger(cfg.table_location, cfg.table_location.delta_table(), cfg.name, _tps(cfg)).offsets == ledger
    ingest(spark, cfg)
    rewinds = [h.meta.rewind for h in pipeline_commits(cfg) if h.meta.rewind]
    assert [r.restored_version for r in rewinds] == [restore_to]  # the first batch after the RESTORE says so
    assert_exactly_once(cfg)


def _tps(cfg) -> list:
    from offsetlake.kafka import KafkaCluster

    return KafkaCluster(cfg.kafka).partitions(cfg.topics)


def test_a_table_that_would_expire_the_ledger_is_refused_untouched(spark, pipeline, pipelines_dir):
    cfg, topic = pipeline(partitions=1, records=50)
    DeltaTable.create(
        cfg.table_path, table_schema(cfg), configuration={"delta.setTransactionRetentionDuration": "interval 7 days"}
    )

    with pytest.raises(TableError, match="sets delta.setTransactionRetentionDuration"):
        ingest(spark, cfg)
    assert DeltaTable(cfg.table_path).version() == 0
    proc = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "setTransactionRetentionDuration" in proc.stderr


def test_tables_offsetlake_creates_set_checkpoints_and_log_retention(pipeline):
    cfg, topic = pipeline(
        partitions=1, records=20, ingest=True, maintenance={"checkpoint_interval": 7, "log_retention_days": 9}
    )
    conf = DeltaTable(cfg.table_path).metadata().configuration
    assert conf["delta.checkpointInterval"] == "7"
    assert conf["delta.logRetentionDuration"] == "interval 9 days"
    assert conf["delta.deletedFileRetentionDuration"] == "interval 168 hours"
