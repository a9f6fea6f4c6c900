"""The DAG files "In Airflow" includes (docs/examples/airflow/) parse as Airflow parses a DAG file, with the
Getting started pipeline (`orders`) in the pipelines folder, and hold what the page says they hold."""

from __future__ import annotations

import shutil
from pathlib import Path

from offsetlake.airflow.operator import OffsetlakeOperator

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def dags_in(path: Path, monkeypatch, tmp_path) -> dict:
    """The DAGs of one example file, parsed by Airflow's DagBag (no import error allowed)."""
    from airflow.dag_processing.dagbag import DagBag

    pipelines = tmp_path / "pipelines"
    pipelines.mkdir(exist_ok=True)
    shutil.copy(EXAMPLES / "getting-started" / "orders.yaml", pipelines / "orders.yaml")
    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(pipelines))
    bag = DagBag(dag_folder=str(path))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags


def test_a_dag_of_ones_own_runs_offsetlake_steps(monkeypatch, tmp_path):
    dags = dags_in(EXAMPLES / "airflow" / "orders_hourly.py", monkeypatch, tmp_path)
    dag = dags["orders_hourly"]
    ingest, compact = dag.get_task("ingest"), dag.get_task("compact")
    assert isinstance(ingest, OffsetlakeOperator) and isinstance(compact, OffsetlakeOperator)
    assert (ingest.pipeline, ingest.command, compact.command) == ("orders", "ingest", "maintain")
    assert compact.upstream_task_ids == {"ingest"}
    assert "arguments" in compact.template_fields and "{{ params.target_file_mb }}" in compact.arguments


def test_a_dag_scheduled_on_the_tables_asset(monkeypatch, tmp_path):
    dags = dags_in(EXAMPLES / "airflow" / "sales_report.py", monkeypatch, tmp_path)
    dag = dags["sales_report"]
    (asset,) = dag.timetable.asset_condition.objects
    assert asset.name == "offsetlake.orders" and asset.uri.endswith("/orders")
    assert asset.watchers, "the Asset carries its watcher (table_asset, not a plain Asset)"
