"""LazySession under a real spark-submit: the session starts while the driver plans, and a session that
cannot start fails the code that asks for it, in its own thread. (From a terminal nothing starts early:
tests/integration/test_cli.py checks that an up-to-date ingest starts no JVM.)"""
from __future__ import annotations

from pathlib import Path

from support import spark_submit

STARTS_EARLY = """
import time
from pyspark import SparkContext
from offsetlake.spark import LazySession
spark = LazySession("starts-early")
spark.start_early()
deadline = time.monotonic() + 120
while SparkContext._active_spark_context is None and time.monotonic() < deadline:
    time.sleep(0.1)  # get() is never called while waiting: only the background start can make a context
print("context before get:", SparkContext._active_spark_context is not None)
session = spark.get()
print("same context:", session.sparkContext is SparkContext._active_spark_context)
print("job:", session.sparkContext.parallelize(range(4), 2).sum())
spark.stop()
"""

FAILS_EARLY = """
from offsetlake.spark import LazySession
spark = LazySession("fails-early", master="no-such-master://1")
spark.start_early()
try:
    spark.get()
except Exception as err:
    print("get raised:", type(err).__name__, "naming the master:", "no-such-master://1" in str(err))
spark.stop()
print("stopped")
"""


def submit_driver(tmp_path: Path, script: str):
    path = tmp_path / "driver.py"
    path.write_text(script)
    return spark_submit(path)


def test_under_spark_submit_the_session_starts_before_it_is_asked_for(tmp_path):
    done = submit_driver(tmp_path, STARTS_EARLY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["context before get: True", "same context: True", "job: 6"]


def test_a_session_that_cannot_start_raises_in_get_and_stops_cleanly(tmp_path):
    done = submit_driver(tmp_path, FAILS_EARLY)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines == ["get raised: Py4JJavaError naming the master: True", "stopped"], lines
