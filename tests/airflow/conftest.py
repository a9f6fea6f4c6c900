"""Airflow for tests: a private AIRFLOW_HOME whose metadata DB is PostgreSQL, as in production: one server
per session, migrated once, stopped by its PID when the session ends.

Airflow reads its configuration when first imported, so the server starts and the environment is set
here, at collection, before any test module imports airflow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hosts import start_postgres

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="offsetlake-airflow-"))
METADATA_DB = start_postgres()

AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": METADATA_DB.url,
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    "OFFSETLAKE_HOME": str(REPO),
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # spark-submit
    "SPARK_LOCAL_IP": "127.0.0.1",
}
os.environ.update(AIRFLOW_ENV)


@pytest.fixture(scope="session")
def airflow_db():
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return AIRFLOW_HOME


@pytest.fixture(autouse=True)
def no_task_context_left_behind():
    """`dag.test()` runs tasks in this process and leaves Airflow's task context (AIRFLOW_CTX_DAG_ID...) in
    os.environ, where a later test's job would record itself as run by Airflow: each test's is removed."""
    before = {n: v for n, v in os.environ.items() if n.startswith("AIRFLOW_CTX_")}
    yield
    for name in [n for n in os.environ if n.startswith("AIRFLOW_CTX_")]:
        del os.environ[name]
    os.environ.update(before)


def pytest_sessionfinish(session, exitstatus):
    METADATA_DB.stop()
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)  # made at import by each pytest process (xdist's too)
