"""`DeltaSpark`: the batches of a pipeline table committed by delta-spark, Delta's engine in Spark and Databricks.

Everything before the commit is offsetlake's own, as on the delta-rs engine: the plan, the ledger (read with
delta-rs from the snapshot the commit is decided on), the Spark tasks that read Kafka and stage the rows,
the quarantine table. The commit is delta-spark's: one transaction (`spark_transaction`) whose version the
decision is made against, writing the staged rows again through `OptimisticTransaction.writeFiles` -- which
computes generated and identity columns, checks constraints, clusters and tracks rows as the table's
features ask -- with the ledger's `txn` actions and the commit's `userMetadata`. An upsert is planned and
written in that same transaction (`spark_merge`). Columns a batch adds (a registry schema that grew) are
added first by their own `ALTER TABLE ... ADD COLUMNS` commit: a nullable column and nothing else, which a
refused batch leaves harmlessly behind.

A conflict (another commit set one of the ledger's application ids, or changed a file an upsert rewrites)
is decided again, as on delta-rs; an unsure failure looks for the attempt's commit first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

import msgspec
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from offsetlake.config import PipelineConfig
from offsetlake.engine import spark_merge, spark_transaction
from offsetlake.engine.delta_rs import DeltaRs
from offsetlake.errors import CommitConflictError, OffsetlakeError, TableError, TableMissing, one_line
from offsetlake.protocol.commit import MAX_ATTEMPTS, Change, Committed, Decide, Settled, landed_version
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import from_delta_path, plain_types
from offsetlake.table import check_mergeable, delete_files, open_table

CREATE_ATTEMPTS = 5  # a table another job is creating has its first commit within seconds

log = logging.getLogger("offsetlake.engine.delta_spark")


class DeltaSpark(DeltaRs):
    """delta-spark, in the job's Spark session, commits one pipeline table."""

    name = "delta-spark"

    def __init__(self, cfg: PipelineConfig, spark: Any) -> None:
        super().__init__(cfg)
        self.spark = spark

    @property
    def session(self) -> Any:
        from offsetlake.spark.session import session_of

        if self.spark is None:
            raise TableError(f"pipeline {self.cfg.name}: the delta-spark engine commits in a Spark session; none given")
        refuse_object_store(self.location)
        session = session_of(self.spark)
        spark_transaction.check_on_classpath(session)
        return session

    def open(self) -> DeltaTable:
        cfg = self.cfg
        refuse_object_store(self.location)
        try:
            table = open_table(
                self.location, self.schema, cfg.table.partition_by, cfg.name, create=False, writer=self.name
            )
        except TableMissing:
            self._create_with_spark()
            return open_table(self.location, self.schema, cfg.table.partition_by, cfg.name, writer=self.name)
        if cfg.write.upsert:
            check_mergeable(self.location, table, f"pipeline {cfg.name}")
        return table

    def _create_with_spark(self) -> None:
        """A missing table created by delta-spark, with the pipeline's columns and properties."""
        schema = self.initial_schema()
        properties = ", ".join(f"'{k}' = '{v}'" for k, v in self.cfg.table_properties().items())
        partitioned = self.cfg.table.partition_by
        create = (
            f"CREATE TABLE IF NOT EXISTS delta.{spark_merge.quoted(self.uri)} ({_ddl(self.session, list(schema))}) "
            f"USING delta"
            + (f" PARTITIONED BY ({', '.join(spark_merge.quoted(c) for c in partitioned)})" if partitioned else "")
            + (f" TBLPROPERTIES ({properties})" if properties else "")
        )
        for attempt in range(CREATE_ATTEMPTS):
            try:
                self._sql(create, "create the table")
                return
            except TableError:
                # Another job creating it at the same moment: delta-spark saw its log directory before its
                # first commit ("not empty and also not a Delta table"). Once that commit is there, it is ours too.
                if DeltaTable.is_deltatable(self.location.uri, self.location.storage_options):
                    return
                if attempt == CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)

    @property
    def uri(self) -> str:
        return str(self.location)

    def commit(
        self, decide: Decide, what: str, snapshot: DeltaTable | None = None, rewrites: bool = False
    ) -> Committed | Settled:
        # `rewrites` asks nothing more of delta-spark: it reads rows as Delta does, deletion vectors applied
        spark = self.session
        conflicts = 0
        for _ in range(MAX_ATTEMPTS):
            txn = spark_transaction.start(spark, self.uri)
            version = int(txn.readVersion())
            table = snapshot if snapshot is not None and snapshot.version() == version else None
            table, snapshot = table or self.location.delta_table(version), None
            change = decide(table)
            if isinstance(change, Settled):
                return change
            if conflicts:
                change = replace(change, metadata=msgspec.structs.replace(change.metadata, conflicts=conflicts))
            if self._add_columns(change, table):
                continue  # the columns landed in a commit of their own: decide again on top of it
            written: set[str] = set()
            counts: dict[str, int] | None = None
            try:
                actions, written, counts = self._actions(spark, txn, change)
                change = _with_removed_rows(change, counts)
                version = spark_transaction.commit(spark, txn, actions, change.metadata.to_json(), self.location)
                return self._committed(version, change, written, counts)
            except OffsetlakeError:
                raise
            except Exception as err:  # noqa: BLE001 - a JVM error: did ours land, or did another's first?
                landed = landed_version(self.location, change.metadata.attempt)
                if landed is not None:
                    return self._committed(landed, change, written, counts)
                # delta-spark's files do not carry the attempt's id, so the attempt's clean-up cannot find them
                delete_files(self.location, written)
                conflict = spark_transaction.conflict_of(err)
                if conflict is None:
                    raise TableError(f"{what}: the commit to {self.location} failed: {one_line(err)}") from err
                log.info("%s: another commit landed first (%s); deciding again", what, conflict)
                conflicts += 1
        raise CommitConflictError(what, MAX_ATTEMPTS)

    def _committed(self, version: int, change: Change, written: set[str], counts: dict[str, int] | None) -> Committed:
        merged, replaced = (None, counts) if change.replaces else (counts, None)
        return Committed(version, change, rewritten=frozenset(written), merged=merged, replaced=replaced)

    def _actions(self, spark: Any, txn: Any, change: Change) -> tuple[list[Any], set[str], dict[str, int] | None]:
        """The change's actions in `txn` -- its data files written by delta-spark, the ledger's `txn`
        actions --, the paths of the files it wrote, and an upsert's or a backfill's counts."""
        if change.restore_version is not None:
            raise TableError("a RESTORE is not written by the delta-spark engine: run it with delta-rs")
        spark_transaction.read_app_ids(txn, change.txns)
        counts = None
        if change.merge is not None:
            plan = spark_merge.rewrite(spark, txn, self.uri, change.merge)
            actions, counts = plan.actions, plan.merged
        elif change.replaces:
            files = [a for a in change.actions if isinstance(a, AddAction)]
            new_rows = self._staged_frame(spark, files) if files else None
            plan = spark_merge.replace_ranges(spark, txn, self.uri, change.replaces, new_rows)
            actions, counts = plan.actions, plan.merged
        else:
            actions = [*self._removed(txn, change), *self._written(spark, txn, change)]
        written = {a.path() for a in actions if a.getClass().getSimpleName() == "AddFile"}
        return [*actions, *spark_transaction.set_transactions(spark, change.txns)], written, counts

    def _removed(self, txn: Any, change: Change) -> list[Any]:
        """The change's removes (a repair's rebuild removes every file) as delta-spark's: each from the
        transaction's own `AddFile`, so its deletion vector and row ids go with it."""
        from urllib.parse import unquote

        paths = {unquote(from_delta_path(a.path)) for a in change.actions if isinstance(a, RemoveAction)}
        if not paths:
            return []
        now = int(time.time() * 1000)
        files = [f for f in spark_transaction.files_of(txn) if unquote(f.path()) in paths]
        if len(files) != len(paths):
            raise TableError(f"table {self.location}: {len(paths) - len(files)} files to remove are not in the table")
        return [f.removeWithTimestamp(now, True) for f in files]

    def _written(self, spark: Any, txn: Any, change: Change) -> list[Any]:
        """The staged files' rows written again by delta-spark: its data files (AddFiles)."""
        files = [a for a in change.actions if isinstance(a, AddAction)]
        if not files:
            return []
        rows = self._staged_frame(spark, files)
        return spark_transaction.as_list(txn.writeFiles(rows._jdf))

    def _staged_frame(self, spark: Any, files: list[Any]) -> Any:
        """The staged files as one Spark DataFrame in the table's columns, partition values put back from
        each file's add action (a partitioned file holds them in its path only)."""
        from functools import reduce

        from pyspark.sql import functions as F

        target = spark.read.format("delta").load(self.uri).schema
        partition_by = self.cfg.table.partition_by
        data_schema = _struct_without(target, partition_by)
        groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
        for f in files:
            values = tuple((c, (f.partition_values or {}).get(c)) for c in partition_by)
            groups.setdefault(values, []).append(f"{self.uri.rstrip('/')}/{from_delta_path(f.path)}")
        frames = []
        for values, paths in groups.items():
            frame = spark.read.schema(data_schema).parquet(*paths)
            for column, value in values:
                frame = frame.withColumn(column, F.lit(value).cast(target[column].dataType))
            frames.append(frame.select(*[F.col(spark_merge.quoted(c)) for c in target.names]))
        return reduce(lambda a, b: a.unionByName(b), frames)

    def rows_where(self, predicate: str) -> pa.Table:
        """As delta-rs' (the old rows of key changes), read by delta-spark: a table with a feature delta-rs
        cannot read (type widening) is read here too."""
        table = self.session.read.format("delta").load(self.uri)
        return plain_types(table.where(spark_merge.spark_sql(predicate)).toArrow())

    def _add_columns(self, change: Change, table: DeltaTable) -> bool:
        """Columns the change brings that `table` lacks, added in a commit of their own; True if `table` lacked
        any (decide again on the table as it is now). Another job may be adding the same columns (two
        batches of one schema change): which are still missing is decided again under the log lock, on
        the table's latest version, and a column another job added first is not added twice."""
        if not _new_columns(change, pa.schema(table.schema()).names):
            return False
        with spark_transaction.log_lock(self.location):
            missing = _new_columns(change, pa.schema(self.location.delta_table().schema()).names)
            if missing:
                self._sql_locked(
                    f"ALTER TABLE delta.{spark_merge.quoted(self.uri)} ADD COLUMNS ({_ddl(self.session, missing)})",
                    "add the batch's new columns",
                )
        return True

    def _sql(self, statement: str, what: str) -> None:
        with spark_transaction.log_lock(self.location):
            self._sql_locked(statement, what)

    def _sql_locked(self, statement: str, what: str) -> None:
        """`statement`, the log lock already held (a POSIX lock: taking it again in this process and
        closing that file would release it)."""
        try:
            self.session.sql(statement).collect()
        except Exception as err:
            raise TableError(f"table {self.location}: could not {what}: {one_line(err)}") from err


def _new_columns(change: Change, present: list[str]) -> list[pa.Field]:
    """The columns `change` writes that a table of columns `present` lacks."""
    if change.merge is not None:
        return spark_merge.added_columns(change.merge.source.schema, present)
    if change.evolve and change.schema is not None:
        return [f for f in change.schema if f.name not in present]
    return []


def refuse_object_store(location: Location) -> None:
    """Fail in one line, before anything is written, for a table in an object store. Two writers of one
    version need the store to let only one of them create the log entry: delta-rs makes a conditional put,
    delta-spark's S3 log store excludes writers only within its own driver (and its DynamoDB one is not
    one delta-rs 1.x takes). A zombie on delta-spark and its retry, or delta-spark and offsetlake's own
    delta-rs commits (the quarantine, maintenance of the other engine), could then both write one version,
    and one commit would be lost."""
    if location.is_object_store:
        raise TableError(
            f"table {location}: the delta-spark engine writes tables on a local or shared file system only: on "
            f"an object store two writers of one version are not kept apart (delta-spark makes no conditional "
            f"put); nothing was written. Use `table.engine: delta-rs` for this table"
        )


def _with_removed_rows(change: Change, counts: dict[str, int] | None) -> Change:
    """A backfill's metadata with the rows its replacement removed, known once delta-spark found them."""
    if not change.replaces or counts is None:
        return change
    records = msgspec.structs.replace(change.metadata.records, removed=counts["removed"])
    return replace(change, metadata=msgspec.structs.replace(change.metadata, records=records))


def _ddl(spark: Any, fields: list[pa.Field]) -> str:
    """Spark SQL column definitions of Arrow fields."""
    from pyspark.sql.pandas.types import from_arrow_type

    return ", ".join(
        f"{spark_merge.quoted(f.name)} {from_arrow_type(f.type).simpleString()}" + ("" if f.nullable else " NOT NULL")
        for f in fields
    )


def _struct_without(struct: Any, names: list[str]) -> Any:
    from pyspark.sql.types import StructType

    return StructType([f for f in struct.fields if f.name not in names])
