"""The Spark side of a batch: one task per offset range, each reads, converts and writes its files.

Tasks run in Spark's Python workers (forked), so nothing here touches delta-rs.
Each returns a small description of what it wrote; the driver commits those.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from offsetlake import faults
from offsetlake.config import STAGING_COLUMNS, PipelineConfig
from offsetlake.errors import OffsetlakeError, to_wire
from offsetlake.formats.evolution import schema_from_text, schema_to_text
from offsetlake.formats.records import convert, reads_headers
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read.reader import RangeReader, message_schema
from offsetlake.storage.parquet import DataFile, DataFiles, attempt_file_name


@dataclass(frozen=True)
class TaskContext:
    cfg: PipelineConfig
    batch: int
    attempt: str
    tasks: tuple[OffsetRange, ...]
    fault_settings: dict
    columns: pa.Schema | None = None  # the table's schema when planned (registry formats may add columns)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a task runs, in a Spark worker or in the driver. A task
    makes millions of short-lived objects (one Kafka message each, then bytes, ints, tuples) and none in
    cycles; the collector would scan them again and again as they are made, and in the driver everything
    else the process holds with them (docs/development/measurements.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        if in_spark_worker():
            freeze_long_lived_objects()


_frozen = False


def freeze_long_lived_objects() -> None:
    """Once per Python worker, after its first task: move what the worker holds by then (the modules the
    task imported, their classes and functions) out of the collector's sight. Spark's reused workers
    collect after every task (pyspark/daemon.py), before taking the next one, and that full collection
    walked all of it between two tasks of one worker (docs/development/measurements.md). Later tasks'
    objects are collected as usual. No collection first: it would cost the first batch, and a task leaves
    no cyclic garbage behind, so what is frozen by mistake is at most the imports' few cycles, once per
    worker."""
    global _frozen
    if not _frozen:
        gc.freeze()
        _frozen = True


@contextlib.contextmanager
def pandas_left_out() -> Iterator[None]:
    """pandas unimportable while a task runs, in a worker that has not imported it.

    pyarrow checks the inputs it converts for pandas objects (`pa.array` and `pa.scalar` without a
    type, a compute function given a Python number), and where pandas is installed (pyspark brings
    it) its first check imports it: 0.37 s in each Python worker, on the first task of every session,
    where nothing a task does uses pandas. py-spy showed it as a third of a worker's first task.
    While `import pandas` raises ImportError, pyarrow takes the inputs for what they are and goes on
    (pandas-shim.pxi). After the task the import works again: a later job in the worker that wants
    pandas (`to_pandas`, pyspark's pandas UDFs) imports it then."""
    if "pandas" in sys.modules:
        yield
        return
    sys.meta_path.insert(0, _NO_PANDAS)
    try:
        yield
    finally:
        sys.meta_path.remove(_NO_PANDAS)


class _PandasNotFound:
    """An import finder under which `import pandas` raises ImportError while it is on sys.meta_path.

    It finds pandas (`importlib.util.find_spec` answers as it would without it: polars asks that when
    it is first imported and keeps the answer) and fails only when the module would be executed, so
    nothing but the import itself sees the difference, and a failed import leaves no trace in
    sys.modules."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "pandas":  # its submodules import it first
            return None
        return importlib.machinery.ModuleSpec(name, _NotLoaded())


class _NotLoaded(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(f"{module.__name__} is left out while an offsetlake task runs", name=module.__name__)


_NO_PANDAS = _PandasNotFound()


def spark_task_context() -> Any:
    """The running Spark task's context; None outside a Spark task (a driver, a test)."""
    from pyspark import TaskContext as SparkTaskContext

    return SparkTaskContext.get()


def in_spark_worker() -> bool:
    return spark_task_context() is not None


def run_tasks_in_order(ctx: TaskContext, indexes: list[int]) -> list[dict]:
    """Run the tasks `indexes` one after another in this Spark task. The next task's range is opened
    (librdkafka starts fetching and parsing it in its own threads) once the current one is read, while its
    last chunk is converted and written: a task's first records take a fifth to a third of it to arrive,
    mostly the broker's time, and that wait now overlaps with work."""
    with pandas_left_out():
        return read_ranges(ctx, indexes)


# A range is converted and written this many records at a time (the reader's batches gathered up to it), so
# what a task holds as Arrow is one chunk, whatever the range's size.
CHUNK_RECORDS = 50_000


def read_ranges(ctx: TaskContext, indexes: list[int]) -> list[dict]:
    """The ranges `indexes` read, converted and written in order, in this thread, the collector paused: a
    Spark task's work (run_tasks_in_order), or a small batch's in the driver (read_job.read_in_driver)."""
    out: list[dict] = []
    following = iter(indexes[1:])
    upcoming: list[RangeReader] = []

    def open_following() -> None:
        index = next(following, None)
        if index is not None:
            upcoming.append(open_range(ctx, index))

    with collector_paused():
        upcoming.append(open_range(ctx, indexes[0]))
        try:
            for index in indexes:
                out += write_range(ctx, index, in_chunks(ctx, upcoming.pop(0), when_read=open_following))
        finally:
            for reader in upcoming:
                reader.close()
    return out


def open_range(ctx: TaskContext, index: int) -> RangeReader:
    cfg = ctx.cfg
    return RangeReader(
        cfg.kafka,
        f"{cfg.consumer_group}.reader",
        ctx.tasks[index],
        cfg.batch.read_timeout_seconds,
        headers=reads_headers(cfg),
    )


def in_chunks(ctx: TaskContext, reader: RangeReader, when_read: Callable[[], None]) -> Iterator[pa.Table]:
    """The range's messages as tables of about CHUNK_RECORDS (at least one, empty for a range with no
    record). A full chunk is given once the range's next batch has come, so the last one is given after
    the range is read and `when_read()` was called. The `after_read` fault is hit when the first chunk is
    read, before anything of the range is written."""
    schema = message_schema(reads_headers(ctx.cfg))
    batches: list[pa.RecordBatch] = []
    gathered, first = 0, True
    try:
        for batch in reader:
            if gathered >= CHUNK_RECORDS:  # full, and the range goes on
                if first:
                    faults.hit("after_read", ctx.fault_settings)
                chunk = pa.Table.from_batches(batches, schema=schema)
                batches, gathered, first = [], 0, False
                yield chunk
                del chunk  # before the next chunk is gathered: one chunk as Arrow at a time
            batches.append(batch)
            gathered += batch.num_rows
    finally:
        reader.close()
    when_read()
    if first:
        faults.hit("after_read", ctx.fault_settings)
    yield pa.Table.from_batches(batches, schema=schema)


def write_range(ctx: TaskContext, index: int, chunks: Iterable[pa.Table]) -> list[dict]:
    """Convert and write one range's chunks: its rows into data files, its bad records into quarantine files,
    each file written as the chunks come. Returns what the task read and wrote, one dict each; kind: read
    (record count) | schema (of the rows; again whenever a chunk's rows have other columns) | data and
    quarantine (a DataFile as JSON, its row count)."""
    cfg = ctx.cfg
    task_attempt = spark_task_attempt()

    def name(part: int) -> str:
        return attempt_file_name(ctx.batch, ctx.attempt, index, task_attempt, part)

    records, schemas = 0, list[pa.Schema]()
    # The pipeline brought the table's credentials with its locations.
    with (
        DataFiles(cfg.table_location, cfg.table.partition_by, name) as data,
        DataFiles(cfg.quarantine_location, [], name) as quarantine,
    ):
        for messages in chunks:
            rows, bad = convert(cfg, messages, ctx.columns)
            records += messages.num_rows
            columns = _table_columns(rows.schema)
            if not schemas or not columns.equals(schemas[-1], check_metadata=True):
                schemas.append(columns)
            data.write(rows)
            quarantine.write(bad)
            del messages, rows, bad  # before the next chunk is read
        written = [("data", f) for f in data.close()] + [("quarantine", f) for f in quarantine.close()]
    out = [{"task": index, "kind": "read", "file": None, "records": records}]
    out += [{"task": index, "kind": "schema", "file": schema_to_text(s), "records": 0} for s in schemas]
    out += [{"task": index, "kind": kind, "file": f.to_json(), "records": f.num_records} for kind, f in written]
    faults.hit("after_task_write", ctx.fault_settings)  # its files are on disk, not yet reported
    return out


def _table_columns(schema: pa.Schema) -> pa.Schema:
    """The columns the rows bring to the table (an upsert's deleted marker and old key are the MERGE's)."""
    return pa.schema([f for f in schema if f.name not in STAGING_COLUMNS], metadata=schema.metadata)


def spark_task_attempt() -> int:
    """Spark's id of the running task attempt, unique within the application (0 outside Spark)."""
    context = spark_task_context()
    return context.taskAttemptId() if context is not None else 0


def task_function(ctx: TaskContext, slots: list[list[int]]) -> Callable[[int, Any], list[dict[str, Any]]]:
    """The function given to mapPartitionsWithIndex over one partition per slot: the partition's index
    is the slot's, and the slot lists the tasks it runs in order (planning.assign_slots). A plain RDD
    job, not a DataFrame one: the first job of a session then skips Spark SQL's code generation and
    Arrow's JVM side, about 2 s of every spark-submit's first batch."""

    def run(slot: int, _rows: Any) -> list[dict[str, Any]]:
        try:
            return run_tasks_in_order(ctx, slots[slot])
        except OffsetlakeError as err:  # Spark carries an error across as text: its kind goes as a code
            raise RuntimeError(to_wire(err)) from err

    return run


@dataclass
class TaskResults:
    read: dict[int, int]  # records read, per task
    data: list[tuple[int, DataFile]]  # (task, file)
    quarantine: list[tuple[int, DataFile]]
    schemas: list[pa.Schema]  # of the rows each task wrote (registry formats: may add columns)
    job: tuple[float, float] | None = None  # epoch seconds the Spark job was submitted and ended


def parse_results(rows: Iterable[dict[str, Any]]) -> TaskResults:
    """What the tasks read and wrote, from their collected results."""
    read, data, quarantine, schemas = {}, [], [], []
    for row in rows:
        if row["kind"] == "read":
            read[row["task"]] = row["records"]
        elif row["kind"] == "schema":
            schemas.append(schema_from_text(row["file"]))
        elif row["kind"] == "data":
            data.append((row["task"], DataFile.from_json(row["file"])))
        else:
            quarantine.append((row["task"], DataFile.from_json(row["file"])))
    return TaskResults(read, data, quarantine, schemas)
