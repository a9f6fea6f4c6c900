"""The one commit path: every change offsetlake makes to a Delta table goes through `commit()`.

Ingest, quarantine, backfill, reset and restore (and maintenance and upserts to come)
each say only *what* to write, given a snapshot of the table. How it is written is
decided here, once:

1. Decide against one snapshot. `commit` opens the table and hands that snapshot to
   the caller's `decide`, which reads the ledger from it and returns either the
   `Change` to make or a `Settled` saying why nothing must be written. A table
   that another engine gave a Delta feature offsetlake cannot write (or, for a
   change that rewrites data files, deletion vectors) fails first, in one line
   (`table.check_writable`).
2. A write is refused exactly when `decide` refuses it. For a batch that is
   `verdict`: the ledger's batch number is at or past ours (a retry, a duplicate
   run, or a zombie that woke after its retry succeeded), or the ledger's offsets
   moved since we planned. Nothing is committed and the attempt's files go.
3. Commit without rebase (`max_commit_retries=0`): the data, the `txn` actions (the
   ledger) and `userMetadata` in one Delta commit, made against the exact snapshot
   we decided on. If anyone committed after that snapshot, Delta's put-if-absent of
   the next log entry fails us, and we go back to 1. Check-then-commit is atomic.
4. After `MAX_ATTEMPTS` conflicts: `CommitConflictError`, one line, nothing written.
5. Any error while committing leaves us unsure whether the commit landed: an object
   store that times out after the write, or one whose answer was lost after the write
   landed, so that the client's retry of the put meets its own log entry and reports a
   conflict. We look for this attempt's id in the newest commits before reporting
   failure or deciding again, so a landed commit is never taken for another writer's
   and clean-up never deletes a committed file. An error that is not a conflict by
   name, from a commit that did not land while the table moved past our snapshot,
   is taken for one (delta-rs can report a conflict as a log version it failed to read).
   A store error that may pass (a reset connection, a 503), from a commit that did not
   land, is decided again after a pause, until the table's `retry_seconds`.
6. An upsert (`Change.merge`) is a delta-rs MERGE with the same commit properties (txn actions,
   userMetadata, no rebase): delta-rs writes its files and the commit in one call. See upsert.py.
   A MERGE that changes no row makes no commit in delta-rs: the batch's offsets then commit
   alone, in a commit of nothing else, so the ledger still passes it.
7. A change that adds columns (`Change.evolve`: a registry record with a newer
   schema) must carry the table's new schema in the same commit. delta-rs writes a
   metaData action only through `write_deltalake(schema_mode="merge")`, which writes
   its own data files, so the attempt's files are read back and written through it
   (with the same txn actions, userMetadata and no rebase); the attempt's own files
   then go like any unreferenced file. Only the batch that brings a new column pays.

Files are written before the commit under names that carry the attempt id;
`attempt_files` removes the ones no landed commit references.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import msgspec
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Field as DeltaField
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from offsetlake.config import DELETED_COLUMN
from offsetlake.errors import CommitConflictError, OffsetlakeError, StorageError, TableError
from offsetlake.protocol.ledger import Ledger
from offsetlake.protocol.metadata import CommitMetadata
from offsetlake.protocol.planning import BatchPlan
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import Merge
from offsetlake.storage.hadoop_checksums import drop_stale_checksums
from offsetlake.storage.location import Location, despite_log_cleanup, is_transient
from offsetlake.storage.parquet import DataFile, conform, read_with_partitions
from offsetlake.table import (
    check_mergeable,
    check_row_rules,
    check_writable,
    delete_attempt_files,
    delete_files,
    open_table,
    store_refusal,
)

log = logging.getLogger("offsetlake.protocol.commit")
MAX_ATTEMPTS = 50  # conflicts with unrelated commits (OPTIMIZE, another writer); each retry decides again


@dataclass(frozen=True)
class Change:
    """What one commit writes, decided against one snapshot."""

    metadata: CommitMetadata  # must carry the attempt id (see step 5 above)
    actions: Sequence[AddAction | RemoveAction] = field(default_factory=list)
    txns: list[Transaction] = field(default_factory=list)  # the ledger: Delta `txn` actions
    schema: pa.Schema | None = None
    partition_by: list[str] = field(default_factory=list)
    restore_version: int | None = None  # a Delta RESTORE to this version instead of a write
    evolve: bool = False  # `schema` adds columns to the table: written with them in this commit (step 7)
    merge: Merge | None = None  # an upsert: this MERGE instead of `actions` (step 6)
    # A backfill on an engine that finds the rows itself (delta-spark: deletion vectors applied): the rows of
    # these offset ranges are removed, the files holding them written again without them, beside `actions`.
    replaces: tuple[OffsetRange, ...] = ()


@dataclass(frozen=True)
class Settled:
    """Nothing to write: why."""

    status: str  # already_committed | superseded | nothing_to_do
    reason: str = ""


@dataclass(frozen=True)
class Committed:
    version: int
    change: Change
    status: str = "committed"
    rewritten: frozenset[str] | None = None  # an evolving change: the files written in its place
    merged: dict[str, int] | None = None  # an upsert: the MERGE's rows inserted, updated, deleted
    replaced: dict[str, int] | None = None  # `Change.replaces`: the rows removed, the files rewritten

    def added_paths(self) -> set[str]:
        """The files this commit references: clean-up must keep them (an upsert's are delta-rs' own)."""
        if self.change.merge is not None:
            return set()
        if self.rewritten is not None:
            return set(self.rewritten)
        return {a.path for a in self.change.actions if isinstance(a, AddAction)}


Decide = Callable[[DeltaTable], "Change | Settled"]


def commit(
    location: Location,
    decide: Decide,
    what: str,
    open_: Callable[[Location], DeltaTable] = open_table,
    snapshot: DeltaTable | None = None,
    rewrites: bool = False,
) -> Committed | Settled:
    """Open -> decide -> commit without rebase; on a conflict, all again. See the module docstring.

    `snapshot`: a table object the caller has just loaded, used for the first decision instead of
    loading again (if it is stale, the commit fails on the conflict and the next try loads).
    `rewrites`: the change rewrites data files offsetlake reads as Parquet (optimize, backfill, repair)."""
    done = _decide_and_commit(location, decide, what, open_, snapshot, rewrites)
    if isinstance(done, Committed):
        drop_stale_checksums(location)  # delta-rs writes a checkpoint with every hundredth commit
    return done


def _decide_and_commit(
    location: Location,
    decide: Decide,
    what: str,
    open_: Callable[[Location], DeltaTable],
    snapshot: DeltaTable | None,
    rewrites: bool,
) -> Committed | Settled:
    conflicts, store_deadline, pause = 0, time.monotonic() + location.retry_seconds, 0.5
    for _ in range(MAX_ATTEMPTS):
        table, snapshot = snapshot or open_(location), None
        check_writable(location, table, what if rewrites else None)  # a feature another engine just enabled
        decided_on = table.version()
        change = decide(table)
        if isinstance(change, Settled):
            return change
        if conflicts:  # recorded in the commit itself: a metric of contention (the Airflow view shows it)
            change = replace(change, metadata=msgspec.structs.replace(change.metadata, conflicts=conflicts))
        if change.merge is not None or any(isinstance(a, AddAction) and a.data_change for a in change.actions):
            check_row_rules(location, table, what)  # a constraint another engine just added
        try:
            if change.merge is not None:
                check_mergeable(location, table, what)  # a property another engine just set
                return _apply_merge(table, change, change.merge)
            if change.evolve:
                return _apply_evolving(location, table, change)
            return Committed(_apply(table, change), change)
        except CommitFailedError as err:
            if "Unsupported table features" in str(err):  # enabled by another engine since check_writable
                raise TableError(f"{what}: table {location}: {err}; nothing was written") from err
            # The log entry was there already: another writer's, or our own whose answer the store lost
            # (the write landed, the connection dropped, the client's retry met its own put: step 5).
            version = landed_version(location, change.metadata.attempt)
            if version is not None:
                return Committed(version, change)
            log.info("%s: another commit landed first; deciding again", what)
            conflicts += 1
        except OSError as err:  # the object store, past its retries: after the did-it-land check
            version = landed_version(location, change.metadata.attempt)
            if version is not None:
                return Committed(version, change)
            if not is_transient(err) or time.monotonic() + pause > store_deadline:
                raise StorageError(f"{what}: the commit to {location} did not land: {store_refusal(err)}") from err
            # A store restarting reset the put's connection, which the object-store client does not retry
            # for a put. Ours did not land: deciding again is safe, within the table's retry_seconds.
            log.warning("%s: the commit did not land (%s); deciding again in %.1f s", what, store_refusal(err), pause)
            time.sleep(pause)
            pause = min(pause * 2, 10.0)
        except Exception as err:
            latest = _latest(location)  # one read of the log answers both: did ours land, did another's
            version = _landed_in(latest, change.metadata.attempt)
            if version is not None:
                return Committed(version, change)
            if latest.version() <= decided_on:
                raise
            # A conflict delta-rs reported as something else: its pre-commit check of the versions that
            # landed since our snapshot can fail to read one (`Invalid table version: N`, met by a MERGE
            # while an OPTIMIZE committed, in a chaos run). Ours did not land; deciding again is safe.
            log.info("%s: another commit landed first (%s); deciding again", what, err)
            conflicts += 1
    raise CommitConflictError(what, MAX_ATTEMPTS)


def _properties(change: Change) -> CommitProperties:
    """userMetadata, the ledger's txn actions, and no rebase: a commit lands on the snapshot decided on."""
    return CommitProperties(
        custom_metadata={"userMetadata": change.metadata.to_json()},
        max_commit_retries=0,
        app_transactions=change.txns or None,
    )


def _apply(table: DeltaTable, change: Change) -> int:
    properties = _properties(change)
    if change.restore_version is not None:
        table.restore(change.restore_version, commit_properties=properties)
        return table.version()  # restore, unlike a write transaction, moves the table object on
    assert change.schema is not None, "a write names the table's schema"  # every writer's Change does
    table.create_write_transaction(
        list(change.actions),
        mode="append",
        schema=change.schema,
        partition_by=change.partition_by or None,
        commit_properties=properties,
    )
    # No rebase: a successful commit is exactly the version after the snapshot we decided on.
    return table.version() + 1


def _apply_merge(table: DeltaTable, change: Change, merge: Merge) -> Committed:
    """Step 6: upsert the rows, delete the keys of the deleting ones; new columns (`evolve`) join the table."""
    decided_on = table.version()
    if merge.source.num_rows == 0 and merge.truncate:  # a TRUNCATE, nothing after it: the table emptied
        deleted = table.delete(commit_properties=_properties(change))
        merged = {"inserted": 0, "updated": 0, "deleted": int(deleted.get("num_deleted_rows", 0))}
        if table.version() == decided_on:  # an empty table: no commit was written, as for a no-op MERGE below
            return Committed(_apply(table, replace(change, merge=None, actions=[])), change, merged=merged)
        return Committed(decided_on + 1, change, merged=merged)
    if merge.source.num_rows == 0:  # a batch of tombstones only, say: nothing to merge (and its source may
        # lack the key columns, on a table whose columns come with its events); its offsets commit on their own
        return Committed(
            _apply(table, replace(change, merge=None, actions=[])),
            change,
            merged=dict.fromkeys(("inserted", "updated", "deleted"), 0),
        )
    if _add_join_columns(table, merge):
        decided_on += 1
    target = table.schema().to_arrow().names  # after the join columns: what the MERGE's target has
    merge = merge.for_target(target)
    keep = [DELETED_COLUMN]
    merging = table.merge(
        merge.source,
        merge.predicate(),
        source_alias="s",
        target_alias="t",
        merge_schema=change.evolve,
        commit_properties=_properties(change),
    ).when_matched_delete(merge.deletions())
    if merge.truncate:  # every row the source does not bring back was truncated
        merging = merging.when_not_matched_by_source_delete()
    elif merge.snapshot_ends:  # a snapshot ended: older rows it did not read are gone at the source
        merging = merging.when_not_matched_by_source_delete(merge.stale())
    if merge.unavailable_columns:  # a value the connector did not send keeps the target's: column by column
        columns = merge.source.column_names
        merging = merging.when_matched_update(merge.assignments(columns, target, keep_target=True), merge.updates())
        merging = merging.when_not_matched_insert(
            merge.assignments(columns, target, keep_target=False), f"NOT s.{DELETED_COLUMN}"
        )
    else:
        merging = merging.when_matched_update_all(merge.updates(), except_cols=keep)
        merging = merging.when_not_matched_insert_all(f"NOT s.{DELETED_COLUMN}", except_cols=keep)
    metrics = merging.execute()
    counts = {k: int(metrics.get(f"num_target_rows_{k}", 0)) for k in ("inserted", "updated", "deleted")}
    if table.version() == decided_on:
        # delta-rs (1.6.6) writes no commit at all for a MERGE that changes no row (a batch of tombstones of
        # absent keys, or of aborted records only), and the txn actions went with it: the ledger would never
        # pass the batch, and a stream would plan it again forever (found by a 200-fault chaos run). Its
        # offsets commit on their own, on the same snapshot.
        return Committed(_apply(table, replace(change, merge=None, actions=[])), change, merged=counts)
    return Committed(decided_on + 1, change, merged=counts)  # no rebase, as in _apply


def _add_join_columns(table: DeltaTable, merge: Merge) -> bool:
    """The key (and order_by) columns the table lacks, added (nullable) in a commit of their own: a table
    whose columns come with its events (format connect_json) has none before its first event, and a MERGE
    cannot join on a column its target lacks. Lands on the decided snapshot or not at all (no rebase), so
    no other writer's batch can slip in between the ledger's check and the MERGE. True if it committed."""
    present = set(table.schema().to_arrow().names)
    joined = [*merge.key, *([merge.order_by] if merge.order_by else [])]
    missing = [merge.source.schema.field(c).with_nullable(True) for c in joined if c not in present]
    if not missing:
        return False
    table.alter.add_columns(
        [DeltaField.from_arrow(f) for f in missing], commit_properties=CommitProperties(max_commit_retries=0)
    )
    return True


def _apply_evolving(location: Location, table: DeltaTable, change: Change) -> Committed:
    """Step 7: the change's files written again through write_deltalake with the wider schema."""
    if any(not isinstance(a, AddAction) for a in change.actions):
        raise OffsetlakeError(
            f"{change.metadata.kind} would add columns to the table while removing rows; "
            f"ingest the records that bring the columns first"
        )
    before = _file_paths(table)
    schema = change.schema
    assert schema is not None, "an evolving write names its wider schema"

    def batches() -> Iterator[pa.RecordBatch]:
        for action in change.actions:
            values = {c: (action.partition_values or {}).get(c) for c in change.partition_by}
            yield from conform(read_with_partitions(location, action.path, values, schema), schema).to_batches()

    decided_on = table.version()
    write_deltalake(
        table,
        pa.RecordBatchReader.from_batches(schema, batches()),
        mode="append",
        schema_mode="merge",
        partition_by=change.partition_by or None,
        commit_properties=_properties(change),
    )
    version = decided_on + 1  # no rebase, as in _apply
    after = location.delta_table(version)
    return Committed(
        version,
        change,
        rewritten=frozenset(_file_paths(after) - before),
    )


def _file_paths(table: DeltaTable) -> set[str]:
    return set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())


def _latest(location: Location) -> DeltaTable:
    """The table at its newest version, read from the store now."""
    return despite_log_cleanup(location.delta_table)


def landed_version(location: Location, attempt: str | None) -> int | None:
    """The version of this attempt's commit if it landed after all, else None."""
    return _landed_in(_latest(location), attempt) if attempt else None


def _landed_in(table: DeltaTable, attempt: str | None) -> int | None:
    """`landed_version`, in a table just read."""
    if not attempt:
        return None
    for entry in despite_log_cleanup(lambda: table.history(limit=MAX_ATTEMPTS)):
        meta = CommitMetadata.parse(entry.get("userMetadata"))
        if meta is not None and meta.attempt == attempt:
            return int(entry["version"])
    return None


def new_attempt_id() -> str:
    """Names one attempt's files and commits, so clean-up and crash checks can find them."""
    return uuid.uuid4().hex[:16]


@dataclass
class AttemptFiles:
    """The files one attempt wrote (`written`) and those a landed commit references (`kept`), per table."""

    written: dict[Location, set[str]]
    kept: dict[Location, set[str]]


@contextmanager
def attempt_files(attempt: str, *locations: Location) -> Iterator[AttemptFiles]:
    """On the way out, delete the attempt's files under each table except the `kept` ones.

    Normally that is exactly the `written` files not kept: a few deletes, whatever the table's
    size. After an error we may not know every file (a Spark job that failed half-way), so the
    table is searched for the attempt's id. Files a failed Spark task attempt wrote inside a job
    that then succeeded are never reported to the driver: `offsetlake cleanup` removes those."""
    files = AttemptFiles({location: set() for location in locations}, {location: set() for location in locations})
    try:
        yield files
    except BaseException:
        for location in locations:
            delete_attempt_files(location, attempt, keep=files.kept[location])
        raise
    for location in locations:
        delete_files(location, files.written[location] - files.kept[location])


def add_actions(files: list[DataFile]) -> list[AddAction]:
    return [AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in files]


def verdict(ledger: Ledger, plan: BatchPlan) -> Settled | None:
    """None when the plan may still commit against this ledger; otherwise why it must not."""
    if ledger.batch is not None and ledger.batch >= plan.batch:
        return Settled("already_committed", f"batch {plan.batch} is already committed (ledger at batch {ledger.batch})")
    seen = {tp: ledger.offsets.get(tp) for tp in plan.starts}
    if seen != plan.ledger_offsets:
        return Settled("superseded", "the ledger moved since this batch was planned")
    return None
