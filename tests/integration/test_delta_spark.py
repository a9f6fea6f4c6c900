"""delta-spark beside delta-rs: the tables offsetlake writes, read and operated on by the Delta engine of Spark
and Databricks (delta-spark, in the session's Spark: tests/delta_spark.py), checked by the oracle row by row
against Kafka. The versions are those of src/offsetlake_local/poms/delta-spark.xml and requirements.txt."""

from __future__ import annotations

import json
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from delta_spark import change_reader, reader, sql
from offsetlake.batch import ingest
from offsetlake.errors import OffsetlakeError, TableError
from offsetlake.formats.columns import table_schema
from offsetlake.operations.audit import audit, repair
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import checkpoint, cleanup, vacuum
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import plain_types
from offsetlake.table import NOT_REWRITABLE
from oracle import changes_with_delta_rs, read_with_delta_rs
from support import assert_exactly_once, assert_job_failed_in_one_line, data_files_on_disk, produce, run_cli

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "integrations"
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

    optimize(cfg.table_location, cfg.name, table_schema(cfg), cfg.table.partition_by, cfg.maintenance.target_file_mb)
    DeltaTable(cfg.table_path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    checkpoint(cfg.table_location)
    vacuum(cfg.table_location, cfg.name, retention_hours=1)
    cleanup(cfg.table_location, older_than_seconds=60)
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


def code_cache(spark) -> tuple[int, int]:
    """(bytes reserved, bytes at most used so far) of the driver JVM's code cache, asked from the JVM (JMX):
    one pool, or three when the cache is segmented."""
    management = spark._jvm.java.lang.management.ManagementFactory
    pools = [p for p in management.getMemoryPoolMXBeans() if p.getName() == "CodeCache" or "CodeHeap" in p.getName()]
    assert pools, [p.getName() for p in management.getMemoryPoolMXBeans()]
    return sum(p.getUsage().getMax() for p in pools), sum(p.getPeakUsage().getUsed() for p in pools)


def test_the_driver_jvm_has_room_to_compile_delta_sparks_code(spark, pipeline):
    """The driver compiles with C1 only, which left alone sizes the code cache as a client VM's (48 MB): a long
    session of delta-spark SQL filled it, and a full cache fails a query at random with `InternalError:
    ...no such method: MethodHandle.linkToStatic` (JDK-8295724). After a user's DELETE, UPDATE, MERGE and
    OPTIMIZE here, the cache is reserved at 240 MB and used well below it."""
    cfg, _ = pipeline(partitions=2, records=300, ingest=True)
    for statement in (
        "DELETE FROM {t} WHERE kafka_offset % 7 = 0",
        "UPDATE {t} SET amount = -1 WHERE kafka_offset % 5 = 0",
        "MERGE INTO {t} t USING (SELECT * FROM {t} WHERE kafka_offset < 50) s ON t.kafka_offset = s.kafka_offset "
        "AND t.kafka_partition = s.kafka_partition WHEN MATCHED THEN UPDATE SET amount = s.amount + 1",
        "OPTIMIZE {t} ZORDER BY (user_id)",
    ):
        sql(spark, statement.format(t=delta(cfg)))
    arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" in arguments, arguments
    reserved, peak = code_cache(spark)
    assert reserved >= 240 * 2**20, f"code cache {reserved / 2**20:.0f} MB"
    assert peak < reserved * 0.75, f"code cache used up to {peak / 2**20:.0f} of {reserved / 2**20:.0f} MB"


# Delta table features delta-spark enables on a table, each with the table property that turns it on (liquid
# clustering: a CLUSTER BY of its own).
PROPERTIES = {
    "deletionVectors": {"delta.enableDeletionVectors": "true"},
    "columnMapping": {"delta.columnMapping.mode": "name"},
    "v2Checkpoint": {"delta.checkpointPolicy": "v2"},
    "timestampNtz": {"delta.feature.timestampNtz": "supported"},
    "checkConstraints": {"delta.feature.checkConstraints": "supported"},
    "generatedColumns": {"delta.feature.generatedColumns": "supported"},
    "changeDataFeed": {"delta.enableChangeDataFeed": "true"},
    "appendOnly": {"delta.appendOnly": "true"},
    "rowTracking": {"delta.enableRowTracking": "true"},
    "typeWidening": {"delta.enableTypeWidening": "true"},
    "identityColumns": {"delta.feature.identityColumns": "supported"},
    "inCommitTimestamp": {"delta.enableInCommitTimestamps": "true"},
}
CLUSTER_BY = "CLUSTER BY (user_id)"


def set_properties(properties: dict[str, str]) -> str:
    return "SET TBLPROPERTIES ({})".format(", ".join(f"'{key}' = '{value}'" for key, value in properties.items()))


# Each feature's own ALTER TABLE clause.
ENABLE = {feature: set_properties(properties) for feature, properties in PROPERTIES.items()}
ENABLE["clustering"] = CLUSTER_BY
REFUSED = ["rowTracking", "clustering", "typeWidening", "identityColumns", "inCommitTimestamp"]


WRITABLE = [feature for feature in ENABLE if feature not in REFUSED]


def enable(spark, cfg, features) -> None:
    """`features` turned on as a user would: their properties in one ALTER TABLE (delta-spark checks and commits
    each ALTER on its own, seconds apiece), liquid clustering in a second."""
    properties = {key: value for feature in features for key, value in PROPERTIES.get(feature, {}).items()}
    if properties:
        sql(spark, f"ALTER TABLE {delta(cfg)} {set_properties(properties)}")
    if "clustering" in features:
        sql(spark, f"ALTER TABLE {delta(cfg)} {CLUSTER_BY}")
    protocol = DeltaTable(cfg.table_path).protocol()
    if protocol.min_writer_version >= 7:  # table features (appendOnly alone keeps the legacy protocol)
        assert set(protocol.writer_features or ()) >= set(features) - {"clustering"}


def test_ingest_stays_exact_on_a_table_with_every_feature_offsetlake_writes(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=300, ingest=True)
    enable(spark, cfg, WRITABLE)
    produce(cfg.kafka, topic, 300, seed=85)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))


def test_offsetlakes_maintenance_stays_exact_on_a_table_with_every_feature_it_rewrites(spark, pipeline):
    """Every writable feature but deletion vectors (which rewrites refuse): optimize with Z-order, a
    checkpoint, vacuum and log clean-up, then ingest, exact through delta-spark."""
    cfg, topic = pipeline(partitions=2, records=300, ingest=True, batch=SMALL_BATCHES)
    enable(spark, cfg, [f for f in WRITABLE if f not in NOT_REWRITABLE])
    produce(cfg.kafka, topic, 300, seed=97)
    ingest(spark, cfg)
    zorder = ["user_id", "kafka_offset"]
    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb, zorder)
    assert compacted.files_removed > compacted.files_added > 0
    checkpoint(cfg.table_location)
    vacuum(cfg.table_location, cfg.name, retention_hours=1)
    cleanup(cfg.table_location, older_than_seconds=60)
    produce(cfg.kafka, topic, 300, seed=98)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark))


# What an upsert refuses (table.check_mergeable): an append-only table.
NOT_MERGEABLE = ["appendOnly"]


def test_upsert_stays_exact_on_a_table_with_every_feature_it_writes(spark, pipeline):
    """An upsert table (MERGE through delta-rs) with every writable feature but those it refuses: the fold
    of Kafka, read by delta-spark, and the change feed replays to it."""
    from test_upsert import UPSERT, keyed_event

    cfg, topic = pipeline(partitions=2, batch=SMALL_BATCHES, **UPSERT)
    produce(cfg.kafka, topic, 400, seed=99, make_record=keyed_event)
    ingest(spark, cfg)
    enable(spark, cfg, [f for f in WRITABLE if f not in NOT_MERGEABLE])
    produce(cfg.kafka, topic, 600, seed=100, make_record=keyed_event)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark), read_changes=change_reader(spark))


def test_an_upsert_into_an_append_only_table_is_refused_in_one_line_before_anything_is_written(
    spark, pipeline, pipelines_dir
):
    from test_upsert import UPSERT, keyed_event

    cfg, topic = pipeline(partitions=2, **UPSERT)
    produce(cfg.kafka, topic, 200, seed=101, make_record=keyed_event)
    ingest(spark, cfg)
    enable(spark, cfg, NOT_MERGEABLE)
    version, files = DeltaTable(cfg.table_path).version(), data_files_on_disk(cfg.table_path)
    produce(cfg.kafka, topic, 200, seed=102, make_record=keyed_event)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))

    assert_job_failed_in_one_line(failed, "sets delta.appendOnly", "nothing was written")
    assert DeltaTable(cfg.table_path).version() == version
    assert data_files_on_disk(cfg.table_path) == files


def test_a_check_constraint_is_refused_by_ingest_in_one_line_and_optimize_still_compacts(
    spark, pipeline, pipelines_dir
):
    """offsetlake writes its own data files, so Delta would check no CHECK constraint on them: ingest refuses a
    table with one, naming it, before writing. Compaction adds no row, and runs."""
    cfg, topic = pipeline(partitions=2, records=300, ingest=True, batch=SMALL_BATCHES)
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD CONSTRAINT known_user CHECK (user_id >= 0)")
    version, files = DeltaTable(cfg.table_path).version(), data_files_on_disk(cfg.table_path)
    produce(cfg.kafka, topic, 100, seed=104)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))

    assert_job_failed_in_one_line(failed, "has the CHECK constraint known_user (user_id >= 0)", "nothing was written")
    assert DeltaTable(cfg.table_path).version() == version
    assert data_files_on_disk(cfg.table_path) == files
    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb)
    assert compacted.files_removed > compacted.files_added > 0


def test_a_column_stored_under_another_name_by_column_mapping_is_refused_in_one_line(spark, pipeline, pipelines_dir):
    """Column mapping on an offsetlake table works (test above) while its columns keep their names; a column
    added since is stored as `col-<uuid>`: ingest and optimize refuse, naming it, and write nothing."""
    cfg, topic = pipeline(partitions=2, records=200, ingest=True)
    enable(spark, cfg, ["columnMapping"])
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD COLUMNS (note STRING)")
    version, files = DeltaTable(cfg.table_path).version(), data_files_on_disk(cfg.table_path)
    produce(cfg.kafka, topic, 100, seed=103)

    failed = run_cli("ingest", "--pipeline", cfg.name, "--pipelines-dir", str(pipelines_dir))

    assert_job_failed_in_one_line(failed, "column 'note' is stored in its data files as 'col-", "nothing was written")
    with pytest.raises(TableError, match="column 'note' is stored in its data files as 'col-"):
        optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb)
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
        optimize(
            cfg.table_location, cfg.name, table_schema(cfg), cfg.table.partition_by, cfg.maintenance.target_file_mb
        )
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

    seen = changes(change_reader(spark)(cfg.table_path, 0))
    assert seen == changes(changes_with_delta_rs(cfg.table_location, 0))
    assert {r["_change_type"] for r in seen} == {"insert", "update_preimage", "update_postimage", "delete"}


ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "string"},
        {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "placed_on", "type": {"type": "int", "logicalType": "date"}},
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"]}],
            },
        },
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "qty", "type": "int"},
                        {
                            "name": "price",
                            "type": {
                                "type": "fixed",
                                "name": "Price",
                                "size": 8,
                                "logicalType": "decimal",
                                "precision": 10,
                                "scale": 3,
                            },
                        },
                    ],
                },
            },
        },
        {"name": "tags", "type": {"type": "map", "values": "long"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "score", "type": ["null", "float"]},
        {"name": "raw", "type": "bytes"},
    ],
}


def order_maker(client, topic: str):
    """Orders of every Avro kind the docs map (decimals on bytes and fixed, date, timestamp, a nested record,
    an array of records, a map, an enum, nullable fields, bytes), a string key and two headers."""
    import datetime as dt
    from decimal import Decimal

    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(client, json.dumps(ORDER_V1), conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)

    def make(rng, seq: int):
        lines = [
            {
                "sku": f"sku-{rng.randrange(100)}",
                "qty": rng.randrange(1, 9),
                "price": Decimal(rng.randrange(10**7)) / 1000,
            }
            for _ in range(rng.randrange(0, 4))
        ]
        order = {
            "order_id": f"o{seq}",
            "total": Decimal(rng.randrange(-(10**11), 10**11)) / 100,
            "placed_on": dt.date(2026, 1, 1) + dt.timedelta(days=rng.randrange(365)),
            "placed_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.getrandbits(44)),
            "customer": {"id": rng.getrandbits(62), "email": None if seq % 3 else f"c{seq}@example.com"},
            "lines": lines,
            "tags": {f"t{i}": rng.getrandbits(40) for i in range(rng.randrange(0, 3))},
            "status": rng.choice(["NEW", "PAID", "SHIPPED"]),
            "score": None if seq % 4 == 0 else rng.random(),
            "raw": rng.randbytes(rng.randrange(0, 12)),
        }
        headers = [("source", b"shop"), ("seq", str(seq).encode()), ("empty", b"")]
        return f"customer-{order['customer']['id'] % 50}".encode(), serialize(order, context), headers

    return make


def test_delta_spark_reads_an_avro_table_of_every_kind_of_field_with_its_key_and_headers(
    spark, pipeline, schema_registry, monkeypatch
):
    """Decimals (bytes and fixed), dates, timestamps, structs, arrays of structs, maps, enums, nullable
    fields, bytes, the key and the headers: delta-spark reads what Kafka holds, value for value and type for
    type, as the oracle decodes it with the registry's schema."""
    from test_registry_formats import avro_pipeline

    from offsetlake_local.producer import registry_client

    monkeypatch.setenv("REGISTRY_USER", schema_registry.user)
    monkeypatch.setenv("REGISTRY_PASSWORD", schema_registry.password)
    cfg, topic = avro_pipeline(pipeline, schema_registry, batch=SMALL_BATCHES)
    client = registry_client(schema_registry.url, schema_registry.user, schema_registry.password)
    produce(cfg.kafka, topic, 600, abort_share=0.2, bad_share=0.03, seed=89, make_record=order_maker(client, topic))
    ingest(spark, cfg)
    assert assert_exactly_once(cfg, read=reader(spark)) > 0
    types = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(cfg.table_path).schema}
    assert types["total"] == "decimal(12,2)" and types["placed_on"] == "date"
    assert types["lines"] == "array<struct<sku:string,qty:int,price:decimal(10,3)>>"
    assert types["tags"] == "map<string,bigint>" and types["kafka_headers"] == "map<string,binary>"


def s3a_reader(spark, s3) -> Callable[[Location | str], pa.Table]:
    """delta-spark reading `s3://` tables of the moto server through Hadoop's S3A (hadoop-aws), configured for
    the server's bucket by the docs' example (docs/examples/integrations/spark_s3.py), credentials added."""
    with mock.patch.dict(os.environ, {"LAKE_BUCKET": s3.bucket, "S3_ENDPOINT": s3.url}):
        runpy.run_path(str(EXAMPLES / "spark_s3.py"), init_globals={"spark": spark})
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set(f"fs.s3a.bucket.{s3.bucket}.access.key", s3.access_key)
    hadoop.set(f"fs.s3a.bucket.{s3.bucket}.secret.key", s3.secret_key)
    read = reader(spark)
    return lambda location: read(str(location).replace("s3://", "s3a://", 1))


def test_delta_spark_reads_a_table_on_s3_through_s3a(spark, pipeline, s3):
    """A table and its quarantine on S3 (the moto server), with a checkpoint and a compaction in its log,
    read by delta-spark through `s3a://` with the values the oracle expects."""
    from test_object_storage import s3_pipeline

    (cfg, topic), _prefix = s3_pipeline(pipeline, s3)
    produce(cfg.kafka, topic, 600, bad_share=0.05, seed=90)
    ingest(spark, cfg)
    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb)
    assert compacted.files_removed > compacted.files_added > 0
    checkpoint(cfg.table_location)
    produce(cfg.kafka, topic, 300, bad_share=0.05, seed=91)
    ingest(spark, cfg)
    read = s3a_reader(spark, s3)
    assert assert_exactly_once(cfg, read=read) == read(cfg.table_location).num_rows > 0
    assert sql(spark, f"SELECT count(*) AS n FROM delta.`{cfg.table_path.replace('s3://', 's3a://')}`")[0].n > 0


def test_a_downstream_delta_stream_sees_each_record_once_across_offsetlakes_compactions(spark, pipeline, tmp_path):
    """`readStream.format("delta")` of an offsetlake table into a downstream table, drained after every
    ingest and after every compaction (dataChange=false: nothing for a stream to read again): the downstream
    table holds each row of the table once, equal to it."""
    cfg, topic = pipeline(partitions=2, batch=SMALL_BATCHES)
    downstream, progress = tmp_path / "downstream", tmp_path / "stream-checkpoint"

    def drain() -> None:
        stream = spark.readStream.format("delta").load(cfg.table_path)
        query = (
            stream.writeStream.format("delta")
            .option("checkpointLocation", str(progress))
            .trigger(availableNow=True)
            .start(str(downstream))
        )
        query.awaitTermination()
        assert query.exception() is None

    for seed in range(92, 95):
        produce(cfg.kafka, topic, 400, bad_share=0.02, seed=seed)
        ingest(spark, cfg)
        drain()
        rewritten = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb)
        assert rewritten.files_removed > rewritten.files_added > 0
        drain()
    checkpoint(cfg.table_location)
    drain()

    def rows(uri: str) -> list[tuple]:
        table = spark.read.format("delta").load(uri)
        return sorted(tuple(r) for r in table.select(*sorted(table.columns)).collect())

    assert_exactly_once(cfg)
    seen, table = rows(str(downstream)), rows(cfg.table_path)
    assert len(seen) == len(set(seen)) == len(table) > 0
    assert seen == table


def sorted_rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(row.values()) for row in table.select(sorted(table.column_names)).to_pylist())


def test_a_column_added_by_delta_spark_is_left_null_by_ingest_and_kept_by_compaction(spark, pipeline):
    """ALTER TABLE ADD COLUMNS by a user: the next batches land exactly and leave the columns null; values a
    user then sets in them survive offsetlake's compaction, and the table keeps the columns."""
    cfg, topic = pipeline(partitions=2, records=300, ingest=True, batch=SMALL_BATCHES)
    sql(spark, f"ALTER TABLE {delta(cfg)} ADD COLUMNS (reviewed BOOLEAN, reviewer STRING)")
    produce(cfg.kafka, topic, 300, seed=95)
    ingest(spark, cfg)
    assert_exactly_once(cfg, read=reader(spark), user_columns={"reviewed": pa.bool_(), "reviewer": pa.string()})

    sql(spark, f"UPDATE {delta(cfg)} SET reviewer = 'ana' WHERE kafka_offset < 10")
    produce(cfg.kafka, topic, 300, seed=96)
    ingest(spark, cfg)
    before = sorted_rows(read_with_delta_rs(cfg.table_location))
    compacted = optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb)
    assert compacted.files_removed > compacted.files_added > 0
    assert sorted_rows(read_with_delta_rs(cfg.table_location)) == before  # Spark's INT96 timestamps among them
    rows = sql(spark, f"SELECT kafka_offset, reviewer FROM {delta(cfg)}")
    assert {r.kafka_offset for r in rows if r.reviewer == "ana"} == {
        r.kafka_offset for r in rows if r.kafka_offset < 10
    }
    assert {r.reviewer for r in rows if r.kafka_offset >= 10} == {None}
    assert "reviewed" in DeltaTable(cfg.table_path).schema().to_arrow().names


def test_a_checkpoint_by_delta_rs_leaves_spark_no_stale_checksum_to_trip_over(spark, tmp_path):
    """delta-spark's checkpoint leaves Hadoop's `.crc` beside `_last_checkpoint`; offsetlake's checkpoint on
    delta-rs rewrites that file, and the `.crc` that no longer matches goes with it, so delta-spark reads the
    table's newest checkpoint without failing on its checksum (and retrying)."""
    from offsetlake.engine import spark_transaction
    from offsetlake.storage.hadoop_checksums import matches

    path = tmp_path / "t"
    sql(spark, f"CREATE TABLE delta.`{path}` (a INT) USING delta")
    sql(spark, f"INSERT INTO delta.`{path}` VALUES (1), (2)")
    spark_transaction.checkpoint(spark, str(path))
    log = path / "_delta_log"
    crc = log / "._last_checkpoint.crc"
    assert matches((log / "_last_checkpoint").read_bytes(), crc.read_bytes())  # Spark's, and true

    sql(spark, f"INSERT INTO delta.`{path}` VALUES (3)")
    version = checkpoint(Location(str(path)))

    assert json.loads((log / "_last_checkpoint").read_text())["version"] == version  # delta-rs rewrote it
    assert not crc.exists() or matches((log / "_last_checkpoint").read_bytes(), crc.read_bytes())
    spark.catalog.clearCache()
    assert sorted(r.a for r in spark.read.format("delta").load(str(path)).collect()) == [1, 2, 3]
