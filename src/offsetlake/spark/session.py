"""Spark session and settings for offsetlake jobs.

Under spark-submit the master and resources come from spark-submit (and, from
Airflow, from the `spark_default` connection); run from the CLI or tests the
master is `local[*]` (or OFFSETLAKE_SPARK_MASTER). The driver binds to loopback
only when the master is local: on a cluster executors must reach the driver, so
its address is Spark's own choice (SPARK_LOCAL_IP, else the host name's address).
The UI is off unless asked for.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from offsetlake.spark import jvm_archive, prewarm

DEFAULTS_FILE = "include/spark-defaults.conf"
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    # delta-spark (the delta-spark engine) rebuilds a snapshot's state -- the file list an upsert's MERGE, a
    # RESTORE or an OPTIMIZE reads -- in 50 partitions, and lists a VACUUM's files in up to 10,000 tasks:
    # on a pipeline table each task holds a handful of entries, and their start-up was what a batch waited
    # for (docs/development/measurements.md). The shuffle's figure; a cluster may set its own.
    "spark.databricks.delta.snapshotPartitions": "4",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.python.worker.reuse": "true",
    # Workers that do not re-read pyspark.zip before every task (see offsetlake/spark/daemon.py).
    "spark.python.daemon.module": "offsetlake.spark.daemon",
    # The JVM and its Python workers talk over Unix domain sockets instead of loopback TCP, where each
    # task's worker waited for its (empty) input before the task's function ran: a small write held back
    # by Nagle's algorithm until the delayed ACK (docs/development/measurements.md).
    "spark.python.unix.domain.socket.enabled": "true",
    "spark.log.level": "WARN",
}
# delta-spark in the session, as Spark and Databricks users have it, for a pipeline whose engine is delta-spark.
# Its jars come the way any Spark package does: `--packages`/`spark.jars.packages`, or `spark.jars`.
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
LOOPBACK = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
# The driver JVM compiles with C1 only: C2 spends the first seconds compiling what start-up runs once
# (docs/development/measurements.md). The driver schedules tasks and passes their small
# results; the records never go through it (Python workers read Kafka and write Parquet), so it has
# no hot loop for C2 to pay back, in a batch or in an hour-long stream (`make bench` measures both).
# Executors on a cluster keep their JVM's default.
# C1 only also makes HotSpot size the code cache as a client VM's, a fifth of a server VM's. A long
# session running delta-spark's SQL (MERGE, DELETE, OPTIMIZE) outgrows that: the cache then sits full and
# the JVM can no longer create the native stub of a new method-handle signature, so a query fails at random
# with `InternalError: NoSuchMethodException: no such method: MethodHandle.linkToStatic(...)` (JDK-8295724).
# The code cache is reserved address space; only what is compiled into it is memory.
DRIVER_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def is_local(master: str) -> bool:
    return master.startswith("local")


def spark_conf(master: str) -> dict[str, str]:
    """Settings for a job on `master`: ours, include/spark-defaults.conf, loopback bindings if local, and
    the driver JVM's options: its class archive when this machine has one (offsetlake/spark/jvm_archive.py) and
    C1 only (DRIVER_JIT), before any driver options of spark-defaults.conf (the JVM keeps the last)."""
    conf = {**DEFAULTS, **read_defaults(), **(LOOPBACK if is_local(master) else {})}
    key = "spark.driver.extraJavaOptions"
    conf[key] = f"{jvm_archive.driver_java_options()} {DRIVER_JIT} {conf.get(key, '')}".strip()
    return conf


def delta_spark_conf(conf: dict[str, str]) -> dict[str, str]:
    """Delta's SQL extension and catalog added to `conf`'s (a session's own extensions are kept)."""
    extensions = [e for e in conf.get("spark.sql.extensions", "").split(",") if e]
    return {
        "spark.sql.extensions": ",".join(dict.fromkeys([*extensions, DELTA_EXTENSION])),
        "spark.sql.catalog.spark_catalog": conf.get("spark.sql.catalog.spark_catalog", DELTA_CATALOG),
    }


def build_session(app_name: str, master: str | None = None, extra_conf: dict | None = None):
    """A Spark session for offsetlake's jobs. A local one gets the prewarmed daemon (offsetlake/spark/prewarm.py):
    its SparkContext is started first, and while the SparkSession is built on it (0.5-0.6 s of the driver
    JVM's time) a warm-up job runs Spark's first Python job, so the first batch does not."""
    # Python workers must run this interpreter: it is the one with offsetlake and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    options = {"spark.app.name": app_name}
    if not under_spark_submit() or master:  # spark-submit already set master and conf
        master = master or os.environ.get("OFFSETLAKE_SPARK_MASTER", "local[*]")
        options |= {"spark.master": master, **spark_conf(master)}
    options |= extra_conf or {}
    # Under spark-submit the master is not known before the session: prewarm in case it is local.
    prewarmed = prewarm.start() if master is None or is_local(master) else None
    warming = None
    if prewarmed is not None:
        # SparkConf() reads what spark-submit set; the builder below finds this context and keeps it.
        context = SparkContext.getOrCreate(SparkConf().setAll(list(options.items())))
        if is_local(context.master or ""):
            warming = prewarm.warm_up(context, prewarmed)
        else:
            prewarmed.stop()
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if warming is not None:
        warming.join()  # it usually ended first; a batch's job would have waited for it anyway
    return session


def under_spark_submit() -> bool:
    """True in a driver that spark-submit started: its JVM is already running."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


class LazySession:
    """A Spark session started on first use: a run with nothing to read never starts a JVM.

    `offsetlake ingest` on an up-to-date pipeline then answers in about a second
    instead of the JVM's start-up time, and a job killed while planning costs as little.
    Under spark-submit the JVM runs already, and `start_early` starts the session in the
    background while the driver plans (Kafka, the Delta log), so the two overlap.
    """

    def __init__(self, app_name: str, master: str | None = None, extra_conf: dict[str, str] | None = None):
        self.app_name, self.master, self.extra_conf = app_name, master, extra_conf
        self.ready_at: float | None = None  # epoch seconds the session was up
        self._session = None
        self._starting: threading.Thread | None = None

    def start_early(self) -> None:
        """Under spark-submit, start the session in a background thread now (elsewhere: nothing; the
        first `get` starts it). PySpark leaves SIGINT alone when its context starts off the main thread."""
        if not under_spark_submit() or self._session is not None or self._starting is not None:
            return
        self._starting = threading.Thread(target=self._start, name="offsetlake-spark-start", daemon=True)
        self._starting.start()

    def _start(self) -> None:
        try:
            self._session = build_session(self.app_name, self.master, self.extra_conf)
            self.ready_at = time.time()
        except Exception:  # noqa: BLE001 - get() starts it again in the caller's thread, which sees the error
            pass

    def _join(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None

    def get(self):
        self._join()
        if self._session is None:
            self._session = build_session(self.app_name, self.master, self.extra_conf)
            self.ready_at = time.time()
        return self._session

    def stop(self) -> None:
        self._join()
        if self._session is not None:
            self._session.stop()
            self._session = None


def process_started(pid: int | str = "self") -> float | None:
    """Epoch seconds at which process `pid` started, to the kernel's clock tick (Linux /proc); None
    where that cannot be read."""
    try:
        since_boot = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - uptime + since_boot / os.sysconf("SC_CLK_TCK")


def startup_report(session_ready: float | None, first_job: tuple[float, float] | None) -> str | None:
    """Under spark-submit (client mode: this driver's parent is spark-submit's JVM), where a run's first
    seconds went, counted from that JVM's start: a line for the task log. None elsewhere."""
    jvm = process_started(os.getppid()) if under_spark_submit() else None
    driver = process_started()
    if jvm is None or driver is None or session_ready is None:
        return None
    marks = [f"Python driver {driver - jvm:.2f}", f"Spark session ready {session_ready - jvm:.2f}"]
    if first_job:
        marks.append(f"first Spark job {first_job[0] - jvm:.2f} to {first_job[1] - jvm:.2f}")
    return "start-up, seconds after spark-submit's JVM started: " + ", ".join(marks)


def session_of(spark: Any) -> Any:
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
