"""What a command or an Airflow task runs, for every table of a pipeline: ingest, stream, recover and
maintain, as library calls. The CLI (offsetlake.cli) and the Spark jobs the Airflow operator submits
(jobs/*.py) both come here; each says what happened through `say`, one line at a time (the CLI prints it).

A table that fails does not stop the others: each is tried, and the run fails afterwards naming each
failed table and why.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from offsetlake.config import PipelineConfig
from offsetlake.config.topic_tables import NoTopicMatches, PipelineTable, only_table, pipeline_tables, select
from offsetlake.errors import ConfigError, OffsetlakeError, one_line
from offsetlake.kafka import KafkaCluster, topic_lister
from offsetlake.protocol.metadata import Run
from offsetlake.storage.location import Location

if TYPE_CHECKING:
    from offsetlake.batch import BatchResult

Say = Callable[[str], None]
SparkFactory = Callable[[PipelineConfig, str], Any]  # (pipeline, job) -> a context manager yielding a session


def tables_of(
    cfg: PipelineConfig, name: str | None = None, topic_names: Callable[[], list[str]] | None = None
) -> list[PipelineTable]:
    """The tables a run acts on: the pipeline's (as of the cluster's topics now, `topic_names()`; by default
    a client made for the call), or `name`'s."""
    return select(pipeline_tables(cfg, topic_names or topic_lister(cfg.kafka)), cfg, name)


def one_table(cfg: PipelineConfig, name: str | None = None) -> PipelineConfig:
    """The one table a run acts on, as a single-table pipeline (`name`: a table of a per-topic pipeline)."""
    return only_table(cfg, name, topic_lister(cfg.kafka))


def check_reachable(cfg: PipelineConfig) -> None:
    """Fail in seconds if the table's object store, Kafka or the topics are not there: before a Spark
    session starts (from a terminal), or while one starts in the background (under spark-submit:
    LazySession.start_early)."""
    from offsetlake.table import check_store

    check_store(cfg.table_location)
    if cfg.quarantine_path != cfg.table_path:
        check_store(cfg.quarantine_location, "quarantine")
    cluster = KafkaCluster(cfg.kafka)
    cluster.partitions(cfg.topics)
    cluster.check_access(cfg.topics, cfg.consumer_group)
    if cfg.format.registry is not None:
        from offsetlake.formats.registry_client import registry_for

        registry_for(cfg.format.registry).check()


def ingest_tables(spark: Any, tables: list[PipelineTable], run: Run, say: Say, warn: Say) -> list[BatchResult]:
    """Every table in one Spark session, `batch.tables_at_once` at a time; a summary line per batch.
    Returns every table's batches (each labelled with its table)."""
    from offsetlake.batch import ingest
    from offsetlake.rounds import each_at_once, one_at_a_time

    say_whole = one_at_a_time(say)  # tables at once: each line whole

    def one(table: PipelineTable) -> list[BatchResult]:
        check_reachable(table.cfg)
        results = ingest(spark, table.cfg, run)
        for result in results:
            result.table = table.name
            say_whole(result.summary())
        return results

    outcomes = each_at_once(tables, one, tables[0].cfg.batch.tables_at_once if tables else 1)
    if len(tables) == 1 and isinstance(outcomes[0], BaseException):
        raise outcomes[0]
    failed: list[str] = []
    for table, outcome in zip(tables, outcomes):
        if isinstance(outcome, BaseException):  # one table's failure is reported, the others went on
            failed.append(f"{table.name} ({one_line(outcome)})")
            warn(f"{table.name}: failed: {one_line(outcome)}")
    if failed:
        raise OffsetlakeError(f"ingest failed for {len(failed)} of {len(tables)} tables: {'; '.join(failed)}")
    return [result for outcome in outcomes if isinstance(outcome, list) for result in outcome]


def first_spark_job(results: list[BatchResult]) -> tuple[float, float] | None:
    """The (submitted, ended) of the first Spark job among the batches, for a session's start-up report."""
    jobs = [r.spark_job for r in results if r.spark_job is not None]
    return min(jobs) if jobs else None


def first_tables(
    current_tables: Callable[[], list[PipelineTable]],
    stop: threading.Event,
    interval: float,
    warn: Say,
    max_seconds: float | None = None,
) -> list[PipelineTable]:
    """A stream's tables at its start. Topic patterns that match nothing yet are waited on, checked every
    `interval` (a connector creates its topics with its first events, so a stream started beside it may come
    first), said once; no tables if `stop` is set or `max_seconds` pass before one matches. Any other
    refusal is raised. No tables either when the parent process exits meanwhile, as in a stream."""
    deadline = time.monotonic() + max_seconds if max_seconds else None
    parent = os.getppid()
    said = False
    while True:
        try:
            return current_tables()
        except NoTopicMatches as err:
            if not said:
                warn(f"{one_line(err)}; the stream waits for one (listed every {interval:g} s)")
                said = True
        if deadline is not None and time.monotonic() >= deadline:
            return []
        if stop.wait(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))):
            return []
        if os.getppid() != parent:  # as a stream does (offsetlake.streaming): nobody is left to stop it
            return []


def stream_tables(
    spark: Any,
    current_tables: Callable[[], list[PipelineTable]],
    stop: threading.Event,
    interval: float,
    run: Run,
    warn: Say,
    max_seconds: float | None = None,
) -> int:
    """Batches of every table, round after round, until `stop`; the tables are listed again before each
    round (a topic created meanwhile that matches gets its table). Returns the batches committed."""
    from offsetlake.batch import print_progress
    from offsetlake.streaming import stream

    tables = current_tables()
    unreachable = []
    for table in tables:
        try:
            check_reachable(table.cfg)
        except Exception as err:  # noqa: BLE001 - a table per topic: the stream tries it again each round
            if table.name is None:
                raise
            unreachable.append(err)
            warn(f"{table.name}: failed: {one_line(err)}")
    if len(unreachable) == len(tables):
        raise unreachable[0]
    return stream(
        spark,
        tables[0].cfg,
        stop,
        interval,
        run,
        max_seconds=max_seconds,
        on_batch=print_progress,
        tables=current_tables,
    )


def problems(cfg: PipelineConfig) -> str:
    """What an audit counts: offsets (append mode), keys (upsert mode: the table against the fold)."""
    return "bad keys" if cfg.write.upsert else "bad offsets"


def repair(spark_for: SparkFactory, cfg: PipelineConfig, run: Run, say: Say, dry_run: bool, before: Any = None) -> Any:
    """Audit (unless given), backfill every damaged span, audit again. The audit after, or the one before."""
    from offsetlake.operations.audit import audit
    from offsetlake.operations.audit import repair as repair_spans

    with spark_for(cfg, "repair") as spark:
        before, result = repair_spans(spark, cfg, run, dry_run=dry_run, report=before)
        say(before.format())
        if result is None:
            say("nothing to repair")
            return before
        say(result.summary())
        if dry_run:
            return before
        after = audit(cfg, spark=spark)  # read as the one before was: on the delta-spark engine, by delta-spark
    say(after.format())
    if not after.ok:
        raise OffsetlakeError("repair finished but audit still finds problems")
    return after


def cleanup(cfg: PipelineConfig, older_than: int, dry_run: bool, say: Say) -> None:
    """Both tables; the quarantine table may not exist yet (no bad record so far)."""
    from offsetlake.operations.maintenance import cleanup as cleanup_table

    for location in (cfg.table_location, cfg.quarantine_location):
        try:
            say(cleanup_table(location, older_than, dry_run).summary())
        except OffsetlakeError as err:
            if location == cfg.table_location:
                raise
            say(f"{location}: skipped ({err})")


def reset(cfg: PipelineConfig, offsets: str, reason: str, run: Run, say: Say) -> None:
    from offsetlake.operations.maintenance import parse_offsets
    from offsetlake.operations.maintenance import reset as reset_ledger

    version = reset_ledger(cfg, parse_offsets(offsets), reason, run)
    say(f"ledger reset recorded in table version {version}")


def recover(
    spark_for: SparkFactory,
    cfg: PipelineConfig,
    run: Run,
    say: Say,
    *,
    reset_offsets: str | None = None,
    reason: str = "",
    repair_damage: bool = False,
    clean_up: bool = False,
    older_than: int = 0,
) -> None:
    """The recovery DAG's workflow: reset the ledger (if asked), audit, repair what the audit finds (if
    asked), clean up orphaned files (if asked); fails while the audit still finds problems."""
    from offsetlake.operations.audit import audit

    if reset_offsets:
        reset(cfg, reset_offsets, reason, run, say)
    with spark_for(cfg, "audit") as spark:  # started only to read a delta-spark engine's table
        report = audit(cfg, spark=spark)
    if repair_damage and not report.ok:
        report = repair(spark_for, cfg, run, say, dry_run=False, before=report)
    else:
        say(report.format())
    if clean_up:
        cleanup(cfg, older_than, dry_run=False, say=say)
    if not report.ok:
        raise OffsetlakeError(
            f"audit found {report.problem_count()} {problems(cfg)} in {cfg.name}"
            + ("" if repair_damage else "; run again with repair to fix them")
        )


def maintained_tables(cfg: PipelineConfig) -> list[Location]:
    """What maintenance runs on: the table, and its quarantine table once one exists."""
    from deltalake import DeltaTable

    quarantine = cfg.quarantine_location
    exists = DeltaTable.is_deltatable(quarantine.uri, quarantine.storage_options)
    return [cfg.table_location] + ([quarantine] if exists else [])


def optimize(
    cfg: PipelineConfig,
    run: Run,
    say: Say,
    target_file_mb: int | None = None,
    zorder_by: str | None = None,
    spark: Any = None,
) -> None:
    """The table, then the quarantine table if there is one (no z-order there: it has other columns). On the
    delta-spark engine the table is optimized by delta-spark, in `spark`."""
    from offsetlake.formats.columns import quarantine_schema, table_schema
    from offsetlake.operations import spark_maintenance
    from offsetlake.operations.compaction import optimize as compact
    from offsetlake.protocol.quarantine import quarantine_schema_of
    from offsetlake.table import open_table

    settings = cfg.maintenance
    target = target_file_mb or settings.target_file_mb
    zorder = [c.strip() for c in zorder_by.split(",") if c.strip()] if zorder_by else settings.zorder_by
    columns = cfg.data_columns()
    if cfg.format.evolves:  # the payload columns come from the registry: the table has them
        fields = open_table(cfg.table_location).schema().fields
        columns = [f.name for f in fields if f.name not in cfg.table.partition_by]
    wrong = sorted(c for c in zorder if c not in columns)
    if wrong:
        raise ConfigError(f"--zorder-by column {wrong[0]!r} is not a data column of pipeline {cfg.name!r}")
    settle_restore(cfg, spark, say)
    for location in maintained_tables(cfg):
        if location == cfg.table_location and by_delta_spark(cfg):
            outcome = spark_maintenance.optimize(spark, location, cfg.name, target, zorder, run)
        elif location == cfg.table_location:
            outcome = compact(location, cfg.name, table_schema(cfg), cfg.table.partition_by, target, zorder, run=run)
        else:
            schema = quarantine_schema_of(open_table(location), quarantine_schema(cfg))
            outcome = compact(location, cfg.name, schema, [], target, run=run)
        say(outcome.summary())


def vacuum(
    cfg: PipelineConfig, retention_hours: int | None, dry_run: bool, run: Run, say: Say, spark: Any = None
) -> None:
    from offsetlake.operations import spark_maintenance
    from offsetlake.operations.maintenance import vacuum as vacuum_table

    settle_restore(cfg, spark, say)
    for location in maintained_tables(cfg):
        if location == cfg.table_location and by_delta_spark(cfg):
            outcome = spark_maintenance.vacuum(spark, location, cfg.name, retention_hours, dry_run, run)
        else:
            outcome = vacuum_table(location, cfg.name, retention_hours, dry_run, run)
        say(outcome.summary())


def checkpoint(cfg: PipelineConfig, say: Say, spark: Any = None) -> None:
    from offsetlake.operations import spark_maintenance
    from offsetlake.operations.maintenance import checkpoint as checkpoint_table

    settle_restore(cfg, spark, say)
    for location in maintained_tables(cfg):
        if location == cfg.table_location and by_delta_spark(cfg):
            version = spark_maintenance.checkpoint(spark, location)
        else:
            version = checkpoint_table(location)
        say(f"{location}: checkpoint at version {version}; commit files past the log retention removed")


def restore(cfg: PipelineConfig, version: int, run: Run, spark: Any = None) -> int:
    """The table back at `version` with its ledger (on the delta-spark engine, by delta-spark in `spark`);
    the version that holds it."""
    from offsetlake.operations import spark_maintenance
    from offsetlake.operations.maintenance import restore as restore_table

    if by_delta_spark(cfg):
        return spark_maintenance.restore(spark, cfg, version, run)
    return restore_table(cfg, version, run)


def settle_restore(cfg: PipelineConfig, spark: Any, say: Say) -> None:
    """Before a commit that is not a batch's: a RESTORE by another writer recorded in the ledger first, so that
    log clean-up cannot take away the version the ledger is read at (`maintenance.record_pending_rewind`)."""
    from offsetlake.engine import engine_for
    from offsetlake.operations.maintenance import record_pending_rewind

    if record_pending_rewind(cfg, engine_for(cfg, spark).commit) is not None:
        say(f"{cfg.table_location}: the ledger as of a RESTORE by another writer recorded first")


def by_delta_spark(cfg: PipelineConfig) -> bool:
    """Whether the pipeline's table is maintained by delta-spark (its engine); its quarantine never is."""
    return cfg.table.engine == "delta-spark"


def maintain(
    cfg: PipelineConfig,
    run: Run,
    say: Say,
    *,
    compact: bool = False,
    vacuum_files: bool = False,
    checkpoint_log: bool = False,
    target_file_mb: int | None = None,
    zorder_by: str | None = None,
    retention_hours: int | None = None,
    spark: Any = None,
) -> None:
    """The maintenance DAG's workflow: optimize, vacuum and checkpoint, as asked, in that order (`spark`: the
    session a delta-spark engine's table is maintained in)."""
    if not (compact or vacuum_files or checkpoint_log):
        raise ConfigError("nothing to do: give --optimize, --vacuum and/or --checkpoint")
    if compact:
        optimize(cfg, run, say, target_file_mb, zorder_by, spark)
    if vacuum_files:
        vacuum(cfg, retention_hours, dry_run=False, run=run, say=say, spark=spark)
    if checkpoint_log:
        checkpoint(cfg, say, spark)


@contextmanager
def spark_session(cfg: PipelineConfig, job: str, master: str | None = None) -> Iterator[Any]:
    """A Spark session started on first use (a run with nothing to do starts no JVM), always stopped.
    Under spark-submit, whose JVM runs already, it starts while the run plans (start_early)."""
    from offsetlake.spark.session import LazySession, delta_spark_conf, read_defaults

    # delta-spark commits, or registers the table in the session's catalog (table.name).
    wants_delta = cfg.table.engine == "delta-spark" or cfg.table.name is not None
    extra = delta_spark_conf(read_defaults()) if wants_delta else None
    spark = LazySession(f"offsetlake-{job}-{cfg.name}", master, extra)
    spark.start_early()
    try:
        yield spark
    finally:
        spark.stop()
