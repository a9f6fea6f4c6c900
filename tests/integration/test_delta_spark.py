"""delta-spark beside delta-rs: the tables offsetlake writes, read and operated on by the Delta engine of Spark
and Databricks (delta-spark, in the session's Spark: tests/delta_spark.py), checked by the oracle row by row
against Kafka. The versions are those of src/offsetlake/local/poms/delta-spark.xml and requirements.txt."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from delta_spark import reader, sql
from offsetlake.batch import ingest
from offsetlake.errors import OffsetlakeError, TableError
from offsetlake.files import plain_types
from offsetlake.formats.records import table_schema
from offsetlake.operations.audit import audit, repair
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import checkpoint, cleanup, vacuum
from support import assert_exactly_once, assert_job_failed_in_one_line, data_files_on_disk, produce, run_cli

pytestmark = pytest.mark.slow
SMALL_BATCHES = {"max_records_per_batch": 300, "max_records_per_task": 100}


def delta(cfg) -> str:
    return f"delta.`{cfg.table_path}`"


def test_delta_spark_reads_a_partitioned_table_and_its_quarantine_through_offsetlakes_maintenance(spark, pipeline):
    """Rows, values and types as the oracle expects them, read by delta-spark: after batches, and after
    offsetlake's optimize, a checkpoint with the log cleaned up, vacuum and clean-up."""
    cfg, topic = pipeline(partitions=3, table={"partition_by": ["kafka_partition"]}, batch=SMALL_BATCHES)
    produce(cfg.kafka, topic, 900, bad_share=0.05, seed=81)
    ingest(spark, cfg)
    read = reader(spark)
    assert_exactly_once(cfg, read=read)

    optimize(cfg.table_path, cfg.name, table_schema(cfg), cfg.table.partition_by, cfg.maintenance.target_file_mb)
    DeltaTable(cfg.table_path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    checkpoint(cfg.table_path)
    vacuum(cfg.table_path, cfg.name, retention_hours=1)
    cleanup(cfg.table_path, older_than_seconds=60)
    assert_exactly_once(cfg, read=read)
    assert sql(spark, f"SELECT count(*) AS n FROM {delta(cfg)}")[0].n == DeltaTable(cfg.table_path).count()


def test_delta_sparks_maintenance_and_restore_each_followed_by_an_ingest_that_stays_exact(spark, pipeline):
    """OPTIMIZE with ZORDER BY, SET TBLPROPERTIES, RESTORE (the table and its ledger rewind together: the
    next ingest reads the restored-away offsets again, once) and VACUUM, all by delta-spark."""
    cfg, topic = pipeline(partitions=2, records=500, ingest=True, batch=SMALL_BATCHES)
    seed = iter(range(820, 830))

    def then_ingest_more():
        produce(cfg.kafka, topic, 200, seed=next(seed))
        ingest(spark, cfg)
        assert_exactly_once(cfg)

    sql(spark, f"OPTIMIZE {delta(cfg)} ZORDER BY (kafka_offset)")
    then_ingest_more()
    sql(spark, f"ALTER TABLE {delta(cfg)} SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 60 days')")
    restore_to = DeltaTable(cfg.table_path).version()
    then_ingest_more()
    sql(spark, f"RESTORE TABLE {delta(cfg)} TO VERSION AS OF {restore_to}")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    sql(spark, f"VACUUM {delta(cfg)} RETAIN 0 HOURS")
    then_ingest_more()
    assert_exactly_once(cfg, read=reader(spark))


@pytest.mark.parametrize(
    "change", ["DELETE FROM {t} WHERE kafka_offset % 7 = 0", "UPDATE {t} SET amount = -1 WHERE kafka_offset % 5 = 0"]
)
def test_a_users_delete_or_update_by_delta_spark_is_reported_by_audit_and_mended_by_repair(spark, pipeline, change):
    cfg, topic = pipeline(partitions=2, records=500, ingest=True, batch=SMALL_BATCHES)
    sql(spark, change.format(t=delta(cfg)))

    found = audit(cfg)
    assert not found.ok and found.problem_count() > 0, found.format()
    repair(spark, cfg)
    assert audit(cfg).ok
    produce(cfg.kafka, topic, 200, seed=84)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))


# Delta table features delta-spark enables on a table, each with the statement that enables it.
ENABLE = {
    "deletionVectors": "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
    "columnMapping": "SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
    "v2Checkpoint": "SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')",
    "timestampNtz": "SET TBLPROPERTIES ('delta.feature.timestampNtz' = 'supported')",
    "checkConstraints": "ADD CONSTRAINT known_user CHECK (user_id >= 0)",
    "generatedColumns": "SET TBLPROPERTIES ('delta.feature.generatedColumns' = 'supported')",
    "changeDataFeed": "SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
    "appendOnly": "SET TBLPROPERTIES ('delta.appendOnly' = 'true')",
    "rowTracking": "SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')",
    "clustering": "CLUSTER BY (user_id)",
    "typeWidening": "SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
    "identityColumns": "SET TBLPROPERTIES ('delta.feature.identityColumns' = 'supported')",
    "inCommitTimestamp": "SET TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')",
}
REFUSED = ["rowTracking", "clustering", "typeWidening", "identityColumns", "inCommitTimestamp"]


def test_ingest_stays_exact_on_a_table_with_every_feature_offsetlake_writes(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=300, ingest=True)
    for feature, statement in ENABLE.items():
        if feature not in REFUSED:
            sql(spark, f"ALTER TABLE {delta(cfg)} {statement}")
    assert set(DeltaTable(cfg.table_path).protocol().writer_features) >= set(ENABLE) - set(REFUSED)
    produce(cfg.kafka, topic, 300, seed=85)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))


@pytest.mark.parametrize("feature", REFUSED)
def test_a_feature_offsetlake_cannot_write_is_refused_in_one_line_before_anything_is_written(
    spark, pipeline, pipelines_dir, feature
):
    cfg, topic = pipeline(partitions=2, records=200, ingest=True)
    sql(spark, f"ALTER TABLE {delta(cfg)} {ENABLE[feature]}")
    version, files = DeltaTable(cfg.table_path).version(), data_files_on_disk(cfg.table_path)
    produce(cfg.kafka, topic, 100, seed=86)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))

    assert_job_failed_in_one_line(failed, "uses the Delta table feature", feature, "nothing was written")
    assert DeltaTable(cfg.table_path).version() == version
    assert data_files_on_disk(cfg.table_path) == files


def test_offsetlakes_rewrites_refuse_a_table_with_deletion_vectors_and_ingest_appends_beside_them(spark, pipeline):
    """Optimize and repair read data files as Parquet: on a table with deletion vectors they refuse in one
    line rather than bring deleted rows back. Ingest appends beside them, exactly: afterwards, what audit
    finds missing is exactly what the user deleted."""
    cfg, topic = pipeline(partitions=2, records=400, ingest=True, batch=SMALL_BATCHES)
    sql(spark, f"ALTER TABLE {delta(cfg)} {ENABLE['deletionVectors']}")
    deleted = {
        (r.kafka_partition, r.kafka_offset)
        for r in sql(spark, f"SELECT * FROM {delta(cfg)}")
        if r.kafka_offset % 9 == 0
    }
    sql(spark, f"DELETE FROM {delta(cfg)} WHERE kafka_offset % 9 = 0")
    version = DeltaTable(cfg.table_path).version()

    with pytest.raises(TableError, match="deletionVectors, and optimize would bring back rows it deleted"):
        optimize(cfg.table_path, cfg.name, table_schema(cfg), cfg.table.partition_by, cfg.maintenance.target_file_mb)
    with pytest.raises(OffsetlakeError, match="deletionVectors, and backfill would bring back"):
        repair(spark, cfg)
    assert DeltaTable(cfg.table_path).version() == version
    produce(cfg.kafka, topic, 200, seed=87)
    ingest(spark, cfg)
    found = audit(cfg)
    assert {(p.partition, o) for p in found.partitions for o in p.missing} == deleted
    assert found.problem_count() == len(deleted) > 0


def test_delta_spark_reads_an_upsert_table_and_its_change_feed_as_offsetlake_wrote_them(spark, pipeline):
    """The table is the fold of Kafka read through delta-spark, and delta-spark's `readChangeFeed` holds
    the same changes, version by version, as delta-rs' (which the oracle replays into the table)."""
    from test_upsert import UPSERT, keyed_event

    cfg, topic = pipeline(partitions=2, batch=SMALL_BATCHES, **UPSERT)
    produce(cfg.kafka, topic, 900, seed=88, make_record=keyed_event)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))

    def changes(table: pa.Table) -> list[dict]:
        rows = plain_types(table.drop_columns(["_commit_timestamp"])).to_pylist()
        return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))

    theirs = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    ours = pa.table(DeltaTable(cfg.table_path).load_cdf(starting_version=0))
    seen = changes(theirs.load(cfg.table_path).toArrow())
    assert seen == changes(ours)
    assert {r["_change_type"] for r in seen} == {"insert", "update_preimage", "update_postimage", "delete"}
