"""A DAG of your own that runs offsetlake steps: catch up the `orders` pipeline, then compact its table."""

import datetime as dt

from airflow.sdk import DAG

from offsetlake.airflow.operator import OffsetlakeOperator

with DAG("orders_hourly", schedule="@hourly", start_date=dt.datetime(2026, 1, 1), catchup=False):
    ingest = OffsetlakeOperator(task_id="ingest", pipeline="orders", command="ingest")
    compact = OffsetlakeOperator(
        task_id="compact",
        pipeline="orders",
        command="maintain",
        arguments=["--optimize", "--target-file-mb", "{{ params.target_file_mb }}"],
        params={"target_file_mb": 128},
        conn_id="spark_default",  # the Spark master and deploy mode (its extra)
    )
    ingest >> compact
