"""The ledger: which batch and which offsets a pipeline has committed, read from the Delta table itself.

Table state (survives checkpoints and log clean-up) is held in Delta `txn`
actions: `offsetlake:P` = last committed batch number, and
`offsetlake:P:<topic>:<partition>` = next offset to read. Commit history holds
the same facts, readable by people, as JSON in each commit's `userMetadata`.

A Delta RESTORE brings back old data files but not old `txn` actions. So when a
RESTORE landed after the pipeline's last commit, the offsets are taken as of
the restored version (time travel) and the next commit writes them back.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from deltalake import DeltaTable, Transaction

from offsetlake.kafka import TP
from offsetlake.metadata import CommitMetadata, HistoryEntry, Rewind, flat_offsets

MAX_RESTORE_CHAIN = 20
MAX_HISTORY_READS = 5  # re-read when a commit lands while we read the history


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


def read_ledger(table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    """The ledger as the next batch must see it, rewound if a RESTORE requires it."""
    current = _txn_state(table, pipeline, tps)
    history = commit_history(table)
    restore = find_unrecorded_restore(history, pipeline, table.version())
    if restore is None:
        return current
    restored_version, restore_commit = restore
    restored = ledger_at(table.table_uri, pipeline, tps, restored_version, history=history)
    # Batch numbers never go back: a zombie of an old batch must still find its batch committed.
    return Ledger(
        batch=current.batch,
        offsets=restored.offsets,
        table_version=current.table_version,
        rewind=Rewind(restore_commit, restored_version, flat_offsets(current.offsets), flat_offsets(restored.offsets)),
    )


def ledger_at(uri: str, pipeline: str, tps: list[TP], version: int, depth: int = 1,
              history: list[dict] | None = None) -> Ledger:
    """The ledger as of `version`, following RESTOREs that version itself had not recorded."""
    table = DeltaTable(uri, version=version)
    state = _txn_state(table, pipeline, tps)
    if depth >= MAX_RESTORE_CHAIN:
        return state
    history = history if history is not None else commit_history(DeltaTable(uri))
    restore = find_unrecorded_restore(history, pipeline, version)
    if restore is None:
        return state
    return ledger_at(uri, pipeline, tps, restore[0], depth + 1, history)


def commit_history(table: DeltaTable) -> list[dict]:
    """The table's commits up to the version `table` has loaded, newest first, truly numbered.

    delta-rs 1.6.6 lists every commit in the log from `history()` but numbers them down
    from the version the object has loaded: on a time-travelled or stale object every
    number is off (the chaos harness found a rewind to the wrong offsets this way). So we
    read the history from an object at the latest version, checked unchanged across the
    read, and keep the commits up to `table`'s version. The caller's object usually is the
    latest: then one extra load, to check, is all it costs.
    """
    current = table
    for _ in range(MAX_HISTORY_READS):
        entries = current.history()
        latest = DeltaTable(table.table_uri)
        if latest.version() == current.version():
            break
        current = latest
    return [e for e in entries if e["version"] <= table.version()]


def _txn_state(table: DeltaTable, pipeline: str, tps: list[TP]) -> Ledger:
    offsets = {}
    for topic, partition in tps:
        version = table.transaction_version(partition_app_id(pipeline, topic, partition))
        if version is not None:
            offsets[(topic, partition)] = version
    return Ledger(table.transaction_version(pipeline_app_id(pipeline)), offsets, table.version())


def find_unrecorded_restore(history: list[dict], pipeline: str, version: int) -> tuple[int, int] | None:
    """(restored version, RESTORE commit version) of a RESTORE at or before `version` that is newer
    than the pipeline's last ledger commit."""
    for entry in history:  # newest first
        if entry["version"] > version:
            continue
        meta = CommitMetadata.parse(entry.get("userMetadata"))
        if meta and meta.pipeline == pipeline and meta.sets_ledger():
            return None
        if entry.get("operation") == "RESTORE":
            return _restored_version(history, entry), entry["version"]
    return None


def _restored_version(history: list[dict], entry: dict) -> int:
    params = entry.get("operationParameters") or {}
    version = params.get("version")
    if version not in (None, "null", ""):
        return int(version)
    stamp = params.get("timestamp") or params.get("datetime")
    target_ms = _to_epoch_ms(stamp)
    candidates = [h["version"] for h in history if h["version"] < entry["version"] and h["timestamp"] <= target_ms]
    return max(candidates) if candidates else 0


def _to_epoch_ms(value) -> int:
    """delta-rs 1.6.6 records a timestamp RESTORE as epoch milliseconds in a string; others write ISO 8601."""
    if isinstance(value, (int, float)) or str(value).isdigit():
        return int(value)
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return int(parsed.timestamp() * 1000)


def pipeline_history(table: DeltaTable, pipeline: str) -> list[HistoryEntry]:
    """The pipeline's commits, oldest first."""
    rows = []
    for entry in reversed(commit_history(table)):
        meta = CommitMetadata.parse(entry.get("userMetadata"))
        if meta and meta.pipeline == pipeline:
            rows.append(HistoryEntry(entry["version"], entry["timestamp"], entry.get("operation"), meta))
    return rows


def txn_actions(pipeline: str, batch: int | None, offsets: dict[TP, int], prefix=partition_app_id) -> list[Transaction]:
    now = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    actions = [Transaction(app_id=pipeline_app_id(pipeline), version=batch, last_updated=now)] if batch is not None else []
    actions += [Transaction(app_id=prefix(pipeline, t, p), version=o, last_updated=now)
                for (t, p), o in sorted(offsets.items())]
    return actions
