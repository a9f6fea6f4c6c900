"""Backfill, audit, repair, cleanup, reset and restore on a real broker, Spark and Delta tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake

from offsetlake.batch import ingest
from offsetlake.errors import ConfigError, DataLossError
from offsetlake.formats.columns import table_schema
from offsetlake.operations.audit import audit, repair
from offsetlake.operations.backfill import backfill
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import cleanup, reset, restore
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.table import committed_files, query
from support import (
    assert_exactly_once,
    assert_rows_are_kafkas_except,
    data_files_on_disk,
    ingest_process,
    ledger_offsets,
    pipeline_commits,
    produce,
    wait_while_running,
)


def full_rows(cfg) -> list[dict]:
    return query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_topic, kafka_partition, kafka_offset").to_pylist()


def test_backfill_twice_gives_the_same_table_row_by_row(spark, pipeline):
    """On a table partitioned by an int column (Delta keeps partition values as text in its actions)."""
    cfg, topic = pipeline(
        records=1000,
        ingest=True,
        batch={"max_records_per_batch": 400, "max_records_per_task": 150},
        table={"partition_by": ["kafka_partition"]},
    )
    before = full_rows(cfg)
    ledger = ledger_offsets(cfg)
    ranges = [OffsetRange(topic, 0, 37, 301), OffsetRange(topic, 1, 0, ledger[(topic, 1)])]

    first = backfill(spark, cfg, ranges)
    second = backfill(spark, cfg, ranges)

    assert first.status == second.status == "committed"
    assert first.rows_removed == first.rows_added == second.rows_added > 0
    assert first.files_rewritten > 0  # boundary files at offsets 37 and 301 were rewritten
    assert full_rows(cfg) == before
    assert ledger_offsets(cfg) == ledger  # backfill never moves the ledger
    kinds = [h.meta.kind for h in pipeline_commits(cfg)]
    assert kinds[-2:] == ["backfill", "backfill"]
    assert_exactly_once(cfg)
    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), cfg.table.partition_by, 128)
    assert compacted.files_removed > compacted.files_added > 0
    assert full_rows(cfg) == before


def test_backfill_dry_run_changes_nothing(pipeline):
    cfg, topic = pipeline(records=1000, ingest=True)
    version = DeltaTable(cfg.table_path).version()
    result = backfill(None, cfg, [OffsetRange(topic, 0, 0, 100)], dry_run=True)
    assert result.status == "dry_run" and result.rows_removed > 0
    assert DeltaTable(cfg.table_path).version() == version


def test_backfill_refuses_bad_ranges_before_reading(pipeline, bootstrap):
    cfg, topic = pipeline(records=1000, ingest=True)
    end = ledger_offsets(cfg)[(topic, 0)]
    version = DeltaTable(cfg.table_path).version()
    cases = [
        ([OffsetRange(topic, 0, 10, end + 1)], ConfigError, "past the ledger's committed end"),
        ([OffsetRange(topic, 0, 50, 10)], ConfigError, "end must be greater than start"),
        ([OffsetRange(topic, 9, 0, 10)], ConfigError, "unknown partition"),
        ([OffsetRange("other", 0, 0, 10)], ConfigError, "not read by pipeline"),
        ([OffsetRange(topic, 0, 0, 50), OffsetRange(topic, 0, 40, 60)], ConfigError, "overlap"),
    ]
    for ranges, error, text in cases:
        with pytest.raises(error, match=text):
            backfill(None, cfg, ranges)
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result()
    with pytest.raises(DataLossError, match=r"offsets \[0, 20\) are no longer in Kafka"):
        backfill(None, cfg, [OffsetRange(topic, 0, 0, 50)])
    assert DeltaTable(cfg.table_path).version() == version


def test_backfill_while_ingest_runs_is_exact(spark, pipeline, pipelines_dir):
    cfg, topic = pipeline(records=800, ingest=True, batch={"max_records_per_batch": 100, "max_records_per_task": 50})
    produce(cfg.kafka, topic, 2000, seed=77)
    before = DeltaTable(cfg.table_path).version()
    job = ingest_process(cfg, pipelines_dir)  # 20 batches of 100
    try:
        wait_while_running(lambda: DeltaTable(cfg.table_path).version() > before, job)  # its first batch is in
        for _ in range(3):
            backfill(spark, cfg, [OffsetRange(topic, 0, 0, 200), OffsetRange(topic, 1, 100, 250)])
    finally:
        out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    # They overlapped: the ingest committed batches both before the first backfill and after it.
    kinds = [h.meta.kind for h in pipeline_commits(cfg) if h.version > before]
    first_backfill = kinds.index("backfill")
    assert kinds.count("backfill") == 3 and "ingest" in kinds[:first_backfill], kinds
    assert "ingest" in kinds[first_backfill:], kinds
    assert_exactly_once(cfg)


def test_a_backfill_whose_range_a_restore_hands_back_to_ingest_meanwhile_is_refused(
    spark, pipeline, pipelines_dir, tmp_path
):
    """Found by chaos (seed 31337): the backfill checked its ranges against the ledger when it planned,
    a restore then moved the ledger back below them, and the backfill added rows the next ingest read
    again. Now every snapshot the commit is decided on is checked."""
    cfg, topic = pipeline(partitions=1, records=600, batch={"max_records_per_batch": 300})
    ingest(spark, cfg)
    first = pipeline_commits(cfg)[0]
    after_first = first.meta.ranges[topic]["0"][1]
    end = ledger_offsets(cfg)[(topic, 0)]
    assert after_first < end
    faults = tmp_path / "faults"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offsetlake.cli",
            "backfill",
            "--pipeline",
            cfg.name,
            "--pipelines-dir",
            str(pipelines_dir),
            "--ranges",
            f"{topic}:0:{after_first - 50}-{end}",
        ],
        env={**os.environ, "OFFSETLAKE_FAULT": "before_commit:pause", "OFFSETLAKE_FAULT_DIR": str(faults)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not (faults / "before_commit.reached").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.stderr.read() if job.poll() is not None else ""
        time.sleep(0.2)

    restore(cfg, first.version)  # [after_first, end) is ingest's again
    (faults / "before_commit.release").touch()
    out, err = job.communicate(timeout=300)

    assert job.returncode != 0, out
    assert "ledger moved back while the backfill ran" in err and "ingest owns those offsets" in err, err[-2000:]
    assert pipeline_commits(cfg)[-1].meta.kind == "restore"  # the backfill committed nothing
    ingest(spark, cfg)
    assert_exactly_once(cfg)


def test_audit_finds_damage_and_repair_fixes_it(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=1200, ingest=True)
    assert audit(cfg).ok
    table = DeltaTable(cfg.table_path)
    table.delete("kafka_partition = 0 AND kafka_offset >= 100 AND kafka_offset < 130")
    copies = query(cfg.table_location, "SELECT * FROM t WHERE kafka_partition = 1 AND kafka_offset < 25")
    write_deltalake(cfg.table_path, copies, mode="append")

    report = audit(cfg)

    assert not report.ok
    by_partition = {p.partition: p for p in report.partitions}
    assert by_partition[0].missing and all(100 <= o < 130 for o in by_partition[0].missing)
    assert by_partition[1].duplicated == sorted(copies.column("kafka_offset").to_pylist())
    assert not by_partition[0].duplicated and not by_partition[1].missing

    _, result = repair(spark, cfg)

    assert result is not None and result.status == "committed"
    assert audit(cfg).ok
    assert_exactly_once(cfg)


def test_cleanup_removes_a_killed_attempts_files_and_keeps_committed_ones(spark, pipeline, pipelines_dir):
    cfg, topic = pipeline(records=1000, ingest=True)
    produce(cfg.kafka, topic, 300, seed=5)
    job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": "after_files_written:exit"})
    job.communicate(timeout=300)
    assert job.returncode == -signal.SIGKILL
    committed = committed_files(cfg.table_location)
    orphans = data_files_on_disk(cfg.table_path) - committed
    assert orphans
    assert cleanup(cfg.table_location, older_than_seconds=3600).deleted == []  # too young: maybe in flight
    old = time.time() - 7200
    for name in data_files_on_disk(cfg.table_path):
        os.utime(Path(cfg.table_path) / name, (old, old))

    result = cleanup(cfg.table_location, older_than_seconds=3600)

    assert set(result.deleted) == orphans
    assert data_files_on_disk(cfg.table_path) == committed
    ingest(spark, cfg)
    assert_exactly_once(cfg)


def test_reset_is_recorded_and_the_next_ingest_starts_there(spark, pipeline):
    cfg, topic = pipeline(partitions=1, records=300, ingest=True)
    end = ledger_offsets(cfg)[(topic, 0)]
    produce(cfg.kafka, topic, 200, transactional_share=0.0, seed=3)
    skip_to = end + 50

    version = reset(cfg, {(topic, 0): skip_to}, "skip 50 poison records")
    ingest(spark, cfg)

    history = pipeline_commits(cfg)
    reset_commit = next(h for h in history if h.version == version)
    assert reset_commit.meta.kind == "reset" and reset_commit.meta.reason == "skip 50 poison records"
    assert history[-1].meta.kind == "ingest" and history[-1].meta.ranges[topic]["0"][0] == skip_to
    assert_rows_are_kafkas_except(cfg, topic, 0, range(end, skip_to))  # before the reset and after it, row by row
    with pytest.raises(ConfigError, match="needs a reason"):
        reset(cfg, {(topic, 0): 0}, "  ")
    with pytest.raises(ConfigError, match="outside what Kafka holds"):
        reset(cfg, {(topic, 0): 10**9}, "too far")


def test_offsetlake_restore_rewinds_in_the_same_commit(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=400, ingest=True)
    version = DeltaTable(cfg.table_path).version()
    produce(cfg.kafka, topic, 400, seed=8)
    ingest(spark, cfg)
    rows = len(full_rows(cfg))

    restored = restore(cfg, version)

    last = pipeline_commits(cfg)[-1]
    assert last.version == restored and last.meta.kind == "restore" and last.meta.restored_version == version
    assert len(full_rows(cfg)) < rows
    ingest(spark, cfg)
    reread = pipeline_commits(cfg)[-1]
    assert reread.meta.kind == "ingest" and reread.meta.rewind is None  # the restore commit already rewound
    assert len(full_rows(cfg)) == rows
    assert_exactly_once(cfg)


def test_restore_after_an_operator_restore_takes_the_ledger_of_the_version_asked_for(spark, pipeline):
    """Found by the chaos harness: the ledger "as of version 1" followed a RESTORE committed later
    (history() lists the whole log even for a table loaded at an old version), so the rewind went
    to the wrong offsets and 6,500 records were never read again."""
    cfg, topic = pipeline(partitions=2, records=300, ingest=True)  # version 1
    first = ledger_offsets(cfg)
    for seed in (11, 12):
        produce(cfg.kafka, topic, 300, seed=seed)
        ingest(spark, cfg)  # versions 2, 3
    DeltaTable(cfg.table_path).restore(2)  # an operator's RESTORE, no ledger of its own: version 4

    restore(cfg, 1)

    last = pipeline_commits(cfg)[-1]
    assert last.meta.offsets == {topic: {str(p): o for (_, p), o in first.items()}}
    assert ledger_offsets(cfg) == first
    ingest(spark, cfg)
    assert_exactly_once(cfg)


def test_an_operators_restore_is_recorded_before_a_checkpoint_can_clean_its_target_out_of_the_log(spark, pipeline):
    """Found by the chaos harness on the delta-spark engine: an operator's RESTORE, then a commit that was not
    a batch's cleaned the log up past the restored version before any batch recorded the ledger as of it, and
    the ledger could no longer be read. offsetlake's checkpoint (and optimize, vacuum, backfill) now records
    it first. Where another writer's clean-up got there first, the ledger says so in one line, and a reset
    to the offsets of then is the way on."""
    from offsetlake import runs
    from offsetlake.errors import RewindOutOfReach
    from offsetlake.protocol.metadata import Run

    cfg, topic = pipeline(partitions=2, records=300, ingest=True)  # version 1
    first = ledger_offsets(cfg)
    produce(cfg.kafka, topic, 300, seed=13)
    ingest(spark, cfg)  # version 2
    DeltaTable(cfg.table_path).restore(1)  # an operator's RESTORE, no ledger of its own: version 3
    said: list[str] = []

    runs.checkpoint(cfg, said.append)

    assert any("recorded first" in line for line in said), said
    last = pipeline_commits(cfg)[-1]
    assert (last.meta.kind, last.meta.restored_version) == ("restore", 1)
    assert ledger_offsets(cfg) == first
    ingest(spark, cfg)
    assert_exactly_once(cfg)

    # Another writer's RESTORE, and the restored version gone from the log before anyone recorded it
    then, at_then = DeltaTable(cfg.table_path).version(), ledger_offsets(cfg)
    produce(cfg.kafka, topic, 300, seed=14)
    ingest(spark, cfg)
    DeltaTable(cfg.table_path).restore(then)
    DeltaTable(cfg.table_path).create_checkpoint()
    for entry in Path(cfg.table_path, "_delta_log").glob("*.json"):
        if int(entry.name.split(".")[0]) <= then:
            entry.unlink()
    with pytest.raises(RewindOutOfReach, match="`offsetlake reset`"):
        ingest(spark, cfg)
    reset(cfg, at_then, "the RESTORE's target left the log", Run.here())
    ingest(spark, cfg)
    assert_exactly_once(cfg)
