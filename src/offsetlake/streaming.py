"""A stream: the same batches as `ingest`, in a loop in one Spark session, which bounds its own small files.
SIGTERM stops it between batches; it is safe beside scheduled ingest (the ledger serialises them)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from offsetlake.batch import BatchResult, ingest
from offsetlake.config import PipelineConfig
from offsetlake.config.topic_tables import NoTopicMatches
from offsetlake.errors import OffsetlakeError, one_line
from offsetlake.formats.columns import table_schema
from offsetlake.kafka import KafkaCluster
from offsetlake.protocol.metadata import Run
from offsetlake.rounds import each_at_once, one_at_a_time

if TYPE_CHECKING:
    from offsetlake.config.topic_tables import PipelineTable

log = logging.getLogger("offsetlake.batch")  # a stream's lines are its batches': one logger for both


def stream(
    spark: Any,
    cfg: PipelineConfig,
    stop: threading.Event,
    interval: float | None = None,
    run: Run | None = None,
    max_seconds: float | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    tables: Callable[[], list[PipelineTable]] | None = None,
) -> int:
    """Ingest in a loop in one Spark session until `stop` is set (SIGTERM) or max_seconds pass.

    `tables`: the pipeline's tables (offsetlake.config.topic_tables), asked again before each round (a topic
    created meanwhile joins); each round catches up every table, `batch.tables_at_once` at a time, and a
    table with a name (a table per topic) labels its batches; a table's compaction runs after the round.
    A named table that fails is logged and tried again next round while the others go on; a round in which
    every table fails ends the stream with the first one's error (Airflow retries it), as a single table's
    failure does. A round in which the pipeline's patterns match no topic (every one deleted) has no tables:
    the stream waits for one, as it does before its first (offsetlake.runs.first_tables). Without `tables`,
    the one table of `cfg`."""
    interval = cfg.stream_interval_seconds if interval is None else interval
    run = msgspec.structs.replace(run or Run.here(), via="stream")  # its commits say they are a stream's
    deadline = time.monotonic() + max_seconds if max_seconds else None
    parent = os.getppid()
    committed = 0
    tidy: dict[str, StreamCompaction] = {}
    warning = cfg.maintenance.stream_window_warning(interval)
    if warning:
        log.warning("stream %s: %s", cfg.name, warning)
    report = one_at_a_time(on_batch) if on_batch else None  # tables at once: one report at a time
    clusters: dict[str | None, KafkaCluster] = {}  # per table, kept across rounds: its clients stay connected
    listing = TopicListing(cfg.name, tables)
    try:
        while not stop.is_set():
            round_tables: list[tuple[str | None, PipelineConfig]] = listing.round() if tables else [(None, cfg)]

            def one(table: tuple[str | None, PipelineConfig]) -> list[BatchResult]:
                name, one_cfg = table
                if name not in clusters:  # each table is in one thread at a time, and so is its cluster
                    clusters[name] = KafkaCluster(one_cfg.kafka, stop=stop)
                results = ingest(spark, one_cfg, run, stop, clusters[name])
                for result in results:
                    result.table = name
                    if report:
                        report(result)
                return results

            outcomes = each_at_once(round_tables, one, cfg.batch.tables_at_once, stop)
            failed: list[Exception] = []
            for (name, one_cfg), outcome in zip(round_tables, outcomes):
                if isinstance(outcome, Exception):
                    if name is None:
                        raise outcome
                    failed.append(outcome)
                    log.warning(
                        "stream %s: table %s failed (tried again next round): %s", cfg.name, name, one_line(outcome)
                    )
                elif isinstance(outcome, list):  # compaction after the round: never beside another table's batch
                    for result in outcome:
                        if result.status == "committed":
                            committed += 1
                            tidy.setdefault(one_cfg.table_path, StreamCompaction(one_cfg, run, spark)).after(result)
            if failed and len(failed) == len(round_tables):
                raise failed[0]
            if deadline and time.monotonic() >= deadline:
                break
            stop.wait(interval)
            if os.getppid() != parent:
                # Our parent (spark-submit's JVM, an Airflow worker, a shell) is gone: nobody can stop us.
                log.warning("stream: parent process %s exited; stopping", parent)
                break
    finally:
        for cluster in clusters.values():
            cluster.close()
    return committed


class TopicListing:
    """The tables of each round, as `tables()` lists them; none while the patterns match no topic, said
    once each time it begins."""

    def __init__(self, name: str, tables: Callable[[], list[PipelineTable]] | None):
        self.name, self.tables, self.waiting = name, tables, False

    def round(self) -> list[tuple[str | None, PipelineConfig]]:
        assert self.tables is not None
        try:
            listed = self.tables()
        except NoTopicMatches as err:
            if not self.waiting:
                log.warning("stream %s: %s; waiting for one", self.name, one_line(err))
            self.waiting = True
            return []
        self.waiting = False
        return [(t.name, t.cfg) for t in listed]


class StreamCompaction:
    """A stream bounds its own small files: every `maintenance.compact_every_batches` committed batches it
    compacts the files those batches added (and only those, so the cost stays that of N batches). On the
    delta-spark engine, delta-spark's OPTIMIZE compacts the table's small files, in the stream's session."""

    def __init__(self, cfg: PipelineConfig, run: Run | None, spark: Any = None):
        self.cfg, self.run, self.spark = cfg, run, spark
        self.every = cfg.maintenance.compact_every_batches
        self.pending: set[str] = set()
        self.batches = 0

    def after(self, result: BatchResult) -> None:
        if not self.every:
            return
        self.pending |= result.files
        self.batches += 1
        if self.batches < self.every:
            return
        from offsetlake.operations import spark_maintenance
        from offsetlake.operations.compaction import optimize

        cfg = self.cfg
        try:
            if cfg.table.engine == "delta-spark":
                outcome = spark_maintenance.optimize(
                    self.spark, cfg.table_location, cfg.name, cfg.maintenance.target_file_mb, [], self.run or Run.here()
                )
            else:
                outcome = optimize(
                    cfg.table_location,
                    cfg.name,
                    table_schema(cfg),
                    cfg.table.partition_by,
                    cfg.maintenance.target_file_mb,
                    cfg.maintenance.zorder_by,
                    only=self.pending,
                    run=self.run,
                )
        except OffsetlakeError as err:  # best effort: the batches are committed; try again after the next N
            log.warning("stream: compaction skipped: %s", err)
            self.batches = 0
            return
        log.info(outcome.summary())
        self.pending, self.batches = set(), 0
