"""Spark session for offsetlake jobs.

Under spark-submit the master and resources come from spark-submit; run from the
CLI or tests it is `local[*]` (or OFFSETLAKE_SPARK_MASTER). Everything binds to
127.0.0.1 and the UI is off unless asked for, because this runs on shared hosts.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULTS_FILE = "include/spark-defaults.conf"
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    "spark.log.level": "WARN",
}


def build_session(app_name: str, master: str | None = None, extra_conf: dict | None = None):
    # Python workers must run this interpreter: it is the one with offsetlake and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit already set master and conf
    if not under_submit or master:
        builder = builder.master(master or os.environ.get("OFFSETLAKE_SPARK_MASTER", "local[*]"))
        for key, value in {**LOCAL_DEFAULTS, **read_defaults()}.items():
            builder = builder.config(key, value)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


class LazySession:
    """A Spark session started on first use: a run with nothing to read never starts a JVM.

    `offsetlake ingest` on an up-to-date pipeline then answers in about a second
    instead of the JVM's start-up time, and a job killed while planning costs as little.
    """

    def __init__(self, app_name: str, master: str | None = None):
        self.app_name, self.master = app_name, master
        self._session = None

    def get(self):
        if self._session is None:
            self._session = build_session(self.app_name, self.master)
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


def session_of(spark):
    """The SparkSession behind `spark`, which may be a LazySession."""
    return spark.get() if isinstance(spark, LazySession) else spark


def read_defaults() -> dict[str, str]:
    """include/spark-defaults.conf, in spark-defaults format (key whitespace value)."""
    home = Path(os.environ.get("OFFSETLAKE_HOME", os.getcwd()))
    path = home / DEFAULTS_FILE
    if not path.is_file():
        return {}
    conf = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    return conf
