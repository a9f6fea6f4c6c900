"""The read tasks of a batch as one Spark job, run from the driver: what they read and wrote, and the
schema their rows bring to the table. Ingest, backfill and repair run their tasks through here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from offsetlake.errors import OffsetlakeError, from_wire, one_line
from offsetlake.formats.evolution import Incompatible, adds_columns, merge_schema, plain_schema
from offsetlake.protocol.planning import assign_slots
from offsetlake.protocol.quarantine import WrittenFile
from offsetlake.read.tasks import TaskContext, TaskResults, parse_results, read_ranges, task_function
from offsetlake.spark.session import is_local, session_of

if TYPE_CHECKING:
    from deltalake import DeltaTable


def table_columns(table: DeltaTable) -> pa.Schema:
    """The table's schema now, as the tasks build rows in (registry formats may add to it)."""
    return plain_schema(pa.schema(table.schema()))


@dataclass(frozen=True)
class TaskFiles:
    """What the Spark tasks of one attempt read and wrote."""

    read: int
    data: list[WrittenFile]
    quarantine: list[WrittenFile]
    schemas: list[pa.Schema] = field(default_factory=list)  # of the rows each task wrote


def evolved_schema(table: DeltaTable, written: TaskFiles) -> pa.Schema | None:
    """The table's schema with the columns the rows add, when they add any (decided per snapshot)."""
    current = merged = table_columns(table)
    for schema in written.schemas:
        try:
            merged = merge_schema(merged, schema)
        except Incompatible as err:  # two writer schemas in one batch disagree on a new column's type
            raise OffsetlakeError(f"the batch's records add a column two ways: {err}") from err
    return merged if adds_columns(current, merged) else None


def run_tasks(spark: Any, ctx: TaskContext) -> TaskResults:
    """Run the tasks, one range each, in a Spark task per slot (or, for a batch of at most
    `batch.driver_reads_up_to` offsets, in this thread); what each read and wrote, by task index.
    The job runs in the attempt's job group (`job_group`), so that a failure waits for its own tasks only
    while other tables' jobs run in the same session."""
    if not ctx.tasks:
        return TaskResults({}, [], [], [])
    if sum(t.size for t in ctx.tasks) <= ctx.cfg.batch.driver_reads_up_to:
        return read_in_driver(ctx)
    context = session_of(spark).sparkContext
    slots = assign_slots([t.size for t in ctx.tasks], task_slots(context))
    submitted = time.time()
    context.setJobGroup(job_group(ctx.attempt), f"offsetlake {ctx.cfg.name}: batch {ctx.batch}")
    job = context.parallelize(range(len(slots)), len(slots)).mapPartitionsWithIndex(task_function(ctx, slots))
    try:
        rows = job.collect()
    except Exception as err:  # Spark wraps executor errors: surface ours as one line
        wait_for_running_tasks(spark, job_group(ctx.attempt))
        raise _executor_error(err) from err
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # this thread's later jobs are not the batch's
        context.setLocalProperty("spark.job.description", None)
    results = parse_results(rows)
    results.job = (submitted, time.time())
    return results


def read_in_driver(ctx: TaskContext) -> TaskResults:
    """The tasks run one after another in the calling thread (`batch.driver_reads_up_to`): the files they
    write and what they report are a Spark job's; an error is worded as a failed job's would be."""
    try:
        rows = read_ranges(ctx, list(range(len(ctx.tasks))))
    except OffsetlakeError:
        raise
    except Exception as err:  # noqa: BLE001 - a task's unexpected error, one line as from an executor
        raise OffsetlakeError(f"reading the batch in the driver failed: {one_line(err)}") from err
    return parse_results(rows)


def job_group(attempt: str) -> str:
    """The Spark job group of an attempt's read tasks (shown in Spark's UI beside the batch's number)."""
    return f"offsetlake-{attempt}"


def task_slots(context: Any) -> int | None:
    """How many tasks run at once: a local master's cores (local[N]). On a cluster None, so each range
    has a Spark task of its own: the cores there are only known once executors have registered, and
    Spark then balances the tasks across them as they finish."""
    return context.defaultParallelism if is_local(context.master) else None


def wait_for_running_tasks(spark: Any, group: str, timeout: float = 30.0) -> None:
    """A failed job returns while its other tasks are still being killed, and a Python worker may still be
    writing a data file then: the attempt's clean-up, which runs next, waits until no task of the job
    group `group` runs and Spark's grace for stopping a worker (spark.python.task.killTimeout) has passed."""
    session = session_of(spark)
    try:
        tracker = session.sparkContext.statusTracker()
        grace = session.sparkContext._jsc.sc().conf().getTimeAsSeconds("spark.python.task.killTimeout", "2s")
    except Exception:  # noqa: BLE001 - not a classic session (Spark Connect): nothing to wait on here
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _running_tasks(tracker, group):
        time.sleep(0.2)
    time.sleep(grace)


def _running_tasks(tracker: Any, group: str) -> int:
    """Tasks of `group`'s jobs that have not ended (a killed task counts until it has stopped)."""
    running = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else []:
            stage = tracker.getStageInfo(stage_id)
            running += stage.numActiveTasks if stage is not None else 0
    return running


def _executor_error(err: Exception) -> OffsetlakeError:
    """The error a task raised, of its own kind (a code travels in Spark's text: errors.to_wire), or Spark's
    first line."""
    text = str(err)
    ours = from_wire(text)
    if ours is not None:
        return ours
    first = next((line for line in text.splitlines() if line.strip()), type(err).__name__)
    return OffsetlakeError(f"Spark job failed: {first.strip()[:500]}")
