"""Getting started as the page shows it (docs/getting-started.md): the example pipeline file, transcript and
script it includes (docs/examples/getting-started/) on a topic of the test's broker. Each command of the
transcript runs and must print what the page shows; the table is checked against Kafka by the oracle; the
script must print what the page shows, and its figures are those of what the test produced."""

from __future__ import annotations

import json
import re
import runpy
import shlex
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

    # The page's transcript (session.console), command by command: the same output, to the character.
    for command, shown in _transcript(EXAMPLES / "session.console"):
        if command[0] == "export":  # the page's addresses; the test's own are set above
            assert {a.split("=")[0] for a in command[1:]} == {"KAFKA_BOOTSTRAP_SERVERS", "OFFSETLAKE_LAKE"}
            continue
        assert command[0] == "offsetlake", command
        code, out, err = offsetlake(*command[1:])
        assert code == 0, err
        assert out.rstrip("\n") == shown, f"$ {shlex.join(command)}\n{out}"

    assert_exactly_once(load(pipelines, "orders"))
    runpy.run_path(str(EXAMPLES / "read_orders.py"), run_name="__main__")
    shown = capsys.readouterr().out
    assert shown.rstrip("\n") == (EXAMPLES / "read_orders.out").read_text().rstrip("\n"), shown
    assert all(re.search(rf"│ {c}\s+┆ 100\s+┆ {a}\.00", shown) for c, a in zip(CUSTOMERS, AMOUNTS)), shown

    # Integrations: the same table from Spark (delta-spark), DuckDB, Polars and pandas.
    integrations = Path(EXAMPLES).parent / "integrations"
    # The docs' session (getOrCreate: this test's, which has delta-spark and its SQL extension), then the script.
    session = runpy.run_path(str(integrations / "spark_session.py"), run_name="__main__")["spark"]
    assert session is spark
    runpy.run_path(str(integrations / "spark.py"), init_globals={"spark": session}, run_name="__main__")
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


def _transcript(path: Path) -> list[tuple[list[str], str]]:
    """A console transcript's commands (`$ ` lines), each with the output the page shows under it."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:]), []))
        else:
            steps[-1][1].append(line)
    return [(command, "\n".join(lines)) for command, lines in steps]
