"""The peers `make bench` measures offsetlake beside, on the same topics, broker and cores.

Spark's own Kafka source (spark-sql-kafka-0-10, at pyspark's version: poms/spark-kafka.xml) writing Delta
with delta-spark (poms/delta-spark.xml), as a Spark user would ingest a topic exactly once: a Structured
Streaming query from the earliest offsets, `trigger(availableNow=True)`, a checkpoint of its own and a new
Delta table per run, under read_committed. Raw (key, value and the record's coordinates), JSON
(`from_json`) and Avro (`from_avro` of the Confluent-framed value, its 5-byte header cut; spark-avro).

It runs in a process of its own (`python peer.py ...`), a new JVM, as each spark-submit is: the first
query of that session is the peer's first batch; then RUNS warm runs of each format. Its last line of
output is the JSON the bench reads.

And the physical anchor: Apache Kafka's own consumer benchmark (kafka-consumer-perf-test,
`org.apache.kafka.tools.ConsumerPerformance` at the broker's version: poms/kafka-tools.xml), one JVM
consumer reading every partition of the topic under read_committed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 3
# The columns the bench's JSON events and BENCH_AVRO hold, as Spark's DDL.
EVENT_DDL = "event_id STRING, user_id BIGINT, action STRING, amount DOUBLE, event_time TIMESTAMP, seq BIGINT"
LINEAGE = ["topic", "partition", "offset", "timestamp"]


def peer_session():
    from pyspark.sql import SparkSession

    from offsetlake_local.jars import delta_spark_stack, spark_jars

    jars = spark_jars(delta_spark_stack()) + spark_jars("spark-kafka")
    return (
        SparkSession.builder.master("local[2]")
        .appName("offsetlake-bench-peer")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def records_of(spark, bootstrap: str, topic: str, kind: str, avro_schema: str | None):
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .load()
    )
    if kind == "raw":
        return source.select("key", "value", *LINEAGE)
    if kind == "json":
        event = F.from_json(F.col("value").cast("string"), EVENT_DDL)
        return source.select(event.alias("e"), *LINEAGE).select("e.*", *LINEAGE)
    from pyspark.sql.avro.functions import from_avro

    body = F.expr("substring(value, 6, length(value) - 5)")  # the Confluent framing: magic byte, schema id
    return source.select(from_avro(body, avro_schema).alias("e"), *LINEAGE).select("e.*", *LINEAGE)


def one_run(spark, bootstrap: str, topic: str, kind: str, avro_schema: str | None, work: Path) -> tuple[int, float]:
    """Records and seconds of one availableNow query into a new Delta table, from start to its last commit."""
    run = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=work))
    started = time.perf_counter()
    query = (
        records_of(spark, bootstrap, topic, kind, avro_schema)
        .writeStream.format("delta")
        .option("checkpointLocation", str(run / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(run / "table"))
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise SystemExit(f"peer: the {kind} query failed: {query.exception()}")
    records = sum(p["numInputRows"] for p in query.recentProgress)
    shutil.rmtree(run, ignore_errors=True)
    return records, seconds


def measure(bootstrap: str, topics: dict[str, str], avro_schema: str, work: Path) -> dict:
    """{session_seconds, first: {records, seconds}, <kind>: {records, seconds}} (medians of RUNS)."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    spark = peer_session()
    out: dict = {"session_seconds": time.perf_counter() - started}
    records, seconds = one_run(spark, bootstrap, topics["raw"], "raw", None, work)
    out["first"] = {"records": records, "seconds": seconds}
    for kind, topic in topics.items():
        runs = [one_run(spark, bootstrap, topic, kind, avro_schema, work) for _ in range(RUNS)]
        out[kind] = {
            "records": statistics.median(r for r, _ in runs),
            "seconds": statistics.median(s for _, s in runs),
        }
    spark.stop()
    return out


def spark_peer(bootstrap: str, topics: dict[str, str], avro_schema: dict, work: Path) -> dict:
    """The Spark peer in a process of its own; `topics`: {"raw": ..., "json": ..., "avro": ...}."""
    done = subprocess.run(
        [sys.executable, __file__, bootstrap, json.dumps(topics), json.dumps(avro_schema), str(work)],
        capture_output=True,
        text=True,
        timeout=3600,
        # its own jars (peer_session): a PYSPARK_SUBMIT_ARGS of the caller's (bench_engines sets one) would
        # start its JVM with the caller's instead, and without Spark's Kafka source
        env={
            **{k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"},
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        },
    )
    if done.returncode != 0:
        raise RuntimeError(f"the Spark peer failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def kafka_perf_test(bootstrap: str, topic: str, records: int, client: dict[str, str] | None = None) -> dict:
    """Apache Kafka's kafka-consumer-perf-test reading `records` of `topic` under read_committed:
    {records, seconds, rate, fetch_rate} (fetch_rate leaves out the group join, as a reader's time would)."""
    from offsetlake_local.jars import classpath
    from offsetlake_local.jvm import java

    properties = {"isolation.level": "read_committed", **(client or {})}
    command = [java(), "-Xmx1g", "-cp", classpath("kafka-tools"), "org.apache.kafka.tools.ConsumerPerformance"]
    command += ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records)]
    command += ["--hide-header", "--timeout", "30000"]
    for key, value in properties.items():
        command += ["--command-property", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.count(",") >= 9), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"kafka-consumer-perf-test failed: {(done.stdout + done.stderr)[-2000:]}")
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
    # fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    fields = [f.strip() for f in line.split(",")]
    consumed, rate, fetch_ms, fetch_rate = int(fields[4]), float(fields[5]), float(fields[7]), float(fields[9])
    return {"records": consumed, "seconds": fetch_ms / 1000, "rate": rate, "fetch_rate": fetch_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description="the Spark peer (run by bench_ingest.py)")
    parser.add_argument("bootstrap")
    parser.add_argument("topics", help='JSON: {"raw": topic, "json": topic, "avro": topic}')
    parser.add_argument("avro_schema", help="the Avro value schema, JSON")
    parser.add_argument("work")
    args = parser.parse_args()
    print(json.dumps(measure(args.bootstrap, json.loads(args.topics), args.avro_schema, Path(args.work))))


if __name__ == "__main__":
    main()
