"""Example: a DAG that runs whenever a pipeline's Delta table changes, one per pipeline named in
OFFSETLAKE_EXAMPLE_CONSUMERS (comma-separated; `make demo` names demo_events). None otherwise.

Copy it for your own downstream work: schedule on `table_asset("<pipeline>")`, and read what changed
from the triggering Asset events, whose `extra["payload"]` is {pipeline, table, kind, versions, ranges,
rows, quarantined}.
"""

import os
from pathlib import Path

os.environ.setdefault("OFFSETLAKE_HOME", str(Path(__file__).resolve().parents[1]))

# Airflow's DAG processor imports the airflow modules a DAG file names once, before it parses the file again
# and again: named here, the operator's base (and the OpenLineage provider it loads) is not imported anew at
# every parse (~1 s of CPU each time).
import airflow.providers.apache.spark.operators.spark_submit  # noqa: E402, F401
from airflow.sdk import DAG, task  # noqa: E402

from offsetlake.airflow.dags import START, table_asset  # noqa: E402
from offsetlake.config import list_pipelines  # noqa: E402

for _name in [n.strip() for n in os.environ.get("OFFSETLAKE_EXAMPLE_CONSUMERS", "").split(",") if n.strip()]:
    if _name not in list_pipelines():
        continue
    with DAG(
        dag_id=f"example__{_name}__on_change",
        schedule=[table_asset(_name)],
        start_date=START,
        catchup=False,
        tags=["offsetlake", _name, "example"],
        description=f"Runs on every change of {_name}'s table and reports what changed",
    ) as _dag:

        @task
        def report_changes(*, triggering_asset_events) -> list[dict]:
            changes = [
                event.extra.get("payload", event.extra)
                for events in triggering_asset_events.values()
                for event in events
            ]
            for change in changes:
                print(
                    f"{change.get('pipeline')}: {change.get('kind')} versions {change.get('versions')} "
                    f"ranges {change.get('ranges')}"
                )
            return changes

        report_changes()
    globals()[_dag.dag_id] = _dag
