"""make bench's upsert lines: a batch of 1M records over 100k keys MERGEd into tables of 1M and 10M rows,
next to the same records appended, and what the MERGE itself costs at each size.

The tables are built as a CDC table grows: keys (user_id) inserted in increasing order (an auto-increment
id), 1M rows per file. The records update the newest keys and insert new ones (90k existing keys and 10k
new, each key in one partition, as Kafka's default partitioner keeps a key). Each MERGE is bounded by
the batch's key range (upsert.Merge.predicate), so delta-rs reads and rewrites only the files that range
touches: the MERGE time must not grow in proportion to the table (target: at 10M rows within 2x of 1M).
A batch whose keys are spread over the whole table (`uniform keys`) touches every file: that line shows
the cost the range cannot save (partition such a table; see docs/concepts/write-modes.md).

    python tests/benchmarks/bench_upsert.py [--records 1000000] [--keys 100000] [--sizes 1000000,10000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "benchmarks"))

from bench_ingest import JSON_FORMAT, create_topic  # noqa: E402

from offsetlake.batch import ingest  # noqa: E402
from offsetlake.config import parse_pipeline  # noqa: E402
from offsetlake.formats.columns import table_schema  # noqa: E402
from offsetlake.spark.session import build_session  # noqa: E402
from offsetlake.table import open_table  # noqa: E402
from offsetlake_local import broker as embedded_broker  # noqa: E402

PARTITIONS = 4
ROWS_PER_FILE = 1_000_000


def pipeline(name: str, bootstrap: str, topic: str, lake: Path, upsert: bool):
    return parse_pipeline(
        {
            "name": name,
            "topics": [topic],
            "kafka": {"bootstrap_servers": bootstrap},
            "table": {"path": str(lake / name)},
            "format": JSON_FORMAT,
            "batch": {"max_records_per_batch": 10_000_000, "max_records_per_task": 250_000},
            **({"write": {"mode": "upsert", "key": ["user_id"]}} if upsert else {}),
        },
        f"{name}.yaml",
    )


def produce(bootstrap: str, topic: str, count: int, keys: np.ndarray, seed: int) -> None:
    """`count` JSON events, each of a key drawn from `keys`, the key's partition its user_id mod 4."""
    rng = np.random.default_rng(seed)
    drawn = rng.choice(keys, size=count)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    actions = ["view", "click", "buy"]
    for i, user in enumerate(drawn.tolist()):
        value = (
            f'{{"event_id":"u{seed}-{i:09d}","user_id":{user},"action":"{actions[i % 3]}",'
            f'"amount":{(i % 50000) / 100:.2f},"event_time":"2026-11-25T10:00:00.000Z","seq":{i}}}'
        ).encode()
        while True:
            try:
                producer.produce(topic, value=value, key=str(user).encode(), partition=user % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)


def build_table(cfg, rows: int) -> None:
    """An upsert table of `rows` keys 0..rows-1, inserted in key order, ROWS_PER_FILE per file."""
    schema = table_schema(cfg)
    open_table(cfg.table_location, schema, [], cfg.name, properties=cfg.table_properties())
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for start in range(0, rows, ROWS_PER_FILE):
        n = min(ROWS_PER_FILE, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        chunk = pa.table(
            {
                "event_id": pa.array([f"h{i}" for i in range(start, start + n)]),
                "user_id": ids,
                "action": pa.array(["view"] * n),
                "amount": pa.array(np.round(ids % 50000 / 100, 2)),
                "event_time": pa.array([when] * n, schema.field("event_time").type),
                "seq": ids,
                "kafka_topic": pa.array(["history"] * n),
                "kafka_partition": pa.array(np.zeros(n, dtype=np.int32)),
                "kafka_offset": ids,
                "kafka_timestamp": pa.array([when] * n, schema.field("kafka_timestamp").type),
            },
            schema=schema,
        )
        write_deltalake(cfg.table_path, chunk, mode="append")


def warm_up(spark, bootstrap: str, lake: Path) -> None:
    """One small upsert first, so that no measured batch pays for Spark's and the JVM's first run."""
    create_topic(bootstrap, "bench_upsert_warm", PARTITIONS)
    produce(bootstrap, "bench_upsert_warm", 20_000, np.arange(1000, dtype=np.int64), seed=1)
    cfg = pipeline("up_warm", bootstrap, "bench_upsert_warm", lake, upsert=True)
    build_table(cfg, 2000)
    timed_ingest(spark, cfg)
    shutil.rmtree(cfg.table_path, ignore_errors=True)


def timed_ingest(spark, cfg) -> tuple[float, dict]:
    """(seconds of the ingest, the last commit's operationMetrics)."""
    started = time.perf_counter()
    results = [r for r in ingest(spark, cfg) if r.status == "committed"]
    seconds = time.perf_counter() - started
    assert len(results) == 1, f"{cfg.name}: one batch expected, got {len(results)}"
    return seconds, DeltaTable(cfg.table_path).history(1)[0].get("operationMetrics", {})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--sizes", default="1000000,10000000", help="table sizes, comma-separated")
    parser.add_argument("--no-uniform", action="store_true", help="leave out the uniform-keys lines")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="offsetlake-bench-upsert-"))
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    broker = embedded_broker.start(work / "broker")
    bootstrap = broker.bootstrap_servers
    spark = build_session("offsetlake-bench-upsert", "local[2]")
    lake = work / "lake"
    merges: dict[str, dict[int, float]] = {"recent": {}, "uniform": {}}
    try:
        log(f"upsert: {args.records:,} records over {args.keys:,} keys; broker Apache Kafka (embedded); 2 cores")
        warm_up(spark, bootstrap, lake)
        for kind in ("recent", "uniform"):
            if kind == "uniform" and args.no_uniform:
                continue
            for size in sizes:
                topic = f"bench_upsert_{kind}_{size}"
                create_topic(bootstrap, topic, PARTITIONS)
                rng = random.Random(size)
                if kind == "recent":  # 90% of the keys the newest rows', 10% new ids after them
                    keys = np.arange(size - args.keys * 9 // 10, size + args.keys // 10, dtype=np.int64)
                else:
                    keys = np.array(rng.sample(range(size), args.keys), dtype=np.int64)
                produce(bootstrap, topic, args.records, keys, seed=size)
                cfg = pipeline(f"up_{kind}_{size}", bootstrap, topic, lake, upsert=True)
                started = time.perf_counter()
                build_table(cfg, size)
                log(f"  built a {size:,}-row table in {time.perf_counter() - started:.0f} s")
                files = len(DeltaTable(cfg.table_path).file_uris())
                seconds, metrics = timed_ingest(spark, cfg)
                merges[kind][size] = metrics.get("execution_time_ms", 0) / 1000
                log(
                    f"  {kind} keys into {size:,} rows: batch {seconds:.1f} s ({args.records / seconds:,.0f} rec/s), "
                    f"MERGE {merges[kind][size]:.1f} s, files rewritten {metrics.get('num_target_files_removed')} "
                    f"of {files}, "
                    f"rows updated {metrics.get('num_target_rows_updated'):,}, inserted "
                    f"{metrics.get('num_target_rows_inserted'):,}"
                )
                if kind == "recent" and size == sizes[-1]:  # the same records, appended
                    append = pipeline(f"ap_{size}", bootstrap, topic, lake, upsert=False)
                    append_seconds, _ = timed_ingest(spark, append)
                    log(
                        f"upsert of {args.records:,} records over {args.keys:,} keys into {size:,} rows: "
                        f"{seconds:.1f} s ({args.records / seconds:,.0f} rec/s); append of the same records: "
                        f"{append_seconds:.1f} s ({args.records / append_seconds:,.0f} rec/s); upsert/append "
                        f"{seconds / append_seconds:.1f}x"
                    )
                shutil.rmtree(cfg.table_path, ignore_errors=True)
        small, large = sizes[0], sizes[-1]
        growth = merges["recent"][large] / max(merges["recent"][small], 1e-3)
        log(
            f"MERGE per batch, recent keys: {merges['recent'][small]:.1f} s at {small:,} rows, "
            f"{merges['recent'][large]:.1f} s at {large:,} ({growth:.1f}x for {large / small:.0f}x the rows; "
            f"target: within 2x) -> {'met' if growth <= 2 else 'NOT met'}"
        )
        if merges["uniform"]:
            log(
                f"MERGE per batch, uniform keys (every file touched): {merges['uniform'][small]:.1f} s at "
                f"{small:,} rows, {merges['uniform'][large]:.1f} s at {large:,}"
            )
    finally:
        spark.stop()
        embedded_broker.stop(broker.pid)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
