"""offsetlake.read.tasks outside Spark: the collector is paused for the task (also when the driver reads a
small batch itself) and nothing is frozen, so a driver or a test that runs a task in its own process keeps
collecting everything it holds; pandas is left out of a task's conversions and back afterwards."""

from __future__ import annotations

import gc
import subprocess
import sys

from offsetlake.read import tasks
from offsetlake.read.tasks import collector_paused, in_spark_worker, read_ranges

# In a fresh interpreter, as a Spark worker is: what pyarrow imports on its first conversions.
PANDAS_LEFT_OUT = """
import sys
import pyarrow as pa
import pyarrow.compute as pc
import importlib.util
from offsetlake.read.tasks import pandas_left_out
with pandas_left_out():
    import polars  # it asks importlib whether pandas is installed and keeps the answer
    assert importlib.util.find_spec("pandas") is not None and polars._dependencies._PANDAS_AVAILABLE
    # what a task converts: typed and untyped arrays, scalars, a compute function given a Python number
    batch = pa.record_batch([pa.array([b"x", None], pa.binary()), pa.array([b"y", b"z"]),
                             pa.repeat(pa.scalar("t", pa.string()), 2)], names=["k", "v", "t"])
    too_big = pc.greater(pc.binary_length(batch.column("v")), 1)
    print("during:", "pandas" in sys.modules, batch.num_rows, too_big.to_pylist())
print("after:", type(pa.table({"a": [1, 2]}).to_pandas()).__name__, "pandas" in sys.modules,
      type(polars.DataFrame({"a": [1]}).to_pandas()).__name__)
"""


def test_outside_spark_the_collector_is_paused_for_the_task_and_nothing_is_frozen():
    frozen = gc.get_freeze_count()
    assert not in_spark_worker()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Reader:
    def close(self):
        pass


def test_ranges_read_in_this_thread_are_read_and_written_with_the_collector_paused(monkeypatch):
    # read_ranges is what the driver runs for a small batch (read_job.read_in_driver): only the wiring here,
    # the reading itself is tests/integration/test_ingest.py's
    collecting = []
    monkeypatch.setattr(tasks, "open_range", lambda ctx, index: _Reader())
    monkeypatch.setattr(tasks, "read_all", lambda ctx, reader: collecting.append(("read", gc.isenabled())))
    monkeypatch.setattr(
        tasks, "convert_and_write", lambda ctx, index, messages: [{"task": index, "collecting": gc.isenabled()}]
    )
    out = read_ranges(None, [0, 1])  # type: ignore[arg-type]
    assert out == [{"task": 0, "collecting": False}, {"task": 1, "collecting": False}]
    assert collecting == [("read", False), ("read", False)]
    assert gc.isenabled()


def test_a_task_converts_without_importing_pandas_and_pandas_works_after_it():
    done = subprocess.run([sys.executable, "-c", PANDAS_LEFT_OUT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["during: False 2 [False, False]", "after: DataFrame True DataFrame"]
