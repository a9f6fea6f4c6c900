"""Delta table access on the driver (delta-rs). Never import this in executors.

delta-rs runs a tokio runtime that panics in a forked child, and Spark's
Python workers are forked: DeltaTable objects live on the driver only.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Set as AbstractSet

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError

from offsetlake.errors import StorageError, TableError, TableMissing, one_line
from offsetlake.formats.evolution import same_type
from offsetlake.storage.delta_log import LEDGER_EXPIRING_PROPERTY, commit_actions
from offsetlake.storage.location import Location, delete_if_there, despite_log_cleanup, retrying
from offsetlake.storage.parquet import from_delta_path, plain_types, to_delta_path

# The Delta writer features offsetlake writes tables with exactly, each enabled by delta-spark on an offsetlake
# table and ingested into in tests/integration/test_delta_spark.py (docs/concepts/delta-features.md). delta-rs,
# offsetlake's writer, refuses a commit to a table with any other (rowTracking, domainMetadata, clustering,
# typeWidening, identityColumns, inCommitTimestamp): offsetlake refuses before writing anything instead.
WRITABLE_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "timestampNtz",
        "columnMapping",
        "v2Checkpoint",
        "deletionVectors",
    }
)
# Features offsetlake's own file rewrites (optimize, backfill, repair) cannot honour: they read a data file
# as Parquet, so the rows a deletion vector deleted would come back.
NOT_REWRITABLE = frozenset({"deletionVectors"})


def open_table(
    location: Location,
    schema: pa.Schema | None = None,
    partition_by: list[str] | None = None,
    name: str | None = None,
    create: bool = True,
    properties: dict[str, str] | None = None,
    writer: str = "delta-rs",
) -> DeltaTable:
    """Open the table and check it; create it (empty, version 0, with `properties`) when asked and none exists.
    `writer`: the engine that will write it; delta-spark writes every table feature and keeps the table's
    rules for its rows itself, so only the columns are checked for it."""
    try:
        table = despite_log_cleanup(location.delta_table)
    except TableNotFoundError as err:
        if schema is None or not create:
            raise TableMissing(f"no Delta table at {location}") from err
        table = _create(location, schema, partition_by or [], name, properties)
    except OSError as err:
        raise TableError(f"cannot open Delta table at {location}: {err}") from err
    return _checked(location, table, schema, partition_by, writer)


def create_table(
    location: Location,
    schema: pa.Schema,
    partition_by: list[str] | None = None,
    name: str | None = None,
    properties: dict[str, str] | None = None,
) -> DeltaTable:
    """`open_table` for a caller that has just found no table there: created without loading it again (on an
    object store, a load that finds nothing is two requests). A table another writer made meanwhile is
    opened instead, and checked as `open_table` checks it."""
    return _checked(location, _create(location, schema, partition_by or [], name, properties), schema, partition_by)


def _checked(
    location: Location,
    table: DeltaTable,
    schema: pa.Schema | None,
    partition_by: list[str] | None,
    writer: str = "delta-rs",
) -> DeltaTable:
    if LEDGER_EXPIRING_PROPERTY in table.metadata().configuration:
        raise TableError(
            f"table {location} sets {LEDGER_EXPIRING_PROPERTY}: Delta would expire the offsets "
            f"offsetlake keeps in it (its txn actions); unset that property to use the table"
        )
    if schema is not None and writer == "delta-rs":  # a writer's open: refused here, before its tasks write a file
        check_writable(location, table)
        check_row_rules(location, table)
    if schema is not None:
        check_schema(location, table, schema, partition_by or [])
    return table


def check_writable(location: Location, table: DeltaTable, rewrite: str | None = None) -> None:
    """Fail in one line if the table uses a Delta feature offsetlake cannot write with (`rewrite`: the name
    of an operation that rewrites data files, which also refuses NOT_REWRITABLE features)."""
    features = set(table.protocol().writer_features or ())
    unknown = sorted(features - WRITABLE_FEATURES)
    if unknown:
        pronoun = "them" if len(unknown) > 1 else "it"
        raise TableError(
            f"table {location} uses the Delta table feature{'s' * (len(unknown) > 1)} {', '.join(unknown)}, which "
            f"the delta-rs engine cannot write; nothing was written. `table.engine: delta-spark` ingests into it, "
            f"backfills, repairs, maintains and restores it (delta-spark writes {pronoun}); `offsetlake reset` "
            f"does not yet"
        )
    _check_columns_stored_under_their_names(location, table)  # also on a legacy protocol, which lists no features
    unrewritable = sorted(features & NOT_REWRITABLE) if rewrite else []
    if unrewritable:
        raise TableError(
            f"table {location} uses the Delta table feature {', '.join(unrewritable)}, and {rewrite} would bring back "
            f"rows it deleted; nothing was written. `table.engine: delta-spark` optimizes and backfills it "
            f"(delta-spark applies the deletion vectors), or compact it in Spark (OPTIMIZE)"
        )


def check_row_rules(location: Location, table: DeltaTable, what: str | None = None) -> None:
    """Fail in one line if the table declares a rule for its rows that offsetlake's writes do not keep: a
    CHECK constraint, a generated column or a column invariant. offsetlake writes its own data files and
    commits them, so Delta would not check or compute them, and a record breaking the rule would land;
    through a MERGE (upsert), delta-rs would check it, and one such record would fail every batch. Called
    before a write that adds rows (ingest, upsert, backfill, repair), not before optimize or vacuum."""
    where = f"{what}: table {location}" if what else f"table {location}"
    constraints = sorted(
        (key.removeprefix("delta.constraints."), rule)
        for key, rule in table.metadata().configuration.items()
        if key.startswith("delta.constraints.")
    )
    if constraints:
        name, rule = constraints[0]
        raise TableError(
            f"{where} has the CHECK constraint {name} ({rule}), which offsetlake does not check "
            f"records against; nothing was written. Drop it (ALTER TABLE ... DROP CONSTRAINT {name}) or write "
            f"to a table without it"
        )
    for path, field in _fields(pa.schema(table.schema())):
        generated = _field_metadata(field, "delta.generationExpression")
        if generated is not None:
            raise TableError(
                f"{where} column {path!r} is generated ({generated}), which offsetlake does not "
                f"compute; nothing was written. Write to a table without generated columns"
            )
        if _field_metadata(field, "delta.invariants") is not None:
            raise TableError(
                f"{where} column {path!r} has an invariant, which offsetlake does not check "
                f"records against; nothing was written. Write to a table without column invariants"
            )


def check_mergeable(location: Location, table: DeltaTable, what: str) -> None:
    """Fail in one line if an upsert's MERGE cannot be written to the table: an append-only table allows
    no update or delete."""
    settings = table.metadata().configuration
    if settings.get("delta.appendOnly", "").lower() == "true":
        raise TableError(
            f"{what}: table {location} sets delta.appendOnly, and an upsert updates and deletes rows; nothing was "
            f"written. Unset it (ALTER TABLE ... SET TBLPROPERTIES ('delta.appendOnly' = 'false')) or append"
        )


def _check_columns_stored_under_their_names(location: Location, table: DeltaTable) -> None:
    """Column mapping lets a column's files name it otherwise (`col-<uuid>`: a column added, or renamed,
    once mapping is on; every column of a table created with it). offsetlake writes and compacts data files
    under column names, so readers would find such a column null in them: refused, naming the column. A
    table that turned mapping on later keeps its columns' names, and works."""
    for path, field in _fields(pa.schema(table.schema())):
        stored = _field_metadata(field, "delta.columnMapping.physicalName")
        if stored is not None and stored != field.name:
            raise TableError(
                f"table {location} column {path!r} is stored in its data files as {stored!r} (Delta column mapping: "
                f"added or renamed after mapping was on), which offsetlake cannot read or write; nothing was "
                f"written. Write to a table whose columns are stored under their own names"
            )


def _fields(fields, prefix: str = ""):
    """(dotted path, field) for every field of a schema, nested ones too (struct fields, list items, map keys
    and values)."""
    for field in fields:
        path = f"{prefix}{field.name}"
        yield path, field
        kind = field.type
        if pa.types.is_struct(kind):
            yield from _fields(list(kind), f"{path}.")
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            yield from _fields([kind.value_field], f"{path}.")
        elif pa.types.is_map(kind):
            yield from _fields([kind.key_field, kind.item_field], f"{path}.")


def _field_metadata(field: pa.Field, key: str) -> str | None:
    value = (field.metadata or {}).get(key.encode())
    return value.decode() if value else None


def check_store(location: Location, what: str = "table") -> None:
    """Fail in one line if an object-store location cannot be listed, before a Spark session starts and
    before anything is written. A refusal (a wrong bucket, region or credential: 3xx/4xx) fails at once.
    An endpoint that does not answer, or answers 5xx, may be a wrong endpoint or a store restarting
    (found by the S3 chaos run: a job started while the store was away for 2 s failed here); it is asked
    again, with backoff, for the table's `retry_seconds` (as every other call on the table) before failing."""
    if not location.is_object_store:
        local = location.uri.removeprefix("file://")
        if os.path.exists(local) and not os.path.isdir(local):
            raise StorageError(f"{what} {location} is a file, not a directory: a Delta table is a directory")
        return
    options = {**(location.storage_options or {}), "max_retries": "2", "retry_timeout": "5s"}
    bound = location.retry_seconds
    deadline, pause = time.monotonic() + bound, 0.5
    while True:
        try:
            DeltaTable.is_deltatable(location.uri, options)
            return
        except OSError as err:
            reason = store_refusal(err)
            refused = re.match(r"[34]\d\d ", reason) is not None
            if refused or time.monotonic() + pause > deadline:
                waited = "" if refused else f" (for {bound:.0f} s: table.retry_seconds)"
                raise StorageError(f"{what} {location}: the object store refused to list it: {reason}{waited}") from err
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


def store_refusal(err: Exception) -> str:
    """delta-rs' nested object-store error, as the one reason a user can act on."""
    text = one_line(err)
    status = re.search(r"\b([45]\d\d) ([A-Z][A-Za-z ]*[a-z])", text)
    if status:
        code = status.group(1)
        hint = {"404": "no such bucket", "403": "access denied: check the credentials", "301": "wrong region"}
        return f"{code} {status.group(2)}" + (f" ({hint[code]})" if code in hint else "")
    endpoint = re.search(r"(https?://[^/\s]+)", text)
    if re.search(r"error sending request|connect|dns error|timed out", text, re.IGNORECASE):
        return f"cannot reach the endpoint {endpoint.group(1) if endpoint else ''}".rstrip()
    return text[:300]


def _create(
    location: Location, schema: pa.Schema, partition_by: list[str], name: str | None, properties: dict[str, str] | None
) -> DeltaTable:
    """Version 0 of a new table. Asked again while the store's answer may change (a store restarting resets
    the put's connection, which the object-store client does not retry): `mode="ignore"` makes a repeat
    safe, as a first put that did land leaves a table the next try opens instead of creating."""

    def create() -> DeltaTable:
        return DeltaTable.create(
            location.uri,
            schema,
            mode="ignore",
            partition_by=partition_by or None,
            name=name,
            configuration=properties or None,
            storage_options=location.storage_options,
        )

    try:
        return retrying(location, create, errors=(OSError, DeltaError))
    except (OSError, DeltaError) as err:  # not writable, not a directory, no such bucket...
        raise TableError(f"cannot create Delta table at {location}: {err}") from err


def check_schema(location: Location, table: DeltaTable, expected: pa.Schema, partition_by: list[str]) -> None:
    """The table must hold the pipeline's columns, types and partitioning. A schema marked OPEN_PAYLOAD
    (registry formats) names only some columns: the payload columns may be any. Any other column is a
    user's (`ALTER TABLE ... ADD COLUMNS` in Spark): rows the pipeline writes leave it null, so it must be
    nullable. Commits keep it, and compaction carries its values over."""
    from offsetlake.formats.columns import OPEN_PAYLOAD

    open_payload = (expected.metadata or {}).items() >= OPEN_PAYLOAD.items()
    actual = pa.schema(table.schema())
    have = {f.name: f.type for f in actual}
    for f in expected:
        if f.name not in have:
            raise TableError(f"table {location} has no column {f.name!r} that the pipeline writes")
        if not same_type(have[f.name], f.type):
            raise TableError(f"table {location} column {f.name!r} is {have[f.name]}, the pipeline writes {f.type}")
    written = {f.name for f in expected}
    required = sorted(f.name for f in actual if f.name not in written and not f.nullable)
    if required and not open_payload:
        raise TableError(
            f"table {location} has column {required[0]!r} NOT NULL, which the pipeline does not write: "
            f"make it nullable (ALTER TABLE ... ALTER COLUMN {required[0]} DROP NOT NULL) or drop it"
        )
    if list(table.metadata().partition_columns) != list(partition_by):
        raise TableError(
            f"table {location} is partitioned by {table.metadata().partition_columns}, the pipeline says {partition_by}"
        )


def delete_attempt_files(location: Location, attempt: str, keep: AbstractSet[str] = frozenset()) -> int:
    """Remove the files this attempt wrote (its id is in each name) except the committed ones in `keep`."""
    fs, root = location.filesystem()
    prefix = root.rstrip("/") + "/"

    def delete() -> int:  # listed and deleted again as a whole if the store fails: deleting is idempotent
        removed = 0
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type != pafs.FileType.File or f"-{attempt}-" not in info.base_name or "_delta_log" in info.path:
                continue
            if to_delta_path(info.path.removeprefix(prefix)) not in keep:
                delete_if_there(fs, info.path)
                removed += 1
        return removed

    return retrying(location, delete)


def delete_files(location: Location, paths: set[str]) -> None:
    """Delete these files (Delta paths, relative to the table) if they exist."""
    fs, root = location.filesystem()
    for path in paths:
        full = f"{root.rstrip('/')}/{from_delta_path(path)}"
        retrying(location, lambda: delete_if_there(fs, full))  # noqa: B023 -- called at once, within the loop


def query(location: Location, sql: str) -> pa.Table:
    """Run SQL over the table (registered as `t`) with delta-rs' DataFusion engine.

    Used instead of DeltaTable.to_pyarrow_dataset(), whose Rust-backed file system
    aborts the interpreter at exit now and then (docs/development/measurements.md).
    """
    result = pa.table(QueryBuilder().register("t", open_table(location)).execute(sql).read_all())
    return plain_types(result)


def files_added_in(location: Location, version: int) -> set[str] | None:
    """Paths (relative, as on disk) of the data files one commit added; None once log clean-up removed its
    entry (the newest checkpoint holds the table's state, not which commit added what)."""
    actions = commit_actions(location, version)
    return None if actions is None else {from_delta_path(a["add"]["path"]) for a in actions if "add" in a}


def committed_files(location: Location) -> set[str]:
    """Paths (relative, as on disk) of the data files the current table version references."""
    actions = pa.table(open_table(location).get_add_actions(flatten=True))
    return {from_delta_path(p) for p in actions.column("path").to_pylist()}
