"""Tables in a catalog (`table.name: schema.table`): a Hive Metastore from Maven Central on a PostgreSQL
server, both started here; pipelines on either engine register their table, and another Spark session (a
process of its own) finds it by name. What the catalog holds is read where it is kept: the metastore's
PostgreSQL tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from deltalake import DeltaTable

from offsetlake_local.metastore import submit_args
from support import (
    REPO,
    assert_exactly_once,
    assert_job_failed_in_one_line,
    delta_spark_submit_args,
    ingest_process,
    produce,
)

pytestmark = pytest.mark.slow

# Another Spark session, as a user's notebook would open one on the same catalog: by name only.
READER = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").getOrCreate()
found = {}
for name in sys.argv[1:]:
    rows = spark.sql(f"SELECT kafka_topic, kafka_partition, kafka_offset FROM {name}").collect()
    history = spark.sql(f"DESCRIBE HISTORY {name}").collect()
    found[name] = {
        "rows": sorted([r.kafka_topic, r.kafka_partition, r.kafka_offset] for r in rows),
        "count": spark.table(name).count(),
        "history": [[h.version, h.operation, h.userMetadata] for h in history],
    }
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def metastore(tmp_path_factory):
    """PostgreSQL, and a Hive Metastore keeping its catalog there; both stopped by PID."""
    from offsetlake_local import metastore as hive_metastore
    from offsetlake_local import postgres

    work = tmp_path_factory.mktemp("metastore")
    database = postgres.start(database="metastore", user="hive", pid_file=work / "postgres.pid")
    server = hive_metastore.start(work / "hms", database, pid_file=work / "metastore.pid")
    server.database = database
    yield server
    server.stop()
    database.stop()


def read_by_name(metastore, *names: str) -> dict:
    """Each table as another Spark session finds it by name: its rows, its count, its history."""
    done = subprocess.run(
        [sys.executable, "-c", READER, *names],
        env={**os.environ, "PYSPARK_SUBMIT_ARGS": submit_args(metastore), "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def catalog_entry(metastore, name: str) -> dict:
    """The metastore's own record of `schema.table`: its location and parameters, from its database."""
    schema, table = name.split(".")
    conn = metastore.database.connect("metastore")
    try:
        with conn.cursor() as cur:
            cur.execute(
                # Spark keeps a Delta table's location as its storage's `path` parameter (the Hive
                # location is a placeholder: the table is not one Hive itself could read).
                'SELECT p."PARAM_VALUE", t."TBL_ID" FROM "TBLS" t JOIN "DBS" d ON d."DB_ID" = t."DB_ID" '
                'JOIN "SDS" s ON s."SD_ID" = t."SD_ID" '
                'JOIN "SERDE_PARAMS" p ON p."SERDE_ID" = s."SERDE_ID" AND p."PARAM_KEY" = \'path\' '
                'WHERE d."NAME" = %s AND t."TBL_NAME" = %s',
                (schema.lower(), table.lower()),
            )
            found = cur.fetchone()
            if found is None:
                return {}
            cur.execute('SELECT "PARAM_KEY", "PARAM_VALUE" FROM "TABLE_PARAMS" WHERE "TBL_ID" = %s', (found[1],))
            return {"location": found[0], "params": dict(cur.fetchall())}
    finally:
        conn.close()


def ingest(cfg, pipelines_dir, metastore):
    job = ingest_process(cfg, pipelines_dir, {"PYSPARK_SUBMIT_ARGS": submit_args(metastore)})
    out, err = job.communicate(timeout=300)
    job.stdout, job.stderr = out, err
    return job


def test_named_tables_of_both_engines_are_registered_and_found_by_name_in_another_spark_session(
    metastore, pipeline, pipelines_dir, bootstrap
):
    """Both engines register their table when they create it; one other Spark session finds both by name
    (catalog.py is the same code for both, so the refresh after a change made outside offsetlake, and a
    name's refusal, are tried once, on delta-rs)."""
    schema = f"lake_{uuid.uuid4().hex[:6]}"
    tables = {}
    for engine in ("delta-rs", "delta-spark"):
        name = f"{schema}.orders_{engine.replace('-', '_')}"
        cfg, topic = pipeline(partitions=2, records=300, table={"name": name, "engine": engine})
        job = ingest(cfg, pipelines_dir, metastore)
        assert job.returncode == 0, job.stderr[-3000:]
        assert catalog_entry(metastore, name)["params"]["delta.checkpointInterval"] == "10"
        tables[name] = cfg, topic, [1]

    # A property changed outside offsetlake (delta-rs, by path), then more records: the next run puts the
    # property, and the version its batch made, in the catalog's copy.
    on_delta_rs = f"{schema}.orders_delta_rs"
    cfg, topic, _ = tables[on_delta_rs]
    DeltaTable(cfg.table_path).alter.set_table_properties({"delta.checkpointInterval": "7"})
    produce(cfg.kafka, topic, 200)
    job = ingest(cfg, pipelines_dir, metastore)
    assert job.returncode == 0, job.stderr[-3000:]
    assert catalog_entry(metastore, on_delta_rs)["params"]["delta.checkpointInterval"] == "7"
    tables[on_delta_rs] = cfg, topic, [1, 2]

    found = read_by_name(metastore, *tables)
    for name, (cfg, topic, batches) in tables.items():
        assert_exactly_once(cfg, topic)
        entry = catalog_entry(metastore, name)
        assert entry["location"].rstrip("/") in (f"file:{cfg.table_path}", f"file://{cfg.table_path}"), entry
        assert entry["params"]["spark.sql.sources.provider"] == "delta"
        assert entry["params"]["delta.lastUpdateVersion"] == str(DeltaTable(cfg.table_path).version())

        columns = ["kafka_topic", "kafka_partition", "kafka_offset"]
        by_path = DeltaTable(cfg.table_path).to_pyarrow_table(columns=columns)
        assert found[name]["rows"] == sorted(map(list, zip(*by_path.to_pydict().values(), strict=True)))
        assert found[name]["count"] == by_path.num_rows > 0
        history = found[name]["history"]
        assert sorted(json.loads(meta)["batch"] for _, op, meta in history if meta) == batches, (name, history)

    # another pipeline taking a name is refused before it writes anything
    other, _ = pipeline(partitions=1, records=20, table={"name": on_delta_rs})
    job = ingest(other, pipelines_dir, metastore)
    assert_job_failed_in_one_line(job, f"table.name {on_delta_rs} is the catalog's name for", "nothing was written")
    assert not DeltaTable.is_deltatable(other.table_path)
    assert catalog_entry(metastore, on_delta_rs)["location"].rstrip("/").endswith(tables[on_delta_rs][0].table_path)


def test_a_catalog_that_does_not_answer_fails_the_job_in_one_line_before_anything_is_written(
    metastore, pipeline, pipelines_dir
):
    from offsetlake_local.broker import free_port

    cfg, _ = pipeline(partitions=1, records=20, table={"name": f"lake_{uuid.uuid4().hex[:6]}.orders"})
    nowhere = metastore.spark_conf() | {
        "spark.hadoop.hive.metastore.uris": f"thrift://127.0.0.1:{free_port()}",
        "spark.hadoop.hive.metastore.connect.retries": "1",
    }
    confs = " ".join(f"--conf {key}={value}" for key, value in nowhere.items())
    job = ingest_process(cfg, pipelines_dir, {"PYSPARK_SUBMIT_ARGS": f"{confs} {delta_spark_submit_args()}"})
    job.stdout, job.stderr = job.communicate(timeout=300)

    assert_job_failed_in_one_line(job, f"table.name {cfg.table.name}: the Spark session's catalog failed")
    assert not DeltaTable.is_deltatable(cfg.table_path)
