"""`make bench` (its engines part): the two commit engines side by side, Spark's own Kafka source beside them.

Not collected by pytest. The same records in raw, JSON and Avro (bench_ingest's events and topics), each
ingested by offsetlake with `table.engine: delta-rs` and with `table.engine: delta-spark` -- append, and
for JSON and Avro upsert on `user_id` too -- in one Spark session that has delta-spark's jars, each ingest
into a table of its own:

  first    the engine's first ingest of that format and mode in the session (for delta-spark, its
           classes are loaded and compiled then)
  warm     the median of RUNS more

then Spark's peer (Spark's Kafka source writing Delta with delta-spark, peer.py) on the same topics, warm
and first batch, in a process of its own. Rates are compared as ratios within the run (this machine is
shared): delta-spark's over delta-rs', and each engine's append over the peer's.

    python tests/benchmarks/bench_engines.py [--records 1000000] [--bootstrap HOST:PORT ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_ingest as bench  # noqa: E402 - this directory is not a package

from offsetlake.config import parse_pipeline  # noqa: E402
from offsetlake.spark.session import build_session, delta_spark_conf  # noqa: E402
from offsetlake_local.jars import delta_spark_jars_arg  # noqa: E402

ENGINES = ("delta-rs", "delta-spark")
UPSERT = {"mode": "upsert", "key": ["user_id"], "order_by": "seq", "deletes": "ignore"}  # keys in every partition


def pipeline(name: str, bootstrap: str, topic: str, lake: Path, fmt: dict, engine: str, upsert: bool):
    bench.PIPELINES.add(name)
    return parse_pipeline(
        {
            "name": name,
            "topics": [topic],
            "kafka": {"bootstrap_servers": bootstrap, "client": dict(bench.CLIENT)},
            "table": {"path": str(lake / name), "engine": engine},
            "format": fmt,
            "batch": {"max_records_per_batch": 1_000_000, "max_records_per_task": 250_000},
            **({"write": UPSERT} if upsert else {}),
        },
        f"{name}.yaml",
    )


def measure(spark, bootstrap: str, topics: dict[str, str], formats: dict[str, dict], lake: Path) -> dict:
    """{(engine, format, mode): {"first": (records, seconds), "warm": (records, seconds)}}."""
    out = {}
    for engine in ENGINES:
        for kind, fmt in formats.items():
            for upsert in (False, True) if kind != "raw" else (False,):
                mode = "upsert" if upsert else "append"
                label = f"{engine.replace('-', '_')}_{kind}_{mode}"
                runs = [
                    bench.timed_ingest(
                        spark, pipeline(f"{label}_{i}", bootstrap, topics[kind], lake, fmt, engine, upsert)
                    )
                    for i in range(bench.RUNS + 1)
                ]
                warm = runs[1:]
                out[engine, kind, mode] = {
                    "first": runs[0],
                    "warm": (statistics.median(n for n, _ in warm), statistics.median(s for _, s in warm)),
                }
    return out


def report(found: dict, peer_found: dict | None) -> None:
    width = 40
    print(f"\n{'engine, format, mode':<{width}} {'first rec/s':>12} {'warm rec/s':>12} {'spark/rs':>9} {'/peer':>7}")
    for (engine, kind, mode), runs in found.items():
        first, warm = (n / s for n, s in (runs["first"], runs["warm"]))
        rs = found["delta-rs", kind, mode]["warm"]
        versus_rs = warm / (rs[0] / rs[1])
        peer_rate = ""
        if peer_found and mode == "append":
            p = peer_found[kind]
            peer_rate = f"{warm / (p['records'] / p['seconds']):.1f}x"
        label = f"{engine}, {kind}, {mode}"
        print(f"{label:<{width}} {first:>12,.0f} {warm:>12,.0f} {versus_rs:>8.2f}x {peer_rate:>7}")
    if peer_found:
        p = peer_found["first"]
        print(f"peer first batch of a session, raw: {p['records'] / p['seconds']:,.0f} rec/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--bootstrap", metavar="HOST:PORT", help="a Kafka cluster instead of the embedded broker")
    parser.add_argument("--registry", metavar="URL", help="a Schema Registry (default: the embedded one)")
    parser.add_argument("--client-config", metavar="FILE", help="librdkafka settings for every client")
    parser.add_argument("--no-peer", action="store_true", help="leave Spark's own Kafka source out")
    args = parser.parse_args(argv)
    with bench.work_directory("offsetlake-bench-engines-") as work:
        return bench_engines(args, work)


def bench_engines(args, work: Path) -> int:
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"{delta_spark_jars_arg()} pyspark-shell"  # before the session's JVM
    with bench.broker_under_test(args, work) as (bootstrap, registry_url, described):
        events, lake = bench.topic_name("events"), work / "lake"
        bench.create_topic(bootstrap, events)
        bench.produce(bootstrap, events, args.records)
        formats = {
            "raw": {"type": "raw"},
            "json": bench.JSON_FORMAT,
            "avro": bench.avro_events(bootstrap, registry_url, lake, args.records),
        }
        topics = {"raw": events, "json": events, "avro": bench.topic_name("avro")}
        spark = build_session("offsetlake-bench-engines", extra_conf=delta_spark_conf({}))
        try:
            found = measure(spark, bootstrap, topics, formats, lake)
        finally:
            spark.stop()
        peers = None if args.no_peer else bench.peers(bootstrap, topics, args.records, work)
    print(f"broker: {described}; {args.records:,} records per ingest")
    report(found, peers["spark"] if peers else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
