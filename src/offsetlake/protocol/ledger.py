"""The ledger: which batch and which offsets a pipeline has committed, read from the Delta table itself.

Table state (survives checkpoints and log clean-up) is held in Delta `txn`
actions: `offsetlake:P` = last committed batch number, and
`offsetlake:P:<topic>:<partition>` = next offset to read. Commit history holds
the same facts, readable by people, as JSON in each commit's `userMetadata`.

A Delta RESTORE brings back old data files but not old `txn` actions. So when a
RESTORE landed after the pipeline's last commit, the offsets are taken as of
the restored version (time travel) and the next commit writes them back.

Cost does not grow with the table's age: the `txn` state comes with the
snapshot (a checkpoint plus the commits after it), and history is read newest
first in growing pages only until what is needed is found -- for RESTORE
detection, the pipeline's last ledger commit, usually the newest commit.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable, Transaction
from deltalake.exceptions import DeltaError, TableNotFoundError

from offsetlake.errors import RewindOutOfReach
from offsetlake.kafka import TP
from offsetlake.protocol.metadata import CommitMetadata, HistoryEntry, Rewind, flat_offsets
from offsetlake.storage.delta_log import LEDGER_EXPIRING_PROPERTY, commit_actions, commit_exists, txn_versions_in
from offsetlake.storage.location import Location, despite_log_cleanup

MAX_RESTORE_CHAIN = 20
MAX_HISTORY_READS = 5  # re-read when a commit lands while we read the history
FIRST_PAGE = 8  # commits read first; each further page reads 4x more
Commit = dict[str, Any]  # one entry of delta-rs' history(): version, timestamp, operation, userMetadata...


def pipeline_app_id(pipeline: str) -> str:
    return f"offsetlake:{pipeline}"


def partition_app_id(pipeline: str, topic: str, partition: int) -> str:
    return f"offsetlake:{pipeline}:{topic}:{partition}"


def quarantine_app_id(pipeline: str, topic: str, partition: int) -> str:
    return f"offsetlake:{pipeline}:quarantine:{topic}:{partition}"


@dataclass
class Ledger:
    batch: int | None  # last committed batch number; None before the first commit
    offsets: dict[TP, int] = field(default_factory=dict)  # next offset to read
    table_version: int | None = None
    rewind: Rewind | None = None  # set when a RESTORE rewound the offsets and no commit has recorded it yet

    def next_batch(self) -> int:
        return (self.batch or 0) + 1


def read_ledger(location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    """The ledger as the next batch must see it, rewound if a RESTORE requires it.

    A version's ledger never changes (a RESTORE is a new version), so it is read once per
    version: the batch's commit re-checks the snapshot its plan read without reading again."""
    key = (table.table_uri, table.version(), pipeline, tuple(tps))
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get(key)
    if ledger is None:
        ledger = _read_ledger(location, table, pipeline, tps)
        with _LEDGERS_LOCK:
            _LEDGERS[key] = ledger
            while len(_LEDGERS) > MAX_CACHED_LEDGERS:
                _LEDGERS.pop(next(iter(_LEDGERS)))  # the oldest first
    return dataclasses.replace(ledger, offsets=dict(ledger.offsets))


MAX_CACHED_LEDGERS = 64
_LEDGERS: dict[tuple[str, int, str, tuple[TP, ...]], Ledger] = {}
_LEDGERS_LOCK = threading.Lock()


def pending_restore(location: Location, table: DeltaTable, pipeline: str) -> tuple[int, int] | None:
    """(restored version, RESTORE commit version) of a RESTORE no ledger commit has recorded yet, or None.
    Version 0 made the table: it has no history to read."""
    if table.version() == 0:
        return None
    history = commit_history(location, table, until=_ledger_commit_of(pipeline))
    return find_unrecorded_restore(history, pipeline, table.version(), location)


def ledger_in_txns(location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    """The ledger as the table's `txn` actions hold it, whatever a RESTORE since did to the rows."""
    return _txn_state(location, table, pipeline, tps)


def _read_ledger(location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    current = _txn_state(location, table, pipeline, tps)
    restore = pending_restore(location, table, pipeline)
    if restore is None:
        return current
    restored_version, restore_commit = restore
    try:
        restored = ledger_at(location, pipeline, tps, restored_version)
    except (TableNotFoundError, DeltaError) as err:
        raise RewindOutOfReach(
            f"table {location}: the RESTORE in version {restore_commit} took it back to version {restored_version}, "
            f"which the log no longer holds (log clean-up), and no commit recorded the ledger as of then: the "
            f"offsets to go on from are unknown; nothing was written. Set them with `offsetlake reset`"
        ) from err
    # Batch numbers never go back: a zombie of an old batch must still find its batch committed.
    return Ledger(
        batch=current.batch,
        offsets=restored.offsets,
        table_version=current.table_version,
        rewind=Rewind(restore_commit, restored_version, flat_offsets(current.offsets), flat_offsets(restored.offsets)),
    )


def ledger_at(location: Location, pipeline: str, tps: list[TP], version: int, depth: int = 1) -> Ledger:
    """The ledger as of `version`, following RESTOREs that version itself had not recorded."""
    table = location.delta_table(version)
    state = _txn_state(location, table, pipeline, tps)
    if depth >= MAX_RESTORE_CHAIN:
        return state
    history = commit_history(location, table, until=_ledger_commit_of(pipeline))
    restore = find_unrecorded_restore(history, pipeline, version, location)
    if restore is None:
        return state
    return ledger_at(location, pipeline, tps, restore[0], depth + 1)


def _ledger_commit_of(pipeline: str) -> Callable[[Commit], bool]:
    def found(entry: Commit) -> bool:
        meta = CommitMetadata.parse(entry.get("userMetadata"))
        return meta is not None and meta.pipeline == pipeline and meta.sets_ledger()

    return found


def commit_history(
    location: Location, table: DeltaTable, until: Callable[[Commit], bool] | None = None
) -> list[Commit]:
    """The table's commits up to the version `table` has loaded, newest first, truly numbered.

    Read in pages (8 commits, then 32, 128...) and only as far back as needed: up to and
    including the first commit for which `until(entry)` holds, or the oldest commit the log
    still holds. Without `until`, the whole log.

    delta-rs 1.6.6 numbers `history()` down from the version the object has loaded, so on a
    time-travelled or stale object every number is off (the chaos harness found a rewind to
    the wrong offsets this way). So we read from an object that is the latest version across
    the read -- the caller's, when no commit file follows its version -- and keep the commits
    up to `table`'s version.
    """
    for entries, complete in _pages(location, table, whole=until is None):
        for i, entry in enumerate(entries):
            if until is not None and until(entry):
                return entries[: i + 1]
        if complete:
            return entries
    raise AssertionError("unreachable: the last page is complete")


def _pages(location: Location, table: DeltaTable, whole: bool = False) -> Iterator[tuple[list[Commit], bool]]:
    """(newest commits up to `table`'s version, whether that is all the log holds), in growing pages."""
    limit = None if whole else FIRST_PAGE
    while True:
        page, complete = _latest_history(location, table, limit)
        yield [e for e in page if e["version"] <= table.version()], complete
        if complete or limit is None:  # without a limit the first page is the whole log
            return
        limit *= 4


def _latest_history(location: Location, table: DeltaTable, limit: int | None) -> tuple[list[Commit], bool]:
    """(the newest `limit` commits, whether that is all the log holds), truly numbered."""
    entries: list[Commit] = despite_log_cleanup(lambda: table.history(limit))
    if not _commit_after(location, table):  # checked after the read: the read saw no commit past `table`'s version
        return entries, limit is None or len(entries) < limit
    current = _latest(location)
    for _ in range(MAX_HISTORY_READS):
        entries = despite_log_cleanup(lambda: current.history(limit))  # noqa: B023 - called at once
        latest = _latest(location)
        if latest.version() == current.version():
            break
        current = latest
    return entries, limit is None or len(entries) < limit


def _latest(location: Location) -> DeltaTable:
    return despite_log_cleanup(location.delta_table)


def _commit_after(location: Location, table: DeltaTable) -> bool:
    """Is there a commit file after `table`'s version? One request (an object store's HEAD), not a table load."""
    return commit_exists(location, table.version() + 1)


def _txn_state(location: Location, table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    app_ids = {tp: partition_app_id(pipeline, *tp) for tp in tps}
    versions = txn_versions(location, table, [pipeline_app_id(pipeline), *app_ids.values()])
    offsets = {tp: version for tp, app_id in app_ids.items() if (version := versions[app_id]) is not None}
    return Ledger(versions[pipeline_app_id(pipeline)], offsets, table.version())


def txn_versions(location: Location, table: DeltaTable, app_ids: list[str]) -> dict[str, int | None]:
    """Each app id's `txn` version as `table`'s version holds it (None: never written).

    delta-rs replays the log for each app id asked: once per partition in every batch, and on an object
    store each replay reads the commits since the newest checkpoint again. The `txn` actions in the
    version's own commit are the newest of their app ids, so one read of that commit answers every app id
    it names -- a pipeline's batch commit names its batch and each of its partitions -- and delta-rs is asked
    for the others. Version 0's commit is the whole log. A table that expires `txn` actions (which
    `open_table` refuses, but another writer may set it since) is asked of delta-rs alone, which applies
    that setting."""
    version = table.version()
    named = None if LEDGER_EXPIRING_PROPERTY in table.metadata().configuration else _txns_of_commit(location, version)
    if named is None:
        return {app_id: table.transaction_version(app_id) for app_id in app_ids}
    return {
        app_id: named[app_id] if app_id in named else None if version == 0 else table.transaction_version(app_id)
        for app_id in app_ids
    }


def _txns_of_commit(location: Location, version: int) -> dict[str, int] | None:
    """{app id: version} of the `txn` actions commit `version` wrote; None when its file is gone."""
    actions = commit_actions(location, version)
    return None if actions is None else txn_versions_in(actions)


def find_unrecorded_restore(
    history: list[Commit], pipeline: str, version: int, location: Location | None = None
) -> tuple[int, int] | None:
    """(restored version, RESTORE commit version) of a RESTORE at or before `version` that is newer
    than the pipeline's last ledger commit. `history`: newest first, back to that commit at least."""
    is_ledger_commit = _ledger_commit_of(pipeline)
    for entry in history:
        if entry["version"] > version:
            continue
        if is_ledger_commit(entry):
            return None
        if entry.get("operation") == "RESTORE":
            return _restored_version(history, entry, location), entry["version"]
    return None


def _restored_version(history: list[Commit], entry: Commit, location: Location | None = None) -> int:
    """The version a RESTORE went back to: its parameter, or the newest commit at or before its timestamp
    (read further back in the log when `history` does not reach that far)."""
    params = entry.get("operationParameters") or {}
    version = params.get("version")
    if version not in (None, "null", ""):
        return int(version)
    target_ms = _to_epoch_ms(params.get("timestamp") or params.get("datetime"))

    def before_target(h: Commit) -> bool:
        return bool(h["version"] < entry["version"] and h["timestamp"] <= target_ms)

    if location is not None and not any(before_target(h) for h in history):
        history = commit_history(location, _latest(location), until=before_target)
    candidates = [h["version"] for h in history if before_target(h)]
    return int(max(candidates)) if candidates else 0


def _to_epoch_ms(value: Any) -> int:
    """delta-rs 1.6.6 records a timestamp RESTORE as epoch milliseconds in a string; others write ISO 8601."""
    if isinstance(value, (int, float)) or str(value).isdigit():
        return int(value)
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def pipeline_history(
    location: Location, table: DeltaTable, pipeline: str, limit: int | None = None, since_ms: int | None = None
) -> list[HistoryEntry]:
    """The pipeline's commits, oldest first: all of them, the newest `limit`, or those made since
    `since_ms` (epoch ms), reading the log no further back than that."""
    bounded = bool(limit) or since_ms is not None
    for entries, complete in _pages(location, table, whole=not bounded):
        rows = []
        for entry in entries:
            if since_ms is not None and entry["timestamp"] < since_ms:
                complete = True
                break
            meta = CommitMetadata.parse(entry.get("userMetadata"))
            if meta and meta.pipeline == pipeline:
                rows.append(HistoryEntry(entry["version"], entry["timestamp"], entry.get("operation"), meta))
        if complete or (limit and len(rows) >= limit):
            return rows[:limit][::-1]
    raise AssertionError("unreachable: the last page is complete")


def txn_actions(
    pipeline: str, batch: int | None, offsets: dict[TP, int], prefix: Callable[[str, str, int], str] = partition_app_id
) -> list[Transaction]:
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1000)
    actions = (
        [Transaction(app_id=pipeline_app_id(pipeline), version=batch, last_updated=now)] if batch is not None else []
    )
    actions += [
        Transaction(app_id=prefix(pipeline, t, p), version=o, last_updated=now) for (t, p), o in sorted(offsets.items())
    ]
    return actions
