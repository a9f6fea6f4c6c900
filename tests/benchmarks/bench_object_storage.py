"""make bench's object-storage lines: the raw ingest into an S3 table next to the same ingest into a local
table (same run, same records), and the HTTP requests one batch costs on a new S3 table and on one with
1,000 commits.

The S3 server is moto's (in memory, on loopback), behind the fault proxy of the tests, which here only
counts requests. The ingests run in one Spark session, alternating local and S3, RUNS times each; the
medians are compared as a ratio (target: the S3 rate at least 80% of the local one). The request counts
come from the real commit path (`bench_soak.one_batch`: the ledger read, the verdict, one Parquet file,
one Delta commit, attempt clean-up) on a table that gets the maintenance a stream does (compaction every
50 batches, checkpoints at the table's interval): with a checkpoint every 10 commits, a batch lists the
log and reads the newest checkpoint and the commits after it, so its requests must not grow with the
table's age (target: at 1,000 commits within +25% of a new table's, as medians of 20 batches).

    python tests/benchmarks/bench_object_storage.py [--records 400000] [--commits 1000] [--bootstrap H:P]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO / "tests", REPO / "tests" / "benchmarks"):
    sys.path.insert(0, str(path))

import bench_soak  # noqa: E402
from bench_ingest import JSON_FORMAT, create_topic, produce  # noqa: E402

from hosts import S3Server  # noqa: E402
from offsetlake.batch import BatchResult, ingest  # noqa: E402
from offsetlake.config import parse_pipeline  # noqa: E402
from offsetlake.formats.columns import table_schema  # noqa: E402
from offsetlake.protocol.metadata import Run  # noqa: E402
from offsetlake.spark.session import build_session  # noqa: E402
from offsetlake.streaming import StreamCompaction  # noqa: E402
from offsetlake.table import open_table  # noqa: E402
from offsetlake_local import broker as embedded_broker  # noqa: E402
from store_faults import StoreProxy  # noqa: E402

RUNS = 3
REQUEST_SAMPLES = 20


def ingest_pipeline(name: str, bootstrap: str, topic: str, table: dict):
    return parse_pipeline(
        {
            "name": name,
            "topics": [topic],
            "kafka": {"bootstrap_servers": bootstrap},
            "table": table,
            "quarantine": {**table, "path": table["path"] + "_quarantine"},
            "format": JSON_FORMAT,
            "batch": {"max_records_per_batch": 1_000_000, "max_records_per_task": 250_000},
        },
        f"{name}.yaml",
    )


def compare_ingest(spark, bootstrap: str, records: int, lake: Path, s3: S3Server, log) -> tuple[float, float]:
    """Median rates (records/s) of the same ingest into a local and an S3 table, alternating."""
    topic = "bench_object_storage"
    create_topic(bootstrap, topic, 4)
    produce(bootstrap, topic, records)
    rates: dict[str, list[float]] = {"local": [], "s3": []}
    for run in range(RUNS):
        for where in ("local", "s3"):
            name = f"os_{where}_{run}"
            table = (
                {"path": str(lake / name)}
                if where == "local"
                else {"path": f"s3://{s3.bucket}/{name}", "storage_options": s3.storage_options()}
            )
            cfg = ingest_pipeline(name, bootstrap, topic, table)
            started = time.perf_counter()
            n = sum(r.records for r in ingest(spark, cfg))
            rates[where].append(n / (time.perf_counter() - started))
            log(f"  {where:<5} run {run + 1}: {n} records at {rates[where][-1]:,.0f} rec/s")
    return statistics.median(rates["local"]), statistics.median(rates["s3"])


def soak_pipeline(proxy: StoreProxy, s3: S3Server, name: str):
    doc = {
        "name": name,
        "topics": [bench_soak.TOPIC],
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "table": {
            "path": f"s3://{s3.bucket}/{name}",
            "storage_options": s3.storage_options(AWS_ENDPOINT_URL=proxy.url),
        },
        "format": {"type": "raw"},
        "maintenance": {"compact_every_batches": 50},
    }
    cfg = parse_pipeline(doc, name)
    open_table(cfg.table_location, table_schema(cfg), [], cfg.name, properties=cfg.maintenance.table_properties())
    return cfg


def requests_per_batch(proxy: StoreProxy, cfg, run: Run, tidy: StreamCompaction, first: int) -> list[int]:
    counts = []
    for n in range(first, first + REQUEST_SAMPLES):
        before = proxy.seen["requests"]
        _, files = bench_soak.one_batch(cfg, run, n)
        counts.append(proxy.seen["requests"] - before - 1)  # less the count's own request
        tidy.after(BatchResult("committed", n, files=files))
    return counts


def request_growth(s3: S3Server, commits: int, log) -> tuple[float, float]:
    """Median requests of one batch on a new S3 table and after `commits` commits."""
    proxy = StoreProxy(s3.port)
    try:
        cfg = soak_pipeline(proxy, s3, "os_requests")
        run = Run.here()
        tidy = StreamCompaction(cfg, run)
        new = requests_per_batch(proxy, cfg, run, tidy, 1)
        started = time.perf_counter()
        for n in range(REQUEST_SAMPLES + 1, commits + 1):
            _, files = bench_soak.one_batch(cfg, run, n)
            tidy.after(BatchResult("committed", n, files=files))
        log(f"  {commits} commits on S3 in {time.perf_counter() - started:.0f} s")
        old = requests_per_batch(proxy, cfg, run, tidy, commits + 1)
        return statistics.median(new), statistics.median(old)
    finally:
        proxy.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--commits", type=int, default=1_000)
    parser.add_argument("--bootstrap", help="a broker to use instead of the embedded Apache Kafka node")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="offsetlake-bench-s3-"))
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    broker = None if args.bootstrap else embedded_broker.start(work / "broker")
    bootstrap = args.bootstrap or broker.bootstrap_servers
    s3 = S3Server.start(work)
    spark = build_session("offsetlake-bench-s3", "local[2]")
    try:
        log(
            f"object storage: moto's S3 server on loopback; broker {'Apache Kafka (embedded)' if broker else bootstrap}"
        )
        local_rate, s3_rate = compare_ingest(spark, bootstrap, args.records, work / "lake", s3, log)
        share = s3_rate / local_rate
        log(
            f"ingest into S3 {s3_rate:,.0f} rec/s vs local {local_rate:,.0f} rec/s: {share:.0%} "
            f"(target: at least 80%) -> {'met' if share >= 0.8 else 'NOT met'}"
        )
        if not args.commits:  # --commits 0: the ingest line only
            return 0
        new, old = request_growth(s3, args.commits, log)
        growth = old / new - 1
        log(
            f"HTTP requests per batch on S3: {new:.0f} on a new table, {old:.0f} after {args.commits} commits "
            f"({growth:+.0%}; target: within +25%) -> {'met' if growth <= 0.25 else 'NOT met'}"
        )
    finally:
        spark.stop()
        s3.stop()
        if broker is not None:
            embedded_broker.stop(broker.pid)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
