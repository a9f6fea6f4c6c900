"""A DAG that runs whenever the `orders` table changes, whoever changed it, and reads what changed."""

from airflow.sdk import DAG, task

from offsetlake.airflow.dags import table_asset

with DAG("sales_report", schedule=[table_asset("orders")]):

    @task
    def report(*, triggering_asset_events):
        for events in triggering_asset_events.values():
            for event in events:
                print(event.extra["payload"])  # kind, versions, ranges, rows

    report()
