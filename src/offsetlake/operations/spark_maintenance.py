"""Maintenance of a table on the delta-spark engine, done by delta-spark itself: OPTIMIZE, VACUUM, checkpoints,
RESTORE.

A table whose pipeline commits with delta-spark may carry features offsetlake's own rewrites cannot keep
(deletion vectors, row tracking, liquid clustering...). delta-spark's OPTIMIZE and RESTORE keep all of them:
OPTIMIZE applies deletion vectors instead of bringing deleted rows back, carries row ids over, clusters a
clustered table.
Its commits hold no `txn` action, so the ledger stays where the batches left it, and their `userMetadata`
(Delta's `commitInfo.userMetadata` setting, for the statement's commits only) names offsetlake's operation
as the delta-rs engine's do. The quarantine table is offsetlake's own (delta-rs) on either engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from offsetlake.config import PipelineConfig
from offsetlake.engine import spark_transaction
from offsetlake.engine.delta_spark import DeltaSpark, refuse_object_store
from offsetlake.engine.spark_merge import quoted
from offsetlake.errors import ConfigError, TableError, one_line
from offsetlake.operations.compaction import MB, OptimizeResult
from offsetlake.operations.maintenance import VacuumResult, check_retention, record_pending_rewind, retention_hours_of
from offsetlake.protocol.metadata import CommitMetadata, Kind, Run
from offsetlake.storage.delta_log import commit_actions
from offsetlake.storage.location import Location
from offsetlake.table import open_table

if TYPE_CHECKING:
    pass

DELTA = "spark.databricks.delta."


def optimize(
    spark: Any, location: Location, pipeline: str, target_file_mb: int, zorder_by: Sequence[str], run: Run
) -> OptimizeResult:
    """delta-spark's OPTIMIZE (ZORDER BY the columns given; a clustered table is clustered by its own keys)."""
    zorder = f" ZORDER BY ({', '.join(quoted(c) for c in zorder_by)})" if zorder_by else ""
    target = str(target_file_mb * MB)  # files below it are compacted into files of about it
    settings = {f"{DELTA}optimize.minFileSize": target, f"{DELTA}optimize.maxFileSize": target}
    before = open_table(location).version()
    with _statement_of(spark, location, pipeline, "optimize", run, settings) as sql:
        metrics = sql(f"OPTIMIZE {_table(location)}{zorder}", "optimize")[0]["metrics"]
    if not metrics["numFilesRemoved"]:
        return OptimizeResult(location, None)
    version, rows = _commit_after(location, before, "OPTIMIZE")
    return OptimizeResult(location, version, metrics["numFilesRemoved"], metrics["numFilesAdded"], rows)


def vacuum(
    spark: Any, location: Location, pipeline: str, retention_hours: int | None, dry_run: bool, run: Run
) -> VacuumResult:
    """delta-spark's VACUUM (full) with offsetlake's retention rule: the table's own retention by default,
    never below the clean-up safety window. Delta's own check (7 days at least) gives way to that rule."""
    hours = retention_hours if retention_hours is not None else retention_hours_of(open_table(location))
    check_retention(hours)
    settings = {
        f"{DELTA}retentionDurationCheck.enabled": "false",
        # delta-spark 4 takes the table's retention and ignores RETAIN unless told otherwise
        f"{DELTA}vacuum.retentionWindowIgnore.enabled": "false",
    }
    statement = f"VACUUM {_table(location)} RETAIN {hours} HOURS"
    with _statement_of(spark, location, pipeline, "vacuum", run, settings) as sql:
        doomed = [row["path"] for row in sql(f"{statement} DRY RUN", "vacuum")]
        if not dry_run and doomed:
            sql(statement, "vacuum")
    root = location.uri.rstrip("/") + "/"
    return VacuumResult(location, sorted(_relative(path, root) for path in doomed), hours, dry_run)


def checkpoint(spark: Any, location: Location) -> int:
    """A checkpoint of the newest version by delta-spark, then its clean-up of commit files past the
    table's log retention. The ledger (txn actions) is part of the checkpoint."""
    session = _session(spark, location)
    settings = {f"{DELTA}checkpoint.exceptionThrowing.enabled": "true"}  # Delta logs and swallows a failure
    with _settings(session, settings):
        try:
            return spark_transaction.checkpoint(session, str(location))
        except Exception as err:
            raise TableError(f"table {location}: delta-spark could not checkpoint: {one_line(err)}") from err


def restore(spark: Any, cfg: PipelineConfig, version: int, run: Run) -> int:
    """delta-spark's RESTORE to `version`, then the ledger as of that version in a commit of its own.

    Delta's RESTORE brings back the data files (deletion vectors, row ids and clustering with them) but not
    the `txn` actions. Until the second commit lands, the ledger already reads as of `version` -- the
    rewind after any RESTORE (`protocol.ledger`) -- so a job killed in between loses nothing; the second
    commit records the rewind, partitions the ledger did not know then starting from Kafka's earliest
    offset as on the delta-rs engine. A batch that commits in between records the rewind itself, and the
    second commit then settles."""
    location = cfg.table_location
    session = _session(spark, location)
    newest = open_table(location).version()
    if not 0 <= version < newest:
        raise ConfigError(f"version {version} is not an earlier version of {cfg.table_path} (now {newest})")
    try:
        with spark_transaction.log_lock(location):
            session.sql(f"RESTORE TABLE {_table(location)} TO VERSION AS OF {version}").collect()
    except Exception as err:
        raise TableError(f"table {location}: delta-spark could not restore version {version}: {one_line(err)}") from err
    recorded = record_pending_rewind(cfg, DeltaSpark(cfg, session).commit, new_partitions_from_earliest=True)
    return recorded if recorded is not None else open_table(location).version()


@contextmanager
def _statement_of(
    spark: Any, location: Location, pipeline: str, kind: Kind, run: Run, settings: dict[str, str]
) -> Iterator[Any]:
    """A way to run statements on the table whose commits carry the operation's `userMetadata`."""
    session = _session(spark, location)
    metadata = CommitMetadata(pipeline, kind, run=run).to_json()

    def sql(statement: str, what: str) -> list[Any]:
        try:
            with spark_transaction.log_lock(location):  # its commits, one at a time with offsetlake's others
                return session.sql(statement).collect()
        except Exception as err:
            raise TableError(f"table {location}: delta-spark could not {what}: {one_line(err)}") from err

    with _settings(session, {**settings, f"{DELTA}commitInfo.userMetadata": metadata}):
        yield sql


@contextmanager
def _settings(session: Any, settings: dict[str, str]) -> Iterator[None]:
    """Session settings for the statements inside, then as they were."""
    before = {key: session.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        session.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, value)


def _session(spark: Any, location: Location) -> Any:
    from offsetlake.spark.session import session_of

    refuse_object_store(location)
    if spark is None:
        raise TableError(f"table {location}: the delta-spark engine maintains its table in a Spark session; none given")
    session = session_of(spark)
    spark_transaction.check_on_classpath(session)
    return session


def _table(location: Location) -> str:
    return f"delta.{quoted(str(location))}"


def _commit_after(location: Location, before: int, operation: str) -> tuple[int | None, int]:
    """The version of the newest `operation` commit since version `before`, and the rows the files it adds
    hold (their statistics); (None, 0) when there is none."""
    table = open_table(location)
    for entry in table.history(max(table.version() - before, 1)):
        version = entry.get("version", -1)
        if entry.get("operation") == operation and version > before:
            return version, _rows_added(location, version)
    return None, 0


def _rows_added(location: Location, version: int) -> int:
    actions = commit_actions(location, version) or []  # just committed: log clean-up has not reached it
    return sum(json.loads(a["add"].get("stats") or "{}").get("numRecords", 0) for a in actions if "add" in a)


def _relative(path: str, root: str) -> str:
    for prefix in (root, root.replace("file://", "file:"), root.removeprefix("file://")):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path
