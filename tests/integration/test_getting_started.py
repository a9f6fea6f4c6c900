"""Getting started as the page shows it (docs/getting-started.md), every command of its "Your own topic"
in order: the embedded broker started by `offsetlake broker start`, the page's script writing a topic, the
example pipeline file, the transcript (each command must print what the page shows, to the character), the
table checked against Kafka by the oracle, and the reading scripts, whose figures are those of the orders
the script wrote (computed here from the same rule), then the broker stopped."""

from __future__ import annotations

import re
import runpy
import shlex
import shutil
from pathlib import Path

from offsetlake_local.broker import free_port
from oracle import assert_exactly_once
from support import load

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "getting-started"
CUSTOMERS = ("ana", "bo", "chen")
ORDERS = 300
# Each customer's sum of amounts, from what the test produces (order i: customer i % 3, amount i + 0.50).
AMOUNTS = tuple(int(sum(i + 0.5 for i in range(ORDERS) if i % 3 == k)) for k in range(len(CUSTOMERS)))


def test_a_topic_of_ones_own_becomes_a_table_that_the_example_reads(offsetlake, spark, tmp_path, monkeypatch, capsys):
    pipelines = tmp_path / "include" / "pipelines"
    pipelines.mkdir(parents=True)
    shutil.copy(EXAMPLES / "orders.yaml", pipelines / "orders.yaml")
    monkeypatch.setenv("OFFSETLAKE_LAKE", str(tmp_path / "lake"))
    monkeypatch.chdir(tmp_path)  # the commands find include/pipelines/ where they run,
    monkeypatch.delenv("OFFSETLAKE_HOME", raising=False)  # as a newcomer's shell has it (the Airflow tests
    monkeypatch.delenv("OFFSETLAKE_PIPELINES_DIR", raising=False)  # of this session set both)

    # The page's first commands: a broker of one's own (on a free port: the page's 19092 may be a running
    # demo's; its data and pid file where the page's go, under the working directory), then the records.
    port = free_port()
    code, out, err = offsetlake("broker", "start", "--port", str(port))
    assert code == 0 and f"bootstrap servers 127.0.0.1:{port}" in out, err
    try:
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{port}")
        runpy.run_path(str(EXAMPLES / "write_orders.py"), run_name="__main__")
        assert capsys.readouterr().out == f"{ORDERS} orders in topic orders\n"

        # The page's transcript (session.console), command by command: the same output, to the character.
        for command, shown in _transcript(EXAMPLES / "session.console"):
            assert command[0] == "offsetlake", command
            code, out, err = offsetlake(*command[1:])
            assert code == 0, err
            assert out.rstrip("\n") == shown, f"$ {shlex.join(command)}\n{out}"
        _reads_as_the_page_shows(load(pipelines, "orders"), spark, capsys)
    finally:
        assert offsetlake("broker", "stop")[1] == "broker stopped\n"


def _reads_as_the_page_shows(cfg, spark, capsys) -> None:
    assert_exactly_once(cfg)
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
