"""The delta-spark commit engine (`table.engine: delta-spark`): batches committed by delta-spark in the job's
Spark session, on tables with the features Spark and Databricks turn on, checked by the oracle row by row
against Kafka and the ledger, read by delta-spark and, where it can read the table, by delta-rs."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from test_delta_spark import ENABLE, REFUSED, WRITABLE, delta, enable

from delta_spark import change_reader, reader, sql
from offsetlake import runs
from offsetlake.batch import ingest
from offsetlake.engine.delta_spark import DeltaSpark
from offsetlake.errors import TableError
from offsetlake.operations.audit import repair
from offsetlake.operations.backfill import backfill
from offsetlake.protocol.commit import Change
from offsetlake.protocol.ledger import partition_app_id, pipeline_app_id
from offsetlake.protocol.metadata import CommitMetadata, Run
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.table import committed_files
from oracle import MISSING, check
from support import (
    assert_exactly_once,
    assert_job_failed_in_one_line,
    data_files_on_disk,
    delta_spark_submit_args,
    ingest_process,
    pipeline_commits,
    produce,
    run_cli,
    wait_for_fault,
)

pytestmark = pytest.mark.slow
DELTA_SPARK = {"engine": "delta-spark"}
SMALL_BATCHES = {"max_records_per_batch": 300, "max_records_per_task": 100}


def history(spark, cfg) -> list:
    return sql(spark, f"DESCRIBE HISTORY {delta(cfg)}")


def test_delta_spark_commits_each_batch_with_its_ledger_and_metadata_in_one_write(spark, pipeline):
    """Every batch one delta-spark WRITE whose userMetadata names the batch, and whose txn actions are the
    ledger delta-rs reads: the pipeline's batch number and each partition's next offset."""
    cfg, topic = pipeline(partitions=3, records=600, table=DELTA_SPARK, batch=SMALL_BATCHES)
    results = ingest(spark, cfg)
    committed = [r for r in results if r.status == "committed"]
    assert len(committed) >= 2
    assert_exactly_once(cfg, read=reader(spark))
    assert_exactly_once(cfg)  # and read by delta-rs

    writes = {h.version: h for h in history(spark, cfg) if h.operation == "WRITE"}
    assert {r.version for r in committed} <= set(writes)
    for result in committed:
        metadata = json.loads(writes[result.version].userMetadata)
        assert (metadata["pipeline"], metadata["kind"], metadata["batch"]) == (cfg.name, "ingest", result.batch)
    table = DeltaTable(cfg.table_path)
    assert table.transaction_version(pipeline_app_id(cfg.name)) == committed[-1].batch
    for partition, end in {r.partition: r.end for r in committed[-1].ranges}.items():
        assert table.transaction_version(partition_app_id(cfg.name, topic, partition)) == end


# What turns each feature on that only delta-spark writes: test_delta_spark's, and checkpoint protection, which
# delta-spark adds when a feature is dropped. The property names it outright: `DROP FEATURE deletionVectors`
# leaves the same protocol, but first purges the vectors and writes checkpoints (docs/development/tests.md).
TURN_ON = {
    **{feature: [ENABLE[feature]] for feature in REFUSED},
    "checkpointProtection": ["SET TBLPROPERTIES ('delta.feature.checkpointProtection' = 'supported')"],
}


def test_each_feature_delta_rs_refuses_is_written_by_the_delta_spark_engine(spark, pipeline, pipelines_dir):
    """The features turned on one after another on one table: after each, the delta-rs engine refuses the table
    in one line that names it and the engine that writes it, and writes nothing (the last refusal is a job
    process's last line). Then every other feature of the features page too, a CHECK constraint the records
    keep and a column added under column mapping (stored as `col-<uuid>`, which the delta-rs engine refuses):
    `engine: delta-spark` writes the batches into the same table, exactly."""
    cfg, topic = pipeline(partitions=2, records=200, ingest=True, batch=SMALL_BATCHES)
    produce(cfg.kafka, topic, 450, seed=186)
    features = sorted(TURN_ON)
    for feature in features:
        for statement in TURN_ON[feature]:
            sql(spark, f"ALTER TABLE {delta(cfg)} {statement}")
        if feature != "clustering":
            assert feature in (DeltaTable(cfg.table_path).protocol().writer_features or [])
        version, files = DeltaTable(cfg.table_path).version(), data_files_on_disk(cfg.table_path)

        if feature == features[-1]:
            failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))
            assert_job_failed_in_one_line(failed, feature, "table.engine: delta-spark", "nothing was written")
        else:
            with pytest.raises(TableError) as refused:
                ingest(spark, cfg)
            assert "\n" not in str(refused.value)
            for fragment in (feature, "table.engine: delta-spark", "nothing was written"):
                assert fragment in str(refused.value), feature
        assert DeltaTable(cfg.table_path).version() == version, feature
        assert data_files_on_disk(cfg.table_path) == files, feature

    enable(spark, cfg, WRITABLE)
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD CONSTRAINT known_user CHECK (user_id >= 0)")
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD COLUMNS (note STRING)")
    on_spark = cfg.model_copy(update={"table": cfg.table.model_copy(update={"engine": "delta-spark"})})
    assert len([r for r in ingest(spark, on_spark) if r.status == "committed"]) >= 2
    assert_exactly_once(on_spark, read=reader(spark), user_columns={"note": pa.string()})
    assert {r.note for r in sql(spark, f"SELECT DISTINCT note FROM {delta(cfg)}")} == {None}


def test_an_upsert_on_the_delta_spark_engine_stays_exact_on_a_table_with_every_feature(spark, pipeline):
    """Upsert batches merged by delta-spark into a table with every feature of the features page but
    append-only (row tracking, liquid clustering, in-commit timestamps, type widening, deletion vectors,
    column mapping, the change data feed...): the fold of Kafka, read by delta-spark, and the change
    feed replays to it; each row keeps its row id through the merges, as Delta's own MERGE keeps it; after a
    user's UPDATE, offsetlake's repair rebuilds the table from the fold through delta-spark."""
    from test_upsert import UPSERT, keyed_event

    # A batch per ingest: each MERGE into a table with every feature costs seconds, and the batches of one
    # ingest following each other are the append tests' (test_delta_spark_commits_each_batch_...)
    cfg, topic = pipeline(partitions=2, table=DELTA_SPARK, **UPSERT)
    produce(cfg.kafka, topic, 400, seed=199, make_record=keyed_event)
    ingest(spark, cfg)
    enable(spark, cfg, [feature for feature in ENABLE if feature != "appendOnly"])  # an upsert refuses it
    produce(cfg.kafka, topic, 600, seed=200, make_record=keyed_event)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark), read_changes=change_reader(spark))

    # Row tracking: a key's row keeps its id through a merge that updates it, as in Delta's own MERGE (a
    # deleted key's row is gone, and one inserted again is a new row: updates only here)
    ids_before = row_ids(spark, cfg)

    def an_update(rng, seq):
        while True:
            key, value = keyed_event(rng, seq)
            if value is not None:
                return key, value

    produce(cfg.kafka, topic, 300, seed=201, make_record=an_update)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark), read_changes=change_reader(spark))
    ids_after = row_ids(spark, cfg)
    assert ids_before and all(ids_after[key] == ids_before[key] for key in ids_before), {
        key: (ids_before[key], ids_after[key]) for key in ids_before if ids_after[key] != ids_before[key]
    }
    assert len(set(ids_after.values())) == len(ids_after)  # and every row its own

    # A user's UPDATE (deletion vectors on): audit finds the rewritten rows, and repair's rebuild from the fold
    # of Kafka, committed by delta-spark, makes the table Kafka's again
    changed = sorted(ids_after)[:3]
    sql(spark, f"UPDATE {delta(cfg)} SET amount = -1 WHERE kafka_key IN ({', '.join(repr(k) for k in changed)})")
    found, rebuilt = repair(spark, cfg)
    assert found.problem_count() == len(changed), found.format()
    assert rebuilt.status == "committed", rebuilt.summary()
    assert_exactly_once(cfg, read=reader(spark), read_changes=change_reader(spark))


def test_a_column_another_job_added_meanwhile_is_not_added_twice(spark, pipeline):
    """Two jobs whose batches bring the same new column (a registry schema that grew mid-stream): the one that
    decided on a snapshot from before the other's ALTER finds the column there under the log lock, adds
    nothing, and decides again on top of it (a short chaos run's job failed on `FIELD_ALREADY_EXISTS`)."""
    cfg, _ = pipeline(partitions=1, records=50, table=DELTA_SPARK)
    ingest(spark, cfg)
    decided_on = DeltaTable(cfg.table_path)
    grown = pa.schema(decided_on.schema()).append(pa.field("country", pa.string()))
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD COLUMNS (country STRING)")  # the other job's, first
    version = DeltaTable(cfg.table_path).version()
    change = Change(CommitMetadata(cfg.name, "ingest", batch=2), schema=grown, evolve=True)

    assert DeltaSpark(cfg, spark)._add_columns(change, decided_on)  # decide again

    assert DeltaTable(cfg.table_path).version() == version
    assert pa.schema(DeltaTable(cfg.table_path).schema()).names.count("country") == 1
    assert_exactly_once(cfg, read=reader(spark), user_columns={"country": pa.string()})


def row_ids(spark, cfg) -> dict[str, int]:
    """Each key's row id (`_metadata.row_id`), as delta-spark reads it."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(str(cfg.table_path))
    return {
        r.kafka_key: r.row_id for r in table.select("kafka_key", F.col("_metadata.row_id").alias("row_id")).collect()
    }


def job_env(env: dict | None = None) -> dict:
    """An offsetlake job process with delta-spark's jars in its Spark session, as `--jars` gives them."""
    return {"PYSPARK_SUBMIT_ARGS": delta_spark_submit_args(), **(env or {})}


@pytest.mark.parametrize(
    "point",
    [
        pytest.param("after_files_written", marks=pytest.mark.long),
        "before_commit",
        pytest.param("after_commit", marks=pytest.mark.long),  # the append zombie below finds its batch so too
    ],
)
def test_a_delta_spark_job_killed_at_a_fault_point_then_rerun_is_exact(spark, pipeline, pipelines_dir, point):
    cfg, _ = pipeline(partitions=3, records=900, table=DELTA_SPARK)
    job = ingest_process(cfg, pipelines_dir, job_env({"OFFSETLAKE_FAULT": f"{point}:exit"}))
    out, err = job.communicate(timeout=300)
    assert job.returncode == -signal.SIGKILL, f"the job was not killed at {point}: {err[-2000:]}"
    assert len(pipeline_commits(cfg)) == (1 if point == "after_commit" else 0)
    orphans = data_files_on_disk(cfg.table_path) - committed_files(cfg.table_location)

    results = ingest(spark, cfg)

    assert len([r for r in results if r.status == "committed"]) == (0 if point == "after_commit" else 1)
    assert_exactly_once(cfg, read=reader(spark))
    referenced = committed_files(cfg.table_location)
    assert not orphans & referenced
    assert data_files_on_disk(cfg.table_path) - referenced == orphans


@pytest.mark.parametrize("mode", ["append", pytest.param("upsert", marks=pytest.mark.long)])
def test_a_delta_spark_zombie_finds_its_batch_committed_and_leaves_no_file(
    spark, pipeline, pipelines_dir, tmp_path, mode
):
    """The zombie, paused after deciding, commits into delta-spark's conflict checker: the retry set the
    ledger's application ids first, so the zombie decides again, finds its batch committed, and deletes
    the files delta-spark wrote for it."""
    from test_upsert import UPSERT, keyed_event

    settings = UPSERT if mode == "upsert" else {}
    cfg, topic = pipeline(partitions=3, table=DELTA_SPARK, **settings)
    produce(cfg.kafka, topic, 600, seed=205, **({"make_record": keyed_event} if mode == "upsert" else {}))
    fault_dir = tmp_path / "faults"
    zombie = ingest_process(
        cfg, pipelines_dir, job_env({"OFFSETLAKE_FAULT": "before_commit:pause", "OFFSETLAKE_FAULT_DIR": str(fault_dir)})
    )
    wait_for_fault(fault_dir / "before_commit.reached", zombie)

    ingest(spark, cfg)  # the retry: the same batch, to completion
    version = DeltaTable(cfg.table_path).version()
    (fault_dir / "before_commit.release").touch()
    out, err = zombie.communicate(timeout=300)

    assert zombie.returncode == 0, err[-2000:]
    assert "batch 1: already_committed" in out
    assert DeltaTable(cfg.table_path).version() == version
    assert data_files_on_disk(cfg.table_path) == committed_files(cfg.table_location)
    assert_exactly_once(cfg, read=reader(spark))


def test_the_delta_spark_engine_maintains_repairs_and_restores_a_table_delta_rs_cannot_rewrite(spark, pipeline):
    """On a table with every feature of the features page but append-only (deletion vectors, row tracking,
    liquid clustering, type widening, in-commit timestamps, v2 checkpoints, column mapping...), after a user's
    DELETE:
    offsetlake's optimize, vacuum and checkpoint run as delta-spark's own (OPTIMIZE applies the deletion
    vectors, VACUUM deletes an old orphan, the checkpoint holds the ledger), each commit named by its
    userMetadata, the ledger untouched; ingest goes on, and what the oracle finds missing is what the user
    deleted, nothing else. offsetlake's repair backfills it through delta-spark, and its restore to the
    version before the DELETE makes the next ingest read the restored-away records again: each time the
    table is Kafka's, exactly."""
    cfg, topic = pipeline(partitions=2, records=600, table=DELTA_SPARK)  # a batch per ingest: seconds each
    ingest(spark, cfg)
    enable(spark, cfg, [feature for feature in ENABLE if feature != "appendOnly"])  # it refuses the user's DELETE
    rows_then = {(topic, r.kafka_partition, r.kafka_offset) for r in sql(spark, f"SELECT * FROM {delta(cfg)}")}
    deleted = {where for where in rows_then if where[2] % 7 == 0}
    before_delete = DeltaTable(cfg.table_path).version()
    sql(spark, f"DELETE FROM {delta(cfg)} WHERE kafka_offset % 7 = 0")
    produce(cfg.kafka, topic, 300, seed=211)
    ingest(spark, cfg)
    root = Path(cfg.table_path)
    orphan = root / "part-orphan-of-a-dead-attempt.parquet"
    orphan.write_bytes(b"PAR1")
    os.utime(orphan, (time.time() - 3 * 3600,) * 2)
    ledger_before = DeltaTable(cfg.table_path).transaction_version(pipeline_app_id(cfg.name))
    files_before = len(DeltaTable(cfg.table_path).file_uris())
    said: list[str] = []

    runs.maintain(
        cfg,
        Run.here(),
        said.append,
        compact=True,
        vacuum_files=True,
        checkpoint_log=True,
        retention_hours=2,
        spark=spark,
    )

    table = DeltaTable(cfg.table_path)
    assert table.transaction_version(pipeline_app_id(cfg.name)) == ledger_before
    assert len(table.file_uris()) < files_before, said
    assert not orphan.exists(), said
    assert any("deleted 1 data files" in line for line in said), said
    operations = {h.operation: h for h in history(spark, cfg)}
    assert json.loads(operations["OPTIMIZE"].userMetadata)["kind"] == "optimize"
    assert json.loads(operations["VACUUM END"].userMetadata)["kind"] == "vacuum"
    assert json.loads((root / "_delta_log" / "_last_checkpoint").read_text())["version"] == table.version(), said
    produce(cfg.kafka, topic, 300, seed=212)
    ingest(spark, cfg)
    findings = check(cfg, read=reader(spark))
    assert set(findings.kinds) == {MISSING}, findings.report()
    assert {where for where, _ in findings.kinds[MISSING]} == deleted != set()

    span = OffsetRange(topic, 0, 0, 50)  # a backfill's dry run counts the rows there as delta-spark reads them
    still_there = len([w for w in rows_then - deleted if w[1] == 0 and w[2] < 50])  # (transaction markers: no row)
    assert backfill(spark, cfg, [span], dry_run=True).rows_removed == still_there
    found, backfilled = repair(spark, cfg)
    assert found.problem_count() == len(deleted), found.format()
    assert (backfilled.status, backfilled.rows_added) == ("committed", len(deleted)), backfilled.summary()
    assert json.loads(history(spark, cfg)[0].userMetadata)["kind"] == "backfill"
    assert_exactly_once(cfg, read=reader(spark))

    # offsetlake's restore, by delta-spark: the deleted rows are back, the later ones read again, once
    restored = runs.restore(cfg, before_delete, Run.here(), spark)
    metadata = json.loads(history(spark, cfg)[0].userMetadata)
    assert (metadata["kind"], metadata["restored_version"]) == ("restore", before_delete), restored
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))
