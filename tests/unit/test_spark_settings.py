"""offsetlake.spark.session's pure parts: the driver JVM's options, and the process start times the start-up
report counts with (the report itself runs under a real spark-submit in
tests/integration/test_spark_session.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from offsetlake.spark.session import DRIVER_JIT, process_started, spark_conf, startup_report


def test_the_driver_compiles_with_c1_and_the_users_driver_options_come_last(tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -XX:TieredStopAtLevel=4\n")
    monkeypatch.setenv("OFFSETLAKE_HOME", str(tmp_path))
    options = spark_conf("local[2]")["spark.driver.extraJavaOptions"].split()
    ours = DRIVER_JIT.split()
    assert "-XX:TieredStopAtLevel=1" in ours and "-XX:ReservedCodeCacheSize=240m" in ours
    users = options.index("-XX:TieredStopAtLevel=4")
    assert all(options.index(flag) < users for flag in ours)  # the JVM keeps the last


def test_a_process_start_is_read_to_the_clock_tick():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        after = time.time()
        started = process_started(child.pid)
        assert started is not None and before - 0.05 <= started <= after + 0.05, (before, started, after)
    finally:
        child.kill()
        child.wait()
    assert process_started(child.pid) is None  # gone: nothing to read


def test_no_start_up_report_outside_spark_submit(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert startup_report(time.time(), (time.time(), time.time())) is None
