"""offsetlake.read.tasks outside Spark: the collector is paused for the task and nothing is frozen, so a
driver or a test that runs a task in its own process keeps collecting everything it holds; pandas is
left out of a task's conversions and back afterwards."""

from __future__ import annotations

import gc
import subprocess
import sys

from offsetlake.read.tasks import collector_paused, in_spark_worker

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


def test_a_task_converts_without_importing_pandas_and_pandas_works_after_it():
    done = subprocess.run([sys.executable, "-c", PANDAS_LEFT_OUT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["during: False 2 [False, False]", "after: DataFrame True DataFrame"]
