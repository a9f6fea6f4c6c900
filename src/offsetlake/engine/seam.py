"""The seam a pipeline table's batches go through: one interface, one implementation per commit engine.

A batch asks its table's engine to open the table (created when missing, checked against the pipeline's
columns), to read the ledger the plan is made against, to write the batch's rows, to read back an upsert
batch's staged rows and the table's rows of some keys, to commit the bad records and then the rows with
the ledger and the commit's metadata in one table version -- or to refuse, in one line, a table it cannot
write. Whatever the engine, the ledger's format (txn actions and `userMetadata`, `protocol.ledger`) is the
same, so a table written by one engine is read, planned and audited by any.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake.kafka import TP
from offsetlake.protocol.commit import AttemptFiles, Committed, Decide, Settled
from offsetlake.protocol.key_changes import OldRows
from offsetlake.protocol.ledger import Ledger
from offsetlake.protocol.metadata import Run
from offsetlake.protocol.planning import BatchPlan
from offsetlake.protocol.quarantine import WrittenFile
from offsetlake.read.tasks import TaskContext, TaskResults
from offsetlake.read_job import TaskFiles
from offsetlake.storage.parquet import DataFile

Snapshot = DeltaTable  # the table at one version, as its engine loaded it: what a batch decides against


class CommitEngine(Protocol):
    """What a batch needs of the engine that commits its pipeline table."""

    name: str

    @property
    def schema(self) -> pa.Schema:
        """The columns the pipeline writes (registry formats: those its file names)."""
        ...

    def open(self) -> DeltaTable:
        """The table, checked against the pipeline; created (empty) when missing."""
        ...

    def existing(self) -> DeltaTable:
        """The table as it is, unchecked; TableError (TableMissing) when there is none."""
        ...

    def columns(self, table: DeltaTable) -> pa.Schema:
        """The table's columns now, as the tasks build rows in."""
        ...

    def ledger(self, table: DeltaTable, tps: list[TP]) -> Ledger:
        """The pipeline's ledger as of `table`'s version: what the next plan starts from."""
        ...

    def attempt(self, attempt: str) -> AbstractContextManager[AttemptFiles]:
        """The files one attempt writes, in the table and its quarantine: on the way out, those no landed
        commit references are deleted."""
        ...

    def write(self, spark: Any, ctx: TaskContext) -> TaskResults:
        """The batch's rows read from Kafka and written where the commit can add them."""
        ...

    def staged_rows(self, table: DeltaTable | None, files: Sequence[DataFile]) -> pa.Table:
        """An upsert batch's rows as its tasks staged them, typed as the table's columns."""
        ...

    def rows_of_keys(self, columns: pa.Schema) -> OldRows | None:
        """The table's rows of given keys (the old rows of key changes); None when it has no key column yet."""
        ...

    def evolved_schema(self, table: DeltaTable, written: TaskFiles) -> pa.Schema | None:
        """The table's schema with the columns the rows add, when they add any."""
        ...

    def commit_quarantine(
        self, plan: BatchPlan, bad: list[WrittenFile], attempt: str, run: Run, files: AttemptFiles
    ) -> None:
        """The batch's bad records not quarantined yet, committed to the quarantine table."""
        ...

    def commit(
        self, decide: Decide, what: str, snapshot: DeltaTable | None = None, rewrites: bool = False
    ) -> Committed | Settled:
        """`decide` against the newest table, and its change committed with the ledger in one version; on a
        conflict, decided again; `Settled` when `decide` refuses (the batch was committed already).
        `rewrites`: the change writes again rows the table holds (backfill, repair), which an engine that
        reads data files as Parquet cannot do on a table with deletion vectors."""
        ...
