"""Spark's Python daemon (`spark.python.daemon.module`), started without Spark's own archives on sys.path.

Spark puts `pyspark.zip`, `py4j-*-src.zip` and the spark-core jar first on every Python worker's path,
and before each task the worker calls `importlib.invalidate_caches()`, which makes every zip importer
read its archive's whole directory again (1,328 entries in pyspark.zip, thousands of classes in the
jar): about 0.15 s per task, measured with py-spy, the largest cost of a warm batch after reading Kafka.
Where pyspark is installed in this Python (pip, as offsetlake requires), the archives hold the same
code, so the daemon and the workers it forks import pyspark from the installation and no zip importer
is left to re-read. Where it is not, nothing changes.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _is_spark_archive(entry: str) -> bool:
    """pyspark.zip, py4j-*-src.zip, and the spark-core jar Spark adds too (SparkContext.jarOfObject)."""
    name = os.path.basename(entry)
    return (name.endswith(".zip") and name.startswith(("pyspark.zip", "py4j-"))) or name.endswith(".jar")


def drop_spark_archives() -> None:
    """Leave Spark's archives off sys.path when pyspark and py4j import without them."""
    kept = [entry for entry in sys.path if not _is_spark_archive(entry)]
    if len(kept) == len(sys.path):
        return
    everything = sys.path[:]
    sys.path[:] = kept
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("py4j") is None:
        sys.path[:] = everything
        return
    dropped = tuple(set(everything) - set(kept))
    for entry in [e for e in sys.path_importer_cache if e.startswith(dropped)]:  # made while finding this module
        del sys.path_importer_cache[entry]


def quiet_on_closed_socket(worker):
    """pyspark.daemon's `worker`, returning 1 (this worker exits, as it would for any failure) instead
    of raising when its JVM has closed the socket: a stopping session closes its idle workers' sockets,
    and over a Unix socket (spark.py) a worker that still had bytes to flush then printed a BrokenPipe
    traceback, in about one session stop of eight. Nobody is left to read what it had to say."""

    def run(sock, authenticated):
        try:
            return worker(sock, authenticated)
        except BrokenPipeError:
            return 1

    return run


if __name__ == "__main__":
    drop_spark_archives()
    from pyspark import daemon

    daemon.worker = quiet_on_closed_socket(daemon.worker)
    daemon.manager()
