"""Airflow DAGs for every pipeline in include/pipelines/ (ingest, stream, backfill, recovery, maintenance).

Thin on purpose: the DAG definitions live in src/offsetlake/airflow/dags.py.
"""

import os
from pathlib import Path

os.environ.setdefault("OFFSETLAKE_HOME", str(Path(__file__).resolve().parents[1]))

from offsetlake.airflow.dags import build_dags  # noqa: E402  (needs OFFSETLAKE_HOME first)

globals().update(build_dags())
