"""`DeltaRs`, offsetlake's own commit path: delta-rs. The rows are written as Parquet by the Spark tasks
(`read_job`) and committed as add actions, upserts as a delta-rs MERGE (`protocol.commit`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake.config import PipelineConfig
from offsetlake.errors import TableError, TableMissing
from offsetlake.formats.columns import initial_table_schema, quarantine_schema, table_schema
from offsetlake.formats.evolution import Incompatible
from offsetlake.kafka import TP
from offsetlake.protocol.commit import AttemptFiles, Committed, Decide, Settled, attempt_files, commit
from offsetlake.protocol.key_changes import Key, OldRows, keys_predicate
from offsetlake.protocol.ledger import Ledger, read_ledger
from offsetlake.protocol.metadata import Run
from offsetlake.protocol.planning import BatchPlan
from offsetlake.protocol.quarantine import WrittenFile, commit_quarantine
from offsetlake.protocol.upsert import read_staging
from offsetlake.read.tasks import TaskContext, TaskResults
from offsetlake.read_job import TaskFiles, evolved_schema, run_tasks, table_columns
from offsetlake.storage.parquet import DataFile
from offsetlake.table import check_mergeable, create_table, open_table, query


class DeltaRs:
    """delta-rs: offsetlake's own commit path, for one pipeline table."""

    name = "delta-rs"

    def __init__(self, cfg: PipelineConfig) -> None:
        self.cfg = cfg
        self.location = cfg.table_location

    @cached_property
    def schema(self) -> pa.Schema:
        return table_schema(self.cfg)

    def open(self) -> DeltaTable:
        """Registry formats create a missing table from the registry's latest schema, so a table exists with
        its columns before the first record arrives. An upsert table is refused before a task writes a file
        if a MERGE cannot be written to it."""
        cfg = self.cfg
        try:
            table = open_table(self.location, self.schema, cfg.table.partition_by, cfg.name, create=False)
        except TableMissing:
            return self._create()
        if cfg.write.upsert:
            check_mergeable(self.location, table, f"pipeline {cfg.name}")
        return table

    def _create(self) -> DeltaTable:
        cfg = self.cfg
        schema = self.initial_schema()
        return create_table(self.location, schema, cfg.table.partition_by, cfg.name, cfg.table_properties())

    def initial_schema(self) -> pa.Schema:
        """The columns a missing table is created with (a registry format's latest schema, checked)."""
        cfg = self.cfg
        try:
            schema = initial_table_schema(cfg)
        except Incompatible as err:
            raise TableError(f"cannot create the table of pipeline {cfg.name}: {err}") from err
        missing = sorted(set(cfg.table.partition_by) - set(schema.names))
        if missing:
            raise TableError(
                f"table.partition_by column {missing[0]!r} is not a column of the table "
                f"(the registry's latest schema has no such field)"
            )
        return schema

    def existing(self) -> DeltaTable:
        return open_table(self.location)

    def columns(self, table: DeltaTable) -> pa.Schema:
        return table_columns(table)

    def ledger(self, table: DeltaTable, tps: list[TP]) -> Ledger:
        return read_ledger(self.location, table, self.cfg.name, tps)

    def attempt(self, attempt: str) -> AbstractContextManager[AttemptFiles]:
        return attempt_files(attempt, self.location, self.cfg.quarantine_location)

    def write(self, spark: Any, ctx: TaskContext) -> TaskResults:
        return run_tasks(spark, ctx)

    def staged_rows(self, table: DeltaTable | None, files: Sequence[DataFile]) -> pa.Table:
        columns = table_columns(table if table is not None else open_table(self.location))
        return read_staging(self.location, files, self.cfg.table.partition_by, columns)

    def rows_of_keys(self, columns: pa.Schema) -> OldRows | None:
        key = self.cfg.write.key
        if any(column not in columns.names for column in key):
            return None

        def rows_of(keys: Sequence[Key]) -> dict[Key, dict[str, Any]]:
            predicate = keys_predicate(key, keys)
            if predicate is None:
                return {}
            return {tuple(row[c] for c in key): row for row in self.rows_where(predicate).to_pylist()}

        return rows_of

    def rows_where(self, predicate: str) -> pa.Table:
        """The table's rows for which `predicate` (SQL, DataFusion's dialect) holds."""
        return query(self.location, f"SELECT * FROM t WHERE {predicate}")

    def evolved_schema(self, table: DeltaTable, written: TaskFiles) -> pa.Schema | None:
        return evolved_schema(table, written)

    def commit_quarantine(
        self, plan: BatchPlan, bad: list[WrittenFile], attempt: str, run: Run, files: AttemptFiles
    ) -> None:
        cfg = self.cfg
        commit_quarantine(
            plan,
            bad,
            cfg.quarantine_location,
            attempt,
            run,
            files,
            cfg.maintenance.table_properties(),
            quarantine_schema(cfg),
        )

    def commit(
        self, decide: Decide, what: str, snapshot: DeltaTable | None = None, rewrites: bool = False
    ) -> Committed | Settled:
        return commit(self.location, decide, what, snapshot=snapshot, rewrites=rewrites)
