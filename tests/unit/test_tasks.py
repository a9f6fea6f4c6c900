"""offsetlake.read.tasks outside Spark: the collector is paused for the task (also when the driver reads a
small batch itself) and nothing is frozen, so a driver or a test that runs a task in its own process keeps
collecting everything it holds; pandas is left out of a task's conversions and back afterwards."""

from __future__ import annotations

import gc
import subprocess
import sys
from types import SimpleNamespace

import pyarrow as pa
import pytest

from offsetlake.read import tasks
from offsetlake.read.reader import message_schema
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
    """A range's reader as read_ranges sees it: its batches (message_schema, without headers), then closed."""

    def __init__(self, index: int, sizes: list[int], events: list) -> None:
        self.index, self.sizes, self.events = index, sizes, events
        events.append(("open", index))

    def __iter__(self):
        first = 0
        for size in self.sizes:
            offsets = pa.array(range(first, first + size), pa.int64())
            first += size
            yield pa.record_batch(
                [pa.nulls(size, f.type) if f.name != "kafka_offset" else offsets for f in message_schema(False)],
                schema=message_schema(False),
            )

    def close(self) -> None:
        self.events.append(("close", self.index))


def test_ranges_are_read_converted_and_written_a_chunk_at_a_time_with_the_collector_paused(monkeypatch):
    # read_ranges is what a Spark task and the driver (read_job.read_in_driver) run: only the wiring here,
    # the reading and writing themselves are tests/integration/test_ingest.py's
    events: list = []
    batches = {0: [4, 4, 4, 3], 1: [], 2: [2, 9]}  # records of each reader's batches: range 1 holds none
    monkeypatch.setattr(tasks, "CHUNK_RECORDS", 8)
    monkeypatch.setattr(tasks, "reads_headers", lambda cfg: False)
    monkeypatch.setattr(tasks, "open_range", lambda ctx, index: _Reader(index, batches[index], events))

    def write_range(ctx, index, chunks):
        for chunk in chunks:
            offsets = chunk.column("kafka_offset").to_pylist()
            events.append(("chunk", index, (offsets[0], offsets[-1]) if offsets else None, gc.isenabled()))
        return [{"task": index}]

    monkeypatch.setattr(tasks, "write_range", write_range)
    out = read_ranges(SimpleNamespace(cfg=None, fault_settings={"faults": {}}), [0, 1, 2])  # type: ignore[arg-type]

    assert out == [{"task": 0}, {"task": 1}, {"task": 2}]
    assert events == [
        ("open", 0),
        ("chunk", 0, (0, 7), False),
        ("close", 0),
        ("open", 1),  # the next range fetches while this one's last chunk is converted and written
        ("chunk", 0, (8, 14), False),
        ("close", 1),
        ("open", 2),
        ("chunk", 1, None, False),  # a range with no record still gives its (empty) chunk
        ("close", 2),
        ("chunk", 2, (0, 10), False),  # the last chunk comes after the range is read, even when full
    ]
    assert gc.isenabled()


def test_a_reader_not_reached_is_closed_when_a_range_fails(monkeypatch):
    events: list = []
    monkeypatch.setattr(tasks, "reads_headers", lambda cfg: False)
    monkeypatch.setattr(tasks, "open_range", lambda ctx, index: _Reader(index, [3], events))

    def write_range(ctx, index, chunks):
        for _ in chunks:
            raise RuntimeError("the write failed")
        return []

    monkeypatch.setattr(tasks, "write_range", write_range)
    with pytest.raises(RuntimeError, match="the write failed"):
        read_ranges(SimpleNamespace(cfg=None, fault_settings={"faults": {}}), [0, 1])  # type: ignore[arg-type]
    assert sorted(events) == [("close", 0), ("close", 1), ("open", 0), ("open", 1)]


def test_a_task_converts_without_importing_pandas_and_pandas_works_after_it():
    done = subprocess.run([sys.executable, "-c", PANDAS_LEFT_OUT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["during: False 2 [False, False]", "after: DataFrame True DataFrame"]
