"""`make bench`: offsetlake ingest throughput next to the raw Kafka read rate, measured in one run.

Not collected by pytest. Prints a table and writes tests/benchmarks/results.json.
Rates are compared as ratios within the run because this machine is shared.

    python tests/benchmarks/bench_ingest.py [--records 1000000] [--partitions 4]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from offsetlake import broker
from offsetlake.batch import ingest
from offsetlake.config import parse_pipeline
from offsetlake.kafka import KafkaCluster
from offsetlake.producer import ensure_topic
from offsetlake.spark import build_session

RESULTS = Path(__file__).with_name("results.json")
ACTIONS = ("view", "click", "add_to_cart", "purchase", "refund")


def produce(bootstrap: str, topic: str, count: int) -> float:
    """~110-byte JSON events through an idempotent producer. Returns seconds."""
    rng = random.Random(1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.num.messages": 10000, "queue.buffering.max.messages": 1_000_000})
    started = time.perf_counter()
    for i in range(count):
        value = (f'{{"event_id":"e{i:012d}","user_id":{rng.randrange(5000)},"action":"{rng.choice(ACTIONS)}",'
                 f'"amount":{rng.uniform(0, 500):.2f},"event_time":"2026-11-22T10:00:00.000Z","seq":{i}}}')
        while True:
            try:
                producer.produce(topic, value=value.encode(), partition=i % 4)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    return time.perf_counter() - started


def raw_read(bootstrap: str, topic: str, ends: dict) -> tuple[int, float]:
    """One confluent-kafka consumer, read_committed, the whole topic: the physical anchor."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-raw", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "receive.message.max.bytes": 1_000_000_000})  # noida-db ignores fetch.max.bytes
    consumer.assign([TopicPartition(t, p, 0) for (t, p) in ends])
    remaining, n = {p for (_, p), e in ends.items() if e > 0}, 0
    started = time.perf_counter()
    while remaining:
        for msg in consumer.consume(10000, 1.0):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[(topic, msg.partition())]:
                    remaining.discard(msg.partition())
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    print(f"raw read: {msg.error().str()}")
                continue
            n += 1
            if msg.offset() + 1 >= ends[(topic, msg.partition())]:
                remaining.discard(msg.partition())
    elapsed = time.perf_counter() - started
    consumer.close()
    return n, elapsed


def pipeline(name: str, bootstrap: str, topic: str, lake: Path, fmt: dict):
    return parse_pipeline({
        "name": name, "topics": [topic], "kafka": {"bootstrap_servers": bootstrap},
        "table": {"path": str(lake / name)}, "format": fmt,
        "batch": {"max_records_per_batch": 1_000_000, "max_records_per_task": 250_000},
    }, f"{name}.yaml")


def timed_ingest(spark, cfg) -> tuple[int, float]:
    started = time.perf_counter()
    results = ingest(spark, cfg)
    return sum(r.records for r in results), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="offsetlake-bench-"))
    b = broker.start(work / "broker")
    try:
        topic = "bench.events"
        cfg_any = pipeline("bench_raw", b.bootstrap_servers, topic, work / "lake", {"type": "raw"})
        ensure_topic(cfg_any.kafka, topic, 4)
        produce_s = produce(b.bootstrap_servers, topic, args.records)
        cluster = KafkaCluster(cfg_any.kafka)
        ends = cluster.end_offsets(cluster.partitions([topic]), "read_committed")
        n_raw, raw_s = raw_read(b.bootstrap_servers, topic, ends)

        started = time.perf_counter()
        spark = build_session("offsetlake-bench")
        spark.range(4, numPartitions=4).count()  # start the Python workers
        session_s = time.perf_counter() - started

        n_rawfmt, rawfmt_s = timed_ingest(spark, cfg_any)
        cfg_json = pipeline("bench_json", b.bootstrap_servers, topic, work / "lake", {"type": "json", "schema": [
            {"name": "event_id", "type": "string", "required": True}, {"name": "user_id", "type": "long"},
            {"name": "action", "type": "string"}, {"name": "amount", "type": "double"},
            {"name": "event_time", "type": "timestamp"}, {"name": "seq", "type": "long"}]})
        n_json, json_s = timed_ingest(spark, cfg_json)

        produce(b.bootstrap_servers, topic, 1000)
        n_small, small_s = timed_ingest(spark, cfg_any)
        spark.stop()
    finally:
        broker.stop(b.pid)

    raw_rate = n_raw / raw_s
    rows = [
        ("raw read (1 consumer, read_committed)", n_raw, raw_s, raw_rate, 1.0),
        ("offsetlake ingest, raw format", n_rawfmt, rawfmt_s, n_rawfmt / rawfmt_s, n_rawfmt / rawfmt_s / raw_rate),
        ("offsetlake ingest, json format", n_json, json_s, n_json / json_s, n_json / json_s / raw_rate),
        ("small batch (1,000 new records, warm)", n_small, small_s, n_small / small_s, None),
    ]
    print(f"\nproduced {args.records} records in {produce_s:.1f}s; Spark session start {session_s:.1f}s (reported apart)")
    print(f"{'measure':<42} {'records':>9} {'seconds':>8} {'rec/s':>10} {'of raw read':>12}")
    for name, n, s, rate, ratio in rows:
        print(f"{name:<42} {n:>9} {s:>8.2f} {rate:>10.0f} {'' if ratio is None else f'{ratio:.1%}':>12}")
    RESULTS.write_text(json.dumps({"records": args.records, "produce_seconds": produce_s,
                                   "spark_session_seconds": session_s,
                                   "rows": [dict(zip(("measure", "records", "seconds", "rate", "ratio"), r)) for r in rows]},
                                  indent=2))
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
