"""Getting started as the page shows it (docs/getting-started.md): the example pipeline file and script it
includes (docs/examples/getting-started/) on a topic of the test's broker: `offsetlake ingest`, `status`
and `history`, then the script reading the table. The table is checked against Kafka by the oracle, the
script's figures against what the test produced."""

from __future__ import annotations

import json
import re
import runpy
import shutil
from pathlib import Path

from oracle import assert_exactly_once
from support import JournaledProducer, create_topic, load

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "getting-started"
CUSTOMERS = ("ana", "bo", "chen")
ORDERS = 300
# Each customer's sum of amounts, from what the test produces (order i: customer i % 3, amount i + 0.50).
AMOUNTS = tuple(int(sum(i + 0.5 for i in range(ORDERS) if i % 3 == k)) for k in range(len(CUSTOMERS)))


def test_a_topic_of_ones_own_becomes_a_table_that_the_example_reads(
    offsetlake, spark, bootstrap, tmp_path, monkeypatch, capsys
):
    create_topic(bootstrap, "orders", 3)
    producer = JournaledProducer(bootstrap)
    for i in range(ORDERS):
        order = {
            "order_id": f"o{i}",
            "customer": CUSTOMERS[i % 3],
            "amount": f"{i}.50",
            "placed": "2026-11-27T10:00:00Z",
        }
        producer.produce("orders", json.dumps(order).encode(), key=order["order_id"].encode())
    producer.flush()
    pipelines = tmp_path / "include" / "pipelines"
    pipelines.mkdir(parents=True)
    shutil.copy(EXAMPLES / "orders.yaml", pipelines / "orders.yaml")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", bootstrap)
    monkeypatch.setenv("OFFSETLAKE_LAKE", str(tmp_path / "lake"))
    monkeypatch.chdir(tmp_path)  # the commands find include/pipelines/ where they run,
    monkeypatch.delenv("OFFSETLAKE_HOME", raising=False)  # as a newcomer's shell has it (the Airflow tests
    monkeypatch.delenv("OFFSETLAKE_PIPELINES_DIR", raising=False)  # of this session set both)

    code, out, err = offsetlake("ingest", "--pipeline", "orders")
    assert code == 0, err
    assert "committed" in out and "300 rows" in out, out

    code, out, err = offsetlake("status", "--pipeline", "orders")
    assert code == 0, err
    assert "total lag: 0" in out, out

    code, out, err = offsetlake("history", "--pipeline", "orders")
    assert code == 0, err
    assert "ingest" in out and "orders[0]" in out, out

    assert_exactly_once(load(pipelines, "orders"))
    runpy.run_path(str(EXAMPLES / "read_orders.py"), run_name="__main__")
    shown = capsys.readouterr().out
    assert "300 orders; table version 1" in shown, shown
    for customer in CUSTOMERS:  # polars' table: one line per customer, 100 orders each
        assert re.search(rf"│ {customer}\s+┆ 100\s+┆", shown), shown

    # Integrations: the same table from Spark (delta-spark), DuckDB, Polars and pandas.
    integrations = Path(EXAMPLES).parent / "integrations"
    runpy.run_path(str(integrations / "spark.py"), init_globals={"spark": spark}, run_name="__main__")
    shown = capsys.readouterr().out
    assert all(re.search(rf"\|\s+{c}\|\s+100\|", shown) for c in CUSTOMERS), shown
    assert re.search(r"\|\s+1\|\s+WRITE\|\{\"pipeline\":\"orde", shown), shown  # the ledger's userMetadata
    runpy.run_path(str(integrations / "duckdb_query.py"), run_name="__main__")
    shown = capsys.readouterr().out
    assert all(re.search(rf"│ {c}\s+│\s+100 │\s+{a}\.00 │", shown) for c, a in zip(CUSTOMERS, AMOUNTS)), shown
    runpy.run_path(str(integrations / "polars_read.py"), run_name="__main__")
    shown = capsys.readouterr().out
    assert "order_id" in shown and "shape: (5, 5)" in shown, shown
    runpy.run_path(str(integrations / "pandas_read.py"), run_name="__main__")
    shown = capsys.readouterr().out
    assert all(re.search(rf"{c}\s+{a}\.00", shown) for c, a in zip(CUSTOMERS, AMOUNTS)), shown
