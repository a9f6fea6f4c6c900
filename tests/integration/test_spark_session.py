"""LazySession under a real spark-submit: the session starts while the driver plans, and a session that
cannot start fails the code that asks for it, in its own thread. (From a terminal nothing starts early:
tests/integration/test_cli.py checks that an up-to-date ingest starts no JVM.)"""

from __future__ import annotations

import re
import time
from pathlib import Path

from support import spark_submit

STARTS_EARLY = """
import time
from pyspark import SparkContext
from offsetlake.spark.session import LazySession
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
from offsetlake.spark.session import LazySession
spark = LazySession("fails-early", master="no-such-master://1")
spark.start_early()
try:
    spark.get()
except Exception as err:
    print("get raised:", type(err).__name__, "naming the master:", "no-such-master://1" in str(err))
spark.stop()
print("stopped")
"""


REPORTS_START_UP = """
import time
print("driver code:", time.time())
from offsetlake.spark.session import LazySession, startup_report
spark = LazySession("reports-start-up")
spark.start_early()
session = spark.get()
submitted = time.time()
session.sparkContext.parallelize(range(4), 2).sum()
print(startup_report(spark.ready_at, (submitted, time.time())))
spark.stop()
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


def test_under_spark_submit_the_start_up_is_counted_from_spark_submits_jvm(tmp_path):
    launched = time.time()
    done = submit_driver(tmp_path, REPORTS_START_UP)
    assert done.returncode == 0, done.stderr[-3000:]
    first, report = done.stdout.splitlines()
    found = re.fullmatch(
        r"start-up, seconds after spark-submit's JVM started: Python driver ([0-9.]+), Spark session "
        r"ready ([0-9.]+), first Spark job ([0-9.]+) to ([0-9.]+)",
        report,
    )
    assert found, report
    driver, session, job, job_end = map(float, found.groups())
    assert 0 < driver < session <= job < job_end, report
    # spark-submit's process started when this test launched it: its start, as the driver's code saw
    # it (its own clock minus the report's driver mark), falls between the launch and the driver code
    jvm_started = float(first.split()[-1]) - driver
    assert launched - 0.1 < jvm_started < launched + 2.0, (launched, jvm_started, report)
