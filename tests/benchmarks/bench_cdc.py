"""make bench's change-data-capture line: a 10-table PostgreSQL workload captured by Debezium's PostgreSQL
connector (a Kafka Connect worker, JsonConverter with schemas) into the embedded Apache Kafka broker (or
`--bootstrap`, a plaintext cluster of yours: the run's topics and consumer groups are deleted after), applied
to Delta by one offsetlake upsert pipeline with a table per topic (format connect_json, envelope debezium) in
one Spark session, `--tables-at-once` tables at a time (`batch.tables_at_once`), as `offsetlake ingest` runs.

1. Throughput: each table gets `--events` inserts, then updates of half its rows and deletes of a tenth,
   committed and captured (the replication slot confirmed their last LSN) before offsetlake starts; then
   one run ingests every table's backlog. Events per second = change events applied / seconds of the ingests
   (after a warm-up ingest, so that no measured batch pays for Spark's first run). Each table is then
   checked against its source (row count and sum of amounts).
2. Delay: the workload commits `--rate` transactions a second for `--seconds`, while a stream serves the
   pipeline (`offsetlake stream`: rounds over its tables in one Spark session, `--stream-tables-at-once` at
   a time, `stream_interval_seconds` `--interval` apart, batches of up to `--driver-reads-up-to` offsets
   read by its driver) until Debezium has captured the whole workload and a round has gone by. Each row
   carries `changed_at`, the clock at its statement in its (one-statement) transaction; the delay of a
   change is its Delta commit's time (the change data feed's `_commit_timestamp`) minus that: median and
   p99 over every insert and update the feed holds from this phase, split at its Kafka record's timestamp
   into Debezium's capture and offsetlake's part.

Targets, printed as met or not: at least APPLIED_TARGET change events a second applied, and a delay p99 under
DELAY_P99_TARGET seconds at 100 transactions a second.

    python tests/benchmarks/bench_cdc.py [--events 20000] [--rate 100] [--seconds 60] [--tables-at-once 4]
        [--stream-tables-at-once 2] [--interval 0.1] [--driver-reads-up-to 1000] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from offsetlake.config import parse_pipeline
from offsetlake.kafka import KafkaCluster
from offsetlake.protocol.metadata import Run
from offsetlake.runs import ingest_tables, tables_of
from offsetlake.spark.session import build_session
from offsetlake.streaming import stream
from offsetlake.table import query
from offsetlake_local import broker as embedded_broker
from offsetlake_local import connect, postgres

sys.path.insert(0, str(Path(__file__).parent))
from bench_ingest import print_targets  # noqa: E402 - this directory is not a package

APPLIED_TARGET = 70_000  # change events a second, the ten tables' backlogs applied
DELAY_P99_TARGET = 2.0  # seconds, source statement to Delta commit
TABLES = [f"t{i}" for i in range(10)]
SCHEMA = "bench"
PREFIX = "cdc"  # Debezium's topic prefix on the embedded broker; a cluster of yours gets one of the run's own
TABLE_SQL = "CREATE TABLE bench.{t} (id bigint PRIMARY KEY, amount numeric(12, 2), name text, changed_at timestamptz)"


def pipeline(
    bootstrap: str,
    prefix: str,
    lake: Path,
    tables_at_once: int,
    interval: float = 5.0,
    driver_reads_up_to: int = 0,
):
    """One pipeline for the schema's tables (Debezium's topics under `prefix`), a Delta table per topic, as a
    Debezium source is set up; the stream settings as docs/how-to/capture-postgresql.md gives them for a
    short delay, or the defaults."""
    return parse_pipeline(
        {
            "name": prefix,
            "topics": [rf"^{prefix}\.{SCHEMA}\.t\d+$"],
            "kafka": {"bootstrap_servers": bootstrap},
            "table": {"path": str(lake / "{table}")},
            "format": {"type": "connect_json", "envelope": "debezium"},
            "write": {"mode": "upsert", "key": ["id"], "order_by": "_debezium_position"},
            "batch": {
                "max_records_per_batch": 10_000_000,
                "max_records_per_task": 250_000,
                "tables_at_once": tables_at_once,
                "driver_reads_up_to": driver_reads_up_to,
            },
            "stream_interval_seconds": interval,
        },
        "cdc.yaml",
    )


def ingest_all(spark, cfg) -> int:
    """One run over the pipeline's tables (offsetlake.runs, as the CLI's ingest): the change events applied."""
    results = ingest_tables(spark, tables_of(cfg), Run.here(), lambda line: None, print)
    return sum(r.records for r in results)


def backlog(server: postgres.Postgres, events: int) -> int:
    """Per table: `events` inserts, updates of every second row, deletes of every tenth. Returns the events."""
    statements = []
    for t in TABLES:
        statements += [
            f"INSERT INTO {SCHEMA}.{t} SELECT g, g * 0.01, 'row ' || g, clock_timestamp() "
            f"FROM generate_series(1, {events}) g",
            f"UPDATE {SCHEMA}.{t} SET amount = amount + 1, changed_at = clock_timestamp() WHERE id % 2 = 0",
            f"DELETE FROM {SCHEMA}.{t} WHERE id % 10 = 0",
        ]
    server.execute(*statements)
    return len(TABLES) * (events + events // 2 + events // 10)


def steady_workload(server: postgres.Postgres, rate: float, seconds: float, first_id: int, stop: threading.Event):
    """`rate` one-statement transactions a second on random tables: inserts, updates and deletes."""
    rng = random.Random(7)
    conn = server.connect()
    conn.autocommit = True
    next_id = first_id
    started = time.monotonic()
    sent = 0
    try:
        with conn.cursor() as cur:
            while not stop.is_set() and time.monotonic() - started < seconds:
                t = rng.choice(TABLES)
                kind = rng.choices(["insert", "update", "delete"], [5, 4, 1])[0]
                if kind == "insert":
                    next_id += 1
                    cur.execute(
                        f"INSERT INTO {SCHEMA}.{t} VALUES (%s, %s, 'steady', clock_timestamp())",
                        (next_id, rng.randrange(10**6) / 100),
                    )
                elif kind == "update":
                    cur.execute(
                        f"UPDATE {SCHEMA}.{t} SET amount = %s, changed_at = clock_timestamp() WHERE id = %s",
                        (rng.randrange(10**6) / 100, rng.randrange(1, next_id)),
                    )
                else:
                    cur.execute(f"DELETE FROM {SCHEMA}.{t} WHERE id = %s", (rng.randrange(1, next_id),))
                sent += 1
                time.sleep(max(0.0, started + sent / rate - time.monotonic()))
    finally:
        conn.close()


class Rounds:
    """A stream's tables, asked at the start of each of its rounds: counts the rounds begun."""

    def __init__(self, tables: Callable[[], list]):
        self._tables = tables
        self.begun = 0

    def tables(self) -> list:
        self.begun += 1
        return self._tables()


def stop_after_capture(
    server: postgres.Postgres, prefix: str, writer: threading.Thread, rounds: Rounds, stop: threading.Event
):
    """Stop the stream once the workload is over, Debezium has captured all of it (its slot confirmed), and
    a whole round has begun and ended since: every change is then in its table, applied as the stream
    applies them (a last ingest after the stream would hold the last changes back by its own start)."""
    writer.join()
    server.wait_confirmed(connect.slot_name(prefix), timeout=300)
    after = rounds.begun + 1
    while rounds.begun <= after:
        time.sleep(0.05)
    stop.set()


def check_tables(server: postgres.Postgres, cfgs: dict) -> None:
    """Each Delta table holds its source's rows: the same count and sum of amounts."""
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            for t, cfg in cfgs.items():
                cur.execute(f"SELECT count(*), coalesce(sum(amount), 0) FROM {SCHEMA}.{t}")
                want = cur.fetchone()
                got = query(cfg.table_location, "SELECT count(*) AS n, sum(amount) AS s FROM t").to_pylist()[0]
                if (got["n"], got["s"] or 0) != (want[0], want[1]):
                    raise SystemExit(f"{t}: the Delta table holds {got}, the source {want}")
    finally:
        conn.close()


def delays(cfgs: dict, since_ms: int) -> dict[str, list[float]]:
    """Seconds from each insert's and update's statement to the Delta commit holding it, after `since_ms`
    ("whole"), split at its Kafka record's timestamp ("capture", "offsetlake")."""
    out: dict[str, list[float]] = {"whole": [], "capture": [], "offsetlake": []}
    for cfg in cfgs.values():
        feed = pa.table(DeltaTable(cfg.table_path).load_cdf(starting_version=0))
        feed = feed.cast(
            pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in feed.schema])
        )
        changed = feed.filter(
            pc.and_(
                pc.is_in(feed.column("_change_type"), pa.array(["insert", "update_postimage"])),
                pc.greater(feed.column("changed_at"), pa.scalar(since_ms * 1000, pa.timestamp("us", tz="UTC"))),
            )
        )
        committed, kafka, stated = (
            _micros(changed.column(name)) for name in ("_commit_timestamp", "kafka_timestamp", "changed_at")
        )
        out["whole"] += ((committed - stated) / 1e6).tolist()
        out["capture"] += ((kafka - stated) / 1e6).tolist()
        out["offsetlake"] += ((committed - kafka) / 1e6).tolist()
    return out


def drop_topics_and_groups(bootstrap: str, prefix: str) -> None:
    """On a cluster of yours: delete the topics Debezium made under the run's `prefix` (its tables' and its
    heartbeat's) and the consumer groups its tables' offsets were mirrored to, and nothing else."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{prefix}.") or t.endswith(f".{prefix}")]
    deleting = list(admin.delete_topics(topics, operation_timeout=30).values()) if topics else []
    listed = admin.list_consumer_groups(request_timeout=30).result().valid
    groups = [g.group_id for g in listed if g.group_id.startswith(f"offsetlake.{prefix}")]
    deleting += admin.delete_consumer_groups(groups, request_timeout=30).values() if groups else []
    for done in deleting:
        try:
            done.result()
        except Exception as err:  # noqa: BLE001 - report and go on: the rest still gets deleted
            print(f"bench_cdc: could not delete {err}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _micros(column: pa.ChunkedArray):
    """Microseconds since the epoch, whatever the column's timestamp unit."""
    return column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000, help="inserts per table in the backlog")
    parser.add_argument("--rate", type=float, default=100, help="transactions a second in the delay phase")
    parser.add_argument("--seconds", type=float, default=60, help="length of the delay phase")
    parser.add_argument("--tables-at-once", type=int, default=4, help="batch.tables_at_once of the backlog's ingest")
    parser.add_argument(
        "--stream-tables-at-once", type=int, default=2, help="batch.tables_at_once of the delay phase's stream"
    )
    parser.add_argument(
        "--interval", type=float, default=0.1, help="stream_interval_seconds: the stream's pause between rounds"
    )
    parser.add_argument(
        "--driver-reads-up-to",
        type=int,
        default=1000,
        help="batch.driver_reads_up_to: a batch of at most this many offsets is read by the driver (0: never)",
    )
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="a plaintext Kafka cluster instead of the embedded broker (the run's topics and groups deleted after)",
    )
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="offsetlake-bench-cdc-"))
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    broker = None if args.bootstrap else embedded_broker.start(work / "broker")
    bootstrap = args.bootstrap or broker.bootstrap_servers
    prefix = f"{PREFIX}_{uuid.uuid4().hex[:8]}" if args.bootstrap else PREFIX
    server = postgres.start("shop", "bench", settings=postgres.LOGICAL_DECODING)
    worker = None
    spark = build_session("offsetlake-bench-cdc", "local[2]")
    try:
        log(f"cdc: Apache Kafka at {bootstrap} ({'yours' if args.bootstrap else 'embedded'}), topics {prefix}.*")
        server.execute(f"CREATE SCHEMA {SCHEMA}", *(TABLE_SQL.format(t=t) for t in TABLES))
        server.execute(f"CREATE TABLE {SCHEMA}.heartbeat (id integer PRIMARY KEY, at timestamptz)")
        config = connect.debezium_postgres(
            "127.0.0.1",
            server.port,
            server.user,
            server.database,
            prefix,
            [SCHEMA],
            heartbeat_table=f"{SCHEMA}.heartbeat",
        )
        connect.create_publication(server, config)
        worker = connect.start(work / "connect", bootstrap, {prefix: config}, schemas_enable=True)
        lake = work / "lake"
        cfg = pipeline(bootstrap, prefix, lake, args.tables_at_once)
        server.execute(*(f"INSERT INTO {SCHEMA}.{t} VALUES (0, 0, 'warm-up', clock_timestamp())" for t in TABLES))
        server.wait_confirmed(connect.slot_name(prefix), timeout=300)
        ingest_all(spark, cfg)  # warm-up: Spark's first run, and each table created
        cfgs = {t.name: t.cfg for t in tables_of(cfg)}
        assert sorted(cfgs) == sorted(TABLES), f"the pipeline's tables are {sorted(cfgs)}"

        log(f"cdc: {len(TABLES)} tables, {args.events:,} inserts each, then updates of half and deletes of a tenth")
        started = time.perf_counter()
        events = backlog(server, args.events)
        server.wait_confirmed(connect.slot_name(prefix), timeout=1800)
        captured = time.perf_counter() - started
        log(f"  Debezium captured {events:,} events in {captured:.0f} s ({events / captured:,.0f} events/s)")
        started = time.perf_counter()
        applied = ingest_all(spark, cfg)
        seconds = time.perf_counter() - started
        check_tables(server, cfgs)
        log(
            f"cdc applied: {applied:,} change events into {len(TABLES)} Delta tables in {seconds:.1f} s: "
            f"{applied / seconds:,.0f} events/s (tables equal to their source)"
        )

        since_ms = int(time.time() * 1000)
        stop = threading.Event()
        writer = threading.Thread(
            target=steady_workload, args=(server, args.rate, args.seconds, args.events + 1, stop), daemon=True
        )
        writer.start()
        streamed = pipeline(bootstrap, prefix, lake, args.stream_tables_at_once, args.interval, args.driver_reads_up_to)
        topics = KafkaCluster(streamed.kafka)  # as `offsetlake stream`: one client lists the topics each round
        rounds = Rounds(lambda: tables_of(streamed, topic_names=topics.topic_names))
        threading.Thread(target=stop_after_capture, args=(server, prefix, writer, rounds, stop), daemon=True).start()
        try:
            batches = stream(spark, streamed, stop, tables=rounds.tables)
        finally:
            topics.close()
        check_tables(server, cfgs)
        found = delays(cfgs, since_ms)
        p99 = percentile(found["whole"], 0.99)
        log(
            f"cdc delay, source statement -> Delta commit, {args.rate:.0f} transactions/s for {args.seconds:.0f} s, "
            f"a stream, {args.stream_tables_at_once} tables at once, {args.interval:g} s between rounds, "
            f"{f'batches of up to {args.driver_reads_up_to:,} offsets' if args.driver_reads_up_to else 'no batch'} "
            "read by the driver "
            f"({batches} batches): median {statistics.median(found['whole']):.2f} s, p99 {p99:.2f} s "
            f"over {len(found['whole']):,} changes"
        )
        for part, what in (("capture", "Debezium's capture"), ("offsetlake", "offsetlake's part")):
            log(
                f"  of which {what} (to/from the Kafka record's timestamp): median "
                f"{statistics.median(found[part]):.2f} s, p99 {percentile(found[part], 0.99):.2f} s"
            )
        print_targets(
            [
                (
                    f"cdc applied {applied / seconds:,.0f} change events/s into {len(TABLES)} tables",
                    f">= {APPLIED_TARGET:,}",
                    applied / seconds >= APPLIED_TARGET,
                ),
                (
                    f"cdc delay p99 {p99:.1f} s at {args.rate:.0f} transactions/s",
                    f"< {DELAY_P99_TARGET:.0f} s",
                    p99 < DELAY_P99_TARGET,
                ),
            ]
        )
    finally:
        spark.stop()
        if worker is not None:
            worker.stop()
        server.stop()
        if broker is not None:
            embedded_broker.stop(broker.pid)
        else:
            drop_topics_and_groups(bootstrap, prefix)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
