"""Airflow DAGs for every pipeline in include/pipelines/ (ingest, stream, backfill, recovery, maintenance).

Thin on purpose: the DAG definitions live in src/offsetlake/airflow/dags.py.
"""

import os
from pathlib import Path

os.environ.setdefault("OFFSETLAKE_HOME", str(Path(__file__).resolve().parents[1]))

# Airflow's DAG processor imports the airflow modules a DAG file names once, before it parses the file again
# and again: named here, the operator's base (and the OpenLineage provider it loads) is not imported anew at
# every parse (~1 s of CPU each time).
import airflow.providers.apache.spark.operators.spark_submit  # noqa: E402, F401

from offsetlake.airflow.dags import build_dags  # noqa: E402  (needs OFFSETLAKE_HOME first)

globals().update(build_dags())
