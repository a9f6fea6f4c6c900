"""Bad records go to the pipeline's quarantine table, committed once per offset, before the batch commit.

The quarantine commit carries its own per-partition `txn` offsets
(`offsetlake:P:quarantine:<topic>:<partition>` = end of what is quarantined), so
a retry after a crash between the quarantine commit and the batch commit adds
only what is not quarantined yet, and no record is ever quarantined twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from offsetlake.config import HEADERS_COLUMN
from offsetlake.errors import TableMissing
from offsetlake.formats.columns import QUARANTINE_SCHEMA
from offsetlake.protocol.commit import AttemptFiles, Change, Committed, Settled, add_actions, commit
from offsetlake.protocol.ledger import quarantine_app_id, txn_actions, txn_versions
from offsetlake.protocol.metadata import CommitMetadata, Run
from offsetlake.protocol.planning import BatchPlan
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import DataFile, from_delta_path, read_file, write_file
from offsetlake.table import check_schema, open_table


@dataclass(frozen=True)
class WrittenFile:
    range: OffsetRange  # the task range the file holds rows of
    file: DataFile


def commit_quarantine(
    plan: BatchPlan,
    bad: list[WrittenFile],
    location: Location,
    attempt: str,
    run: Run,
    files: AttemptFiles,
    properties: dict[str, str] | None = None,
    schema: pa.Schema = QUARANTINE_SCHEMA,
) -> None:
    """Commit the bad records of `plan` not quarantined yet; what it writes and commits goes into `files`.
    `schema`: the quarantine's (`columns.quarantine_schema`); a quarantine made before it kept headers
    gains the column in this commit.

    An attempt with no bad records commits nothing here: reading the same offsets again gives
    the same records, so no retry of it can have any to quarantine either."""
    if not plan.ranges or not bad:
        return

    def decide(table: DeltaTable) -> Change | Settled:
        app_ids = {(r.topic, r.partition): quarantine_app_id(plan.pipeline, r.topic, r.partition) for r in plan.ranges}
        versions = txn_versions(location, table, list(app_ids.values()))
        covered = {tp: versions[app_id] for tp, app_id in app_ids.items()}
        if all(done is not None and done >= plan.ends[tp] for tp, done in covered.items()):
            return Settled("already_committed", f"batch {plan.batch}: its bad records are quarantined already")
        adds = [
            f for w in bad if (f := _uncovered_part(location, w, covered[(w.range.topic, w.range.partition)], attempt))
        ]
        files.written[location] |= {f.path for f in adds}
        return Change(
            CommitMetadata(plan.pipeline, "quarantine", batch=plan.batch, attempt=attempt, run=run),
            actions=add_actions(adds),
            schema=schema,
            evolve=bool(adds) and _lacks_headers(table, schema),
            txns=txn_actions(
                plan.pipeline,
                None,
                {tp: max(plan.ends[tp], covered[tp] or 0) for tp in covered},
                prefix=quarantine_app_id,
            ),
        )

    outcome = commit(
        location,
        decide,
        f"batch {plan.batch} quarantine",
        open_=lambda u: open_quarantine(u, schema, properties),
    )
    if isinstance(outcome, Committed):
        files.kept[location] |= outcome.added_paths()


def open_quarantine(location: Location, schema: pa.Schema, properties: dict[str, str] | None = None) -> DeltaTable:
    """The quarantine table, created with `schema` if there is none, and checked against it. One made
    before the quarantine kept headers is checked without them: its next commit adds the column."""
    try:
        table = open_table(location, create=False)
    except TableMissing:
        return open_table(location, schema, properties=properties)
    check_schema(location, table, quarantine_schema_of(table, schema), [])
    return table


def quarantine_schema_of(table: DeltaTable, schema: pa.Schema) -> pa.Schema:
    """`schema`, or the columns it had before the quarantine kept headers if `table` is that old."""
    return QUARANTINE_SCHEMA if _lacks_headers(table, schema) else schema


def _lacks_headers(table: DeltaTable, schema: pa.Schema) -> bool:
    return HEADERS_COLUMN in schema.names and HEADERS_COLUMN not in [f.name for f in table.schema().fields]


def _uncovered_part(location: Location, written: WrittenFile, covered_to: int | None, attempt: str) -> DataFile | None:
    """The file, or a rewrite of its rows at or past `covered_to`, or None if all were quarantined before."""
    rng = written.range
    if covered_to is None or covered_to <= rng.start:
        return written.file
    if covered_to >= rng.end:
        return None
    rows = read_file(location, written.file.path)
    rows = rows.filter(pc.greater_equal(rows["kafka_offset"], covered_to))
    if rows.num_rows == 0:
        return None
    name = from_delta_path(written.file.path).replace(".parquet", f"-from{covered_to}.parquet")
    return write_file(location, name, rows, {})
