"""A batch, end to end, on the Spark driver: plan -> read and write (Spark tasks) -> commit.

`ingest` catches a pipeline up to the end offsets taken when it starts, in as
many batches as `max_records_per_batch` needs; `stream` repeats that in one
Spark session until told to stop. Crash anywhere before the commit and nothing
is visible; the re-run plans again from the same ledger.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from offsetlake import faults
from offsetlake.config import PipelineConfig
from offsetlake.engine import CommitEngine, Snapshot, catalog, engine_for
from offsetlake.errors import TableError
from offsetlake.kafka import TP, KafkaCluster, Stopped
from offsetlake.protocol.commit import (
    AttemptFiles,
    Change,
    Committed,
    Settled,
    add_actions,
    new_attempt_id,
    verdict,
)
from offsetlake.protocol.ledger import Ledger, txn_actions
from offsetlake.protocol.merge_batch import merge_of_batch
from offsetlake.protocol.metadata import CommitMetadata, Records, Run, flat_offsets, ranges_json
from offsetlake.protocol.planning import BatchPlan, apply_data_loss, cap_ends, split_ranges, start_offsets
from offsetlake.protocol.quarantine import WrittenFile
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import (
    Merge,
)
from offsetlake.read.tasks import TaskContext
from offsetlake.read_job import TaskFiles
from offsetlake.spark.session import session_of

log = logging.getLogger("offsetlake.batch")
MAX_BATCHES_PER_RUN = 100_000


@dataclass
class BatchResult:
    """What one batch did: committed (its version, ranges and row counts), up_to_date (nothing new), or
    already_committed / superseded (another run committed these ranges first: nothing written)."""

    status: str  # committed | up_to_date | already_committed | superseded
    batch: int | None = None
    version: int | None = None
    ranges: list[OffsetRange] = field(default_factory=list)
    records: int = 0
    quarantined: int = 0
    message: str = ""
    files: set[str] = field(default_factory=set)  # data files the commit added
    spark_job: tuple[float, float] | None = None  # epoch seconds its Spark job was submitted and ended
    merged: dict[str, int] | None = None  # upsert mode: the MERGE's rows inserted, updated, deleted
    table: str | None = None  # a pipeline with a table per topic: whose batch this was (the table's name)
    caught_up: bool = False  # committed up to the end offsets its run set out for: the run is done

    def summary(self) -> str:
        return f"{self.table}: {self._summary()}" if self.table else self._summary()

    def _summary(self) -> str:
        if self.status == "up_to_date":
            return "up to date: nothing new to ingest"
        if self.status != "committed":
            return f"batch {self.batch}: {self.status} ({self.message}); nothing written"
        span = sum(r.size for r in self.ranges)
        rows = f"{self.records} rows"
        if self.merged is not None:
            rows += " merged ({inserted} inserted, {updated} updated, {deleted} deleted)".format(**self.merged)
        return (
            f"batch {self.batch}: committed table version {self.version}: {rows}, "
            f"{self.quarantined} quarantined, {span} offsets in {len(self.ranges)} ranges"
        )


def print_progress(result: BatchResult) -> None:
    """Stream progress for a terminal or a task log: every batch that did something."""
    if result.status != "up_to_date":
        print(result.summary(), flush=True)


def plan_batch(
    cfg: PipelineConfig, cluster: KafkaCluster, ledger: Ledger, tps: list[TP], targets: dict[TP, int]
) -> BatchPlan:
    log_starts = cluster.start_offsets(tps)
    first = ledger.batch is None
    starts = start_offsets(ledger.offsets, first, cfg.starting_offsets, log_starts, targets)
    starts, lost = apply_data_loss(starts, log_starts, cfg.on_data_loss)
    ends = cap_ends(starts, targets, cfg.batch.max_records_per_batch)
    initialises = first and cfg.starting_offsets == "latest"
    return BatchPlan(
        cfg.name,
        ledger.next_batch(),
        starts,
        ends,
        ledger_offsets={tp: ledger.offsets.get(tp) for tp in tps},
        lost=lost,
        rewind=ledger.rewind,
        initialises=initialises,
    )


def run_batch(
    spark: Any, cfg: PipelineConfig, cluster: KafkaCluster, tps: list[TP], targets: dict[TP, int], run: Run
) -> BatchResult:
    fault_settings = faults.settings_from_env()
    began = time.monotonic()
    engine = engine_for(cfg, spark)
    entry = catalog.check(session_of(spark), cfg) if cfg.table.name is not None else None
    table = engine.open()
    if cfg.table.name is not None:
        catalog.register(session_of(spark), cfg, table.version(), entry)
    plan = plan_batch(cfg, cluster, engine.ledger(table, tps), tps, targets)
    faults.hit("after_plan", fault_settings)
    if not plan.needs_commit:
        return BatchResult("up_to_date")

    cluster.prepare_group_offsets(cfg.consumer_group)  # its coordinator looked up while the job runs
    attempt = new_attempt_id()
    tasks = split_ranges(plan.ranges, cfg.batch.max_records_per_task)
    columns = engine.columns(table)
    with engine.attempt(attempt) as files:
        out = engine.write(spark, TaskContext(cfg, plan.batch, attempt, tuple(tasks), fault_settings, columns))
        faults.hit("after_files_written", fault_settings)
        written = TaskFiles(
            sum(out.read.values()),
            [WrittenFile(tasks[i], f) for i, f in out.data],
            [WrittenFile(tasks[i], f) for i, f in out.quarantine],
            out.schemas,
        )
        result = commit_batch(
            cfg,
            plan,
            attempt,
            written,
            run,
            files,
            fault_settings,
            snapshot=table,
            began=began,
            targets=targets,
            engine=engine,
        )
    faults.hit("after_commit", fault_settings)
    result.spark_job = out.job
    if result.status == "committed":
        if cfg.table.name is not None:  # a batch may have added columns or changed properties
            catalog.register(session_of(spark), cfg, result.version or 0)
        cluster.commit_group_offsets(cfg.consumer_group, plan.ends)
        result.caught_up = all(plan.ends[tp] >= end for tp, end in targets.items())
    return result


def commit_batch(
    cfg: PipelineConfig,
    plan: BatchPlan,
    attempt: str,
    written: TaskFiles,
    run: Run,
    files: AttemptFiles,
    fault_settings: dict | None = None,
    snapshot: Snapshot | None = None,
    began: float | None = None,
    targets: dict[TP, int] | None = None,
    engine: CommitEngine | None = None,
) -> BatchResult:
    """Quarantine, then data and offsets, in one commit each, through the table's engine. The files
    written and those that landed are recorded in `files` (the engine's `attempt` removes the others).
    `snapshot`: the table as the plan read it, for the first decision; `began` (time.monotonic())
    and `targets` (Kafka's end offsets the plan reads up to) go into the metadata as the batch's
    duration and the lag it started from."""
    engine = engine or engine_for(cfg)
    files.written[cfg.table_location] |= {w.file.path for w in written.data}
    files.written[cfg.quarantine_location] |= {w.file.path for w in written.quarantine}
    rows = sum(w.file.num_records for w in written.data)
    quarantined = sum(w.file.num_records for w in written.quarantine)
    metadata = batch_metadata(plan, attempt, Records(written.read, rows, quarantined), run, targets, began)
    merge = None
    if cfg.write.upsert:  # before the quarantine commits: a batch whose keys cannot be ordered writes nothing
        merge, metadata = _merge(engine, cfg, plan, written, snapshot, metadata)

    def decide(table: Snapshot) -> Change | Settled:
        refused = verdict(engine.ledger(table, list(plan.starts)), plan)
        if refused is not None:
            return refused
        engine.commit_quarantine(plan, written.quarantine, attempt, run, files)
        faults.hit("before_commit", fault_settings)
        wider = engine.evolved_schema(table, written)
        return Change(
            metadata,
            [] if merge is not None else add_actions([w.file for w in written.data]),
            txn_actions(cfg.name, plan.batch, plan.ends),
            wider or engine.schema,
            cfg.table.partition_by,
            evolve=wider is not None,
            merge=merge,
        )

    outcome = engine.commit(decide, f"batch {plan.batch}", snapshot=snapshot)
    if not isinstance(outcome, Committed):
        return BatchResult(outcome.status, plan.batch, None, plan.ranges, rows, quarantined, outcome.reason)
    files.kept[cfg.table_location] = added = outcome.added_paths()
    return BatchResult(
        "committed", plan.batch, outcome.version, plan.ranges, rows, quarantined, files=added, merged=outcome.merged
    )


def _merge(
    engine: CommitEngine, cfg: PipelineConfig, plan: BatchPlan, written: TaskFiles, snapshot, metadata: CommitMetadata
) -> tuple[Merge, CommitMetadata]:
    """Upsert mode: the batch's staged rows read back and folded to the MERGE the commit applies."""
    staged = engine.staged_rows(snapshot, [w.file for w in written.data])
    old_rows = engine.rows_of_keys(staged.schema)
    unavailable = cfg.format.unavailable_value
    write = cfg.write
    deletes = write.deletes != "ignore"
    merge, moved = merge_of_batch(staged, write.key, write.order_by, unavailable, plan.batch, old_rows, deletes)
    if moved.left_null:
        log.warning(
            "batch %d: %d values that primary-key changes left unchanged are null: no row of the old key held "
            "them (set REPLICA IDENTITY FULL on the source table to send them)",
            plan.batch,
            moved.left_null,
        )
    return merge, msgspec.structs.replace(metadata, carried_over=moved.carried, left_null=moved.left_null)


def batch_metadata(
    plan: BatchPlan,
    attempt: str,
    records: Records,
    run: Run,
    targets: dict[TP, int] | None = None,
    began: float | None = None,
) -> CommitMetadata:
    """The batch's commit metadata; `targets` give the lag it started from, `began` its duration."""
    return CommitMetadata(
        plan.pipeline,
        "ingest",
        batch=plan.batch,
        attempt=attempt,
        ranges=ranges_json(plan.ranges),
        records=records,
        run=run,
        lost=ranges_json(OffsetRange(t, p, lo, hi) for (t, p), (lo, hi) in plan.lost.items()),
        rewind=plan.rewind,
        initialised_at=flat_offsets(plan.ends) if plan.initialises else {},
        lag=None
        if targets is None
        else sum(max(0, targets[tp] - start) for tp, start in plan.starts.items() if tp in targets),
        seconds=None if began is None else round(time.monotonic() - began, 3),
    )


def nothing_to_ingest(cfg: PipelineConfig) -> bool:
    """True when a plan made now would find nothing to commit, decided without Spark and without
    creating the table, so a caller can skip starting a JVM at all. False whenever it cannot tell
    (no table yet): the ingest itself then decides, and words any error."""
    engine = engine_for(cfg)
    try:
        table = engine.existing()
    except TableError:
        return False
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    targets = cluster.end_offsets(tps, cfg.kafka.isolation_level)
    return not plan_batch(cfg, cluster, engine.ledger(table, tps), tps, targets).needs_commit


def ingest(
    spark: Any,
    cfg: PipelineConfig,
    run: Run | None = None,
    stop: threading.Event | None = None,
    cluster: KafkaCluster | None = None,
) -> list[BatchResult]:
    """Catch up to the end offsets taken now. Returns the result of every batch attempted, the last
    "up_to_date" when the run got there.

    `stop` (a stream's SIGTERM) ends the run after the batch in flight, and at once while the driver waits
    for the broker (`Stopped`: planning and Kafka calls hold nothing that a later run would miss).
    `cluster`: the pipeline's cluster, kept by the caller across runs (a stream); by default one of this
    run's own, closed at its end."""
    run = run or Run.here()
    own = cluster is None
    cluster = cluster or KafkaCluster(cfg.kafka, stop=stop)
    results: list[BatchResult] = []
    try:
        tps = cluster.partitions(cfg.topics)
        targets = cluster.end_offsets(tps, cfg.kafka.isolation_level)
        for _ in range(MAX_BATCHES_PER_RUN):
            result = run_batch(spark, cfg, cluster, tps, targets, run)
            results.append(result)
            log.info(result.summary())
            if result.caught_up:  # its commit holds the targets as the ledger's offsets: a plan would be empty
                results.append(BatchResult("up_to_date"))
                log.info(results[-1].summary())
            if results[-1].status == "up_to_date" or (stop is not None and stop.is_set()):
                break
    except Stopped as stopped:
        log.warning("%s", stopped)
    finally:
        if own:
            cluster.close()
    return results
