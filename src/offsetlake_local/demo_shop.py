"""The demo's change data capture: a shop database in PostgreSQL changing live, captured by Debezium's
PostgreSQL connector in a Kafka Connect worker into topics `demo.shop.<table>`, which the upsert pipeline
`demo_shop` streams into a Delta table per topic (`table.path` with `{table}`). Everything lives under the demo's
directory and is started and stopped by PID; started again, it continues (same database, same connector
offsets, same tables).
"""

from __future__ import annotations

import sys
from pathlib import Path

from offsetlake.errors import OffsetlakeError
from offsetlake_local import connect, postgres, processes
from offsetlake_local.shop import Shop

PORT = 15432
DATABASE = "shop"
USER = "offsetlake"
SCHEMA = "shop"
TOPIC_PREFIX = "demo"  # topics demo.shop.customers and demo.shop.orders
PIPELINE = "demo_shop"  # a table per topic
TABLES = ("customers", "orders", "parcels")  # the shop's tables (the pipeline's; the heartbeat table is left out)
SHOP_MARKER = "offsetlake_local.shop"


def up(base: Path, bootstrap_servers: str) -> Shop:
    """PostgreSQL with the shop (made on the first run), the Connect worker capturing it, and the process
    changing it every two seconds."""
    first_run = not (base / "postgres" / "data").exists()
    server = postgres.start(
        DATABASE,
        USER,
        settings=postgres.LOGICAL_DECODING,
        port=PORT,
        pid_file=base / "postgres.pid",
        root=base / "postgres",
    )
    shop = Shop(server, SCHEMA, seed=1)
    if first_run:
        shop.create(customers=50, orders=100)
    else:
        shop.resume()
    print(f"PostgreSQL on 127.0.0.1:{PORT}: database {DATABASE}, schema {SCHEMA} ({', '.join(TABLES)})")
    config = connect.debezium_postgres(
        "127.0.0.1", PORT, USER, DATABASE, TOPIC_PREFIX, [SCHEMA], heartbeat_table=f"{SCHEMA}.heartbeat"
    )
    connect.create_publication(server, config)  # a table created in the schema later is captured too
    worker = connect.start(base / "connect", bootstrap_servers, {"demo-shop": config}, schemas_enable=True)
    print(f"Kafka Connect worker (pid {worker.pid}) running Debezium's PostgreSQL connector: topics demo.shop.*")
    changer = processes.start_background(
        [sys.executable, "-m", SHOP_MARKER, "--port", str(PORT), "--user", USER, "--database", DATABASE]
        + ["--schema", SCHEMA, "--every", "2"],
        base / "shop.log",
        base / "shop.pid",
    )
    print(f"the shop changes live (pid {changer}): inserts, updates, deletes, key changes every 2 s")
    return shop


def down(base: Path) -> list[str]:
    """Stop the shop's changes, the Connect worker and PostgreSQL (in that order: the connector holds a
    replication connection). Returns what was running."""
    stopped = []
    if processes.stop_from_pid_file(base / "shop.pid", SHOP_MARKER):
        stopped.append("the shop's changes")
    if connect.stop_from_pid_file(base / "connect" / "connect.pid"):
        stopped.append("the Kafka Connect worker")
    if postgres.stop_from_pid_file(base / "postgres.pid"):
        stopped.append("PostgreSQL")
    return stopped


def describe(shop: Shop, table: str, cfg) -> str:
    """The source table's row count beside the Delta table's."""
    from offsetlake.table import query

    try:
        rows = query(cfg.table_location, "SELECT count(*) AS n FROM t").column("n")[0].as_py()
    except OffsetlakeError:
        rows = 0
    return f"{len(shop.rows(table))} rows in PostgreSQL, {rows} in {cfg.table_path}"
