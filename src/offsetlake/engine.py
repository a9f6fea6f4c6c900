"""The seam every batch's commit goes through: one interface, one implementation per commit engine.

A batch asks its engine to open the table (creating it when asked), to read the ledger the plan is made
against, to write the batch's rows, and to commit them together with the ledger and the commit's metadata
in one table version -- or to refuse, in one line, a table the engine cannot write. Whatever the engine,
the ledger's format (txn actions and `userMetadata`, `protocol.ledger`) is the same, so a table written by
one engine is read, planned and audited by any.

`DeltaRs` is offsetlake's own commit path (`protocol.commit`: delta-rs, the rows written as Parquet by the
Spark tasks and committed as add actions; upserts as a delta-rs MERGE). A pipeline's engine comes from
`engine_for`.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake.config import PipelineConfig
from offsetlake.kafka import TP
from offsetlake.protocol.commit import Committed, Decide, Settled, commit
from offsetlake.protocol.ledger import Ledger, read_ledger
from offsetlake.read.tasks import TaskContext, TaskResults
from offsetlake.read_job import run_tasks
from offsetlake.storage.location import Location
from offsetlake.table import check_writable, open_table


class CommitEngine(Protocol):
    """What a batch needs of the engine that commits it."""

    name: str

    def open(
        self,
        location: Location,
        schema: pa.Schema | None = None,
        partition_by: list[str] | None = None,
        name: str | None = None,
        *,
        create: bool = True,
        properties: dict[str, str] | None = None,
    ) -> DeltaTable:
        """The table, checked against `schema`; created (empty) when missing and `create`."""
        ...

    def ledger(self, location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
        """The pipeline's ledger as of `table`'s version: what the next plan starts from."""
        ...

    def write(self, spark: Any, ctx: TaskContext) -> TaskResults:
        """The batch's rows read from Kafka and written where the commit can add them."""
        ...

    def commit(
        self, location: Location, decide: Decide, what: str, *, snapshot: DeltaTable | None = None
    ) -> Committed | Settled:
        """`decide` against the newest table, and its change committed with the ledger in one version; on a
        conflict, decided again; `Settled` when `decide` refuses (the batch was committed already)."""
        ...

    def refuse(self, location: Location, table: DeltaTable, rewrite: str | None = None) -> None:
        """Raise, in one line, if the engine cannot write this table (`rewrite`: an operation that rewrites
        data files)."""
        ...


class DeltaRs:
    """delta-rs: offsetlake's own commit path."""

    name = "delta-rs"

    def open(
        self,
        location: Location,
        schema: pa.Schema | None = None,
        partition_by: list[str] | None = None,
        name: str | None = None,
        *,
        create: bool = True,
        properties: dict[str, str] | None = None,
    ) -> DeltaTable:
        return open_table(location, schema, partition_by, name, create=create, properties=properties)

    def ledger(self, location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
        return read_ledger(location, table, pipeline, tps)

    def write(self, spark: Any, ctx: TaskContext) -> TaskResults:
        return run_tasks(spark, ctx)

    def commit(
        self, location: Location, decide: Decide, what: str, *, snapshot: DeltaTable | None = None
    ) -> Committed | Settled:
        return commit(location, decide, what, snapshot=snapshot)

    def refuse(self, location: Location, table: DeltaTable, rewrite: str | None = None) -> None:
        check_writable(location, table, rewrite)


DELTA_RS = DeltaRs()


def engine_for(cfg: PipelineConfig) -> CommitEngine:
    """The engine that commits `cfg`'s table."""
    return DELTA_RS
