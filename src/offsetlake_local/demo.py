"""`make demo` / `make down`: the embedded stack with data flowing, started and stopped by PID.

up:   broker on 127.0.0.1:19092, demo events (with aborted transactions and a few
      malformed records), a producer that keeps writing, Airflow (api-server on
      127.0.0.1:8080, scheduler, dag-processor, triggerer), the demo pipeline
      (mode: stream) streaming from its stream DAG, whose first commit is awaited
      and reported as the table's history records it. Beside it, the Avro
      pipeline: a Schema Registry on 127.0.0.1:18081, events in Avro (schema 1,
      then schema 2 with a field more) and one triggered run of its ingest DAG. And the upsert
      pipeline: events keyed by user (some deleting their user) and one triggered run of its
      ingest DAG, whose table holds each user's latest event. And change data capture
      (local/demo_shop.py): a shop database in PostgreSQL on 127.0.0.1:15432 changing live, Debezium's
      connector in a Kafka Connect worker, and two upsert pipelines streaming its tables. A Hive
      Metastore on that PostgreSQL, where the events and users tables are registered as demo.events and
      demo.users.
down: everything above, stopped by its pid file.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from offsetlake.config import load_pipeline, project_home
from offsetlake.config.topic_tables import for_topic
from offsetlake.errors import OffsetlakeError, TableError
from offsetlake_local import broker, demo_shop, metastore, processes, schema_registry, stack

PIPELINE = "demo_events"
AVRO_PIPELINE = "demo_avro"
UPSERT_PIPELINE = "demo_users"
REGISTRY_PORT = 18081
UI_PORT = int(os.environ.get("OFFSETLAKE_DEMO_UI_PORT", "8080"))
BROKER_PORT = 19092
CATALOG_NAMES = {"demo.events": PIPELINE, "demo.users": UPSERT_PIPELINE}  # registered in the demo's metastore


def _dir() -> Path:
    return project_home() / ".offsetlake"


def airflow_home() -> Path:
    """The demo Airflow's home (its logs, its database, its login's password)."""
    return _dir() / "airflow"


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "offsetlake.cli", *args], check=True)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((stack.HOST, port)) != 0


def up() -> None:
    base = _dir()
    if (base / "airflow" / "api-server.pid").exists():
        raise OffsetlakeError("the demo is already running (make down stops it)")
    if not _port_free(UI_PORT):
        raise OffsetlakeError(f"port {UI_PORT} on 127.0.0.1 is taken; set OFFSETLAKE_DEMO_UI_PORT to another port")
    _cli(
        "broker",
        "start",
        "--data-dir",
        str(base / "broker"),
        "--pid-file",
        str(base / "broker.pid"),
        "--port",
        str(BROKER_PORT),
    )
    _cli("produce", "--pipeline", PIPELINE, "--count", "20000", "--abort-share", "0.2", "--bad-share", "0.002")
    producer = processes.start_background(
        [sys.executable, "-m", "offsetlake.cli", "produce", "--pipeline", PIPELINE, "--count", "300", "--every", "5"]
        + ["--abort-share", "0.2", "--bad-share", "0.002"],
        base / "producer.log",
        base / "producer.pid",
    )
    print(f"demo producer running (pid {producer}): 300 events every 5 s, some in aborted transactions")
    registry = schema_registry.start(base / "registry", port=REGISTRY_PORT, pid_file=base / "registry.pid")
    print(f"schema registry on {registry.url}; producing Avro events, schema 1 then schema 2 (adds 'country')")
    _cli("produce", "--pipeline", AVRO_PIPELINE, "--count", "5000", "--abort-share", "0.2", "--bad-share", "0.002")
    _cli("produce", "--pipeline", AVRO_PIPELINE, "--count", "2000", "--schema-version", "2")
    print("producing events keyed by user (500 users, one in twenty a tombstone deleting its user)")
    _cli("produce", "--pipeline", UPSERT_PIPELINE, "--count", "5000", "--keys", "500", "--tombstone-share", "0.05")
    if not _port_free(demo_shop.PORT):
        raise OffsetlakeError(f"port {demo_shop.PORT} on 127.0.0.1 (the demo's PostgreSQL) is taken")
    shop = demo_shop.up(base, f"127.0.0.1:{BROKER_PORT}")
    catalog = metastore.start(base / "metastore", shop.server, pid_file=base / "metastore.pid")
    print(f"Hive Metastore on {catalog.uri} (its catalog in the shop's PostgreSQL, database metastore)")

    home = airflow_home()
    # The example consumer DAG (dags/offsetlake_examples.py) runs on every change of demo_events' table.
    env = stack.environment(home, UI_PORT, project_home(), extra={"OFFSETLAKE_EXAMPLE_CONSUMERS": PIPELINE})
    print("starting Airflow: api-server, scheduler, dag-processor, triggerer ...", flush=True)
    stack.start(env)
    api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
    cfg = load_pipeline(PIPELINE)
    dags = {kind: f"offsetlake__{PIPELINE}__{kind}" for kind in ("ingest", "stream", "backfill", "recovery")}
    for dag_id in dags.values():
        api.wait_for_dag(dag_id)
    api.unpause(dags["backfill"])
    api.unpause(dags["ingest"])  # in mode stream it has no schedule: it runs only when someone triggers it
    consumer = f"example__{PIPELINE}__on_change"
    api.wait_for_dag(consumer)
    api.unpause(consumer)  # Airflow watches the table (its Asset) while a DAG scheduled on it is unpaused
    started_ms = int(time.time() * 1000)
    api.unpause(dags["stream"])  # mode: stream, so it keeps one run going from now on
    print(
        f"unpaused {dags['stream']} (the pipeline's mode is {cfg.mode}); waiting for its first commit ...", flush=True
    )
    avro_ingest = f"offsetlake__{AVRO_PIPELINE}__ingest"
    api.wait_for_dag(avro_ingest)
    api.unpause(avro_ingest)  # mode: batch, hourly; and one run now
    api.trigger(avro_ingest)
    upsert_ingest = f"offsetlake__{UPSERT_PIPELINE}__ingest"
    api.wait_for_dag(upsert_ingest)
    api.unpause(upsert_ingest)  # mode: batch, hourly; and one run now
    api.trigger(upsert_ingest)
    shop_stream = f"offsetlake__{demo_shop.PIPELINE}__stream"
    api.wait_for_dag(shop_stream)
    api.unpause(shop_stream)  # mode: stream: the tables follow the shop's changes from now on
    committed = _wait_for_commits(cfg, dags["stream"], started_ms, timeout=300)
    api.unpause(dags["recovery"])  # its daily audit needs the table the stream made
    avro_cfg = load_pipeline(AVRO_PIPELINE)
    avro_committed = _wait_for_commits(avro_cfg, avro_ingest, started_ms, timeout=300)
    upsert_cfg = load_pipeline(UPSERT_PIPELINE)
    upsert_committed = _wait_for_commits(upsert_cfg, upsert_ingest, started_ms, timeout=300)
    shop_cfg = load_pipeline(demo_shop.PIPELINE)
    shop_tables = {table: for_topic(shop_cfg, f"demo.shop.{table}") for table in demo_shop.TABLES}
    shop_committed = {
        table: _wait_for_commits(cfg, shop_stream, started_ms, timeout=300) for table, cfg in shop_tables.items()
    }
    width = max(len(table) for table in shop_tables) + 1
    shop_lines = "\n".join(
        f"              {table + ':':<{width}} {demo_shop.describe(shop, table, table_cfg)}"
        for table, table_cfg in shop_tables.items()
    )
    if committed and upsert_committed:  # the tables exist: give them names in the catalog
        metastore.register(catalog, CATALOG_NAMES)
    events = _wait_for_asset_event(api, f"offsetlake.{PIPELINE}", timeout=120)
    _cli("status", "--pipeline", PIPELINE)
    _cli("history", "--pipeline", PIPELINE, "--limit", "5")
    base_url = env["AIRFLOW__API__BASE_URL"]
    print(f"""
stream DAG:   {_describe(committed)}
Asset events: {_describe_events(events)}; each starts {consumer}
Avro:         {avro_ingest}: {_describe(avro_committed)}; columns {_columns(avro_cfg)}
              (schema registry {registry.url}; table {avro_cfg.table_path})
Upsert:       {upsert_ingest}: {_describe(upsert_committed)}; {_current_state(upsert_cfg)}
Capture:      PostgreSQL 127.0.0.1:{demo_shop.PORT} (psql -h 127.0.0.1 -p {demo_shop.PORT} -U {demo_shop.USER} {demo_shop.DATABASE})
              -> Debezium in Kafka Connect ({base}/connect/connect.out) -> {shop_stream} (a table per topic)
{shop_lines}
Catalog:      Hive Metastore {catalog.uri}: {", ".join(CATALOG_NAMES)} by name in Spark
              (pyspark --properties-file {metastore.properties_file(catalog)} --jars <delta-spark's>, docs/how-to/catalog.md)
Airflow UI:   {base_url}   login: {stack.USER} / {stack.password(home)}
offsetlake:   {base_url}/plugin/offsetlake (lag, commits, audit; also a tab on each DAG)
metrics:      {base_url}/offsetlake/metrics (Prometheus)
DAGs:         {dags["stream"]} (mode: stream, one run always going), __ingest (triggered catch-up), __backfill (trigger form), __recovery (daily audit), __maintenance (daily optimize, vacuum, checkpoint; paused)
Delta table:  {cfg.table_path}
quarantine:   {cfg.quarantine_path}
broker:       Apache Kafka on 127.0.0.1:{BROKER_PORT} (topic {", ".join(cfg.topics)}; its log: {base}/broker/broker.log)
logs:         {home}/*.log, {base}/producer.log
stop it all:  make down""")
    if not committed:
        raise OffsetlakeError(f"the stream DAG committed nothing within 300 s; see {home}/scheduler.log")
    if not avro_committed:
        raise OffsetlakeError(f"the Avro ingest DAG committed nothing within 300 s; see {home}/scheduler.log")
    if not upsert_committed:
        raise OffsetlakeError(f"the upsert ingest DAG committed nothing within 300 s; see {home}/scheduler.log")
    for table, commits in shop_committed.items():
        if not commits:
            raise OffsetlakeError(
                f"{shop_stream} committed nothing to table {table} within 300 s; see {home}/scheduler.log"
            )
    if not events:
        raise OffsetlakeError(
            f"no Asset event for {PIPELINE} within 120 s of its first commit; see {home}/triggerer.log"
        )


def _current_state(cfg) -> str:
    """What an upsert table holds now, and what its change feed recorded."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from offsetlake.table import query

    users = query(cfg.table_location, "SELECT count(*) AS n FROM t").column("n")[0].as_py()
    feed = pa.table(DeltaTable(cfg.table_path).load_cdf(starting_version=0, columns=["kafka_key", "_change_type"]))
    kinds = Counter(feed.column("_change_type").to_pylist())
    return (
        f"{users} users now (one row each; change feed: {kinds['insert']} inserts, "
        f"{kinds['update_postimage']} updates, {kinds['delete']} deletes; table {cfg.table_path})"
    )


def _columns(cfg) -> str:
    from offsetlake.table import open_table

    return ", ".join(f.name for f in open_table(cfg.table_location).schema().fields)


def _wait_for_commits(cfg, dag_id: str, since_ms: int, timeout: float) -> list:
    """The commits `dag_id` made since `since_ms`, once there is at least one (or [] after `timeout`)."""
    from offsetlake.protocol.ledger import pipeline_history
    from offsetlake.table import open_table

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            mine = [
                h
                for h in pipeline_history(
                    cfg.table_location, open_table(cfg.table_location), cfg.name, since_ms=since_ms
                )
                if h.meta.run.dag_id == dag_id
            ]
        except TableError:  # no table yet
            mine = []
        if mine:
            return mine
        time.sleep(2)
    return []


def _wait_for_asset_event(api: stack.Api, asset: str, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = api.asset_events(asset, limit=5)
        if events:
            return events
        time.sleep(3)
    return []


def _describe_events(events: list[dict]) -> str:
    if not events:
        return "none yet"
    payload = events[0]["extra"].get("payload", {})
    return (
        f"{len(events)} so far, the newest: {payload.get('kind')} of versions {payload.get('versions')}, "
        f"{payload.get('rows')} rows, ranges {payload.get('ranges')}"
    )


def _describe(commits: list) -> str:
    """What the stream's run committed, as the table's history says."""
    if not commits:
        return "no commit yet"
    rows = sum(h.meta.records.rows for h in commits)
    quarantined = sum(h.meta.records.quarantined for h in commits)
    return (
        f"run {commits[-1].meta.run.run_id} committed {len(commits)} batch(es) so far: {rows} rows, "
        f"{quarantined} quarantined, table version {commits[-1].version}"
    )


def down() -> None:
    base = _dir()
    stopped = stack.stop(base / "airflow")
    print(f"stopped Airflow components: {', '.join(stopped) or 'none running'}")
    if processes.stop_from_pid_file(base / "producer.pid", "offsetlake.cli"):
        print("stopped the demo producer")
    if processes.stop_from_pid_file(base / "registry.pid", "offsetlake_local.schema_registry"):
        print("stopped the schema registry")
    if metastore.stop_from_pid_file(base / "metastore.pid"):
        print("stopped the Hive Metastore")
    for what in demo_shop.down(base):
        print(f"stopped {what}")
    print("broker stopped" if broker.stop_from_pid_file(base / "broker.pid") else "broker was not running")


def main(argv: list[str] | None = None) -> int:
    action = (argv or sys.argv[1:] or ["up"])[0]
    run = {"up": up, "down": down}.get(action)
    if run is None:
        print(f"offsetlake demo: unknown action {action!r} (up or down)", file=sys.stderr)
        return 2
    try:
        run()
    except (OffsetlakeError, subprocess.CalledProcessError) as err:
        print(f"offsetlake demo: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
