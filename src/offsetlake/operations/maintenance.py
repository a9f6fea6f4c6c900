"""Operator actions: clean up orphaned files, vacuum, checkpoint; reset the ledger, restore the table with its
ledger."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties

from offsetlake.config import PipelineConfig
from offsetlake.errors import ConfigError, OffsetlakeError, RewindOutOfReach
from offsetlake.formats.columns import table_schema
from offsetlake.kafka import TP, KafkaCluster
from offsetlake.protocol.commit import Change, Committed, Decide, Settled, commit, new_attempt_id
from offsetlake.protocol.ledger import ledger_at, ledger_in_txns, pending_restore, read_ledger, txn_actions
from offsetlake.protocol.metadata import CommitMetadata, Offsets, Run, flat_offsets, unflat_offsets
from offsetlake.storage.hadoop_checksums import drop_stale_checksums
from offsetlake.storage.location import Location, delete_if_there, retrying
from offsetlake.storage.parquet import from_delta_path
from offsetlake.table import open_table

if TYPE_CHECKING:
    from deltalake import DeltaTable

DEFAULT_CLEANUP_AGE_SECONDS = 3600  # older than any batch in flight: a batch writes and commits within minutes
LOG_READ_ATTEMPTS = 20  # reads of the whole log, each after log clean-up removed an entry it listed


@dataclass
class CleanupResult:
    table: Location
    deleted: list[str]
    kept_recent: int
    dry_run: bool

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"{self.table}: {verb} {len(self.deleted)} orphaned files; kept {self.kept_recent} unreferenced "
            f"files younger than the safety window (a batch may still be writing them)"
        )


def referenced_files(location: Location) -> set[str]:
    """Every data file any commit still in the log (or its checkpoint) adds or removes (time travel may need
    it), and the change data files (`cdc`) of an upsert table's MERGEs: the change feed reads them."""
    fs, root = location.filesystem()
    log_dir = f"{root.rstrip('/')}/_delta_log"

    def read_log() -> set[str] | None:  # read again as a whole if the store fails part way
        paths: set[str] = set()
        for info in fs.get_file_info(pafs.FileSelector(log_dir, allow_not_found=True)):
            try:
                paths.update(_files_named_in(fs, info))
            except FileNotFoundError:
                return None  # log clean-up removed it since the listing (found by a 200-fault chaos run)
        return paths

    # An entry that vanished was older than a checkpoint written before it went, which may not have been
    # listed yet: its live files are named only there, so the log is listed and read again, never skipped.
    for _ in range(LOG_READ_ATTEMPTS):
        paths = retrying(location, read_log)
        if paths is not None:
            return paths
    raise OffsetlakeError(f"{location}: the log changed under every one of {LOG_READ_ATTEMPTS} reads; run it again")


def _files_named_in(fs, info) -> set[str]:
    """The data files a log entry or a checkpoint names (none for any other file of the log)."""
    if info.base_name.endswith(".json") and info.base_name[:20].isdigit():
        paths: set[str] = set()
        with fs.open_input_stream(info.path) as stream:
            for line in stream.read().decode().splitlines():
                action = json.loads(line) if line.strip() else {}
                paths.update(from_delta_path(action[k]["path"]) for k in ("add", "remove", "cdc") if k in action)
        return paths
    if ".checkpoint" in info.base_name and info.base_name.endswith(".parquet"):
        adds = pq.read_table(info.path, filesystem=fs, columns=["add"]).column("add").to_pylist()
        return {from_delta_path(a["path"]) for a in adds if a}
    return set()


def cleanup(
    location: Location, older_than_seconds: int = DEFAULT_CLEANUP_AGE_SECONDS, dry_run: bool = False
) -> CleanupResult:
    """Delete files under the table that no commit references and that are older than the window."""
    if older_than_seconds < 60:
        raise ConfigError(
            "cleanup safety window must be at least 60 seconds: younger files may belong to a batch in flight"
        )
    open_table(location)  # fail clearly if there is no table here
    fs, root = location.filesystem()
    prefix = root.rstrip("/") + "/"
    referenced = referenced_files(location)
    cutoff = time.time() - older_than_seconds
    deleted, recent = [], 0
    for info in retrying(location, lambda: fs.get_file_info(pafs.FileSelector(root, recursive=True))):
        rel = info.path.removeprefix(prefix)
        if info.type != pafs.FileType.File or rel.startswith("_delta_log/") or not rel.endswith(".parquet"):
            continue
        if rel in referenced:
            continue
        if info.mtime and info.mtime.timestamp() > cutoff:
            recent += 1
            continue
        if not dry_run:
            retrying(location, lambda: delete_if_there(fs, info.path))  # noqa: B023 -- called at once
        deleted.append(rel)
    return CleanupResult(location, sorted(deleted), recent, dry_run)


MIN_VACUUM_RETENTION_HOURS = DEFAULT_CLEANUP_AGE_SECONDS // 3600  # never below the clean-up safety window


@dataclass
class VacuumResult:
    table: Location
    deleted: list[str]
    retention_hours: int
    dry_run: bool

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"{self.table}: {verb} {len(self.deleted)} data files that no version of the last "
            f"{self.retention_hours} h needs"
        )


def vacuum(
    location: Location, pipeline: str, retention_hours: int | None = None, dry_run: bool = False, run: Run | None = None
) -> VacuumResult:
    """Delete data files that no version inside the retention needs.

    A file stays while the current version uses it, while its removal is younger than the
    retention (time travel and RESTORE to any version inside it still work), and while it was
    written less than the retention ago (an attempt in flight). Everything else under the
    table goes: delta-rs' "full" vacuum. The "lite" one reads only the tombstones, and a
    checkpoint drops tombstones older than delta.deletedFileRetentionDuration, so it would
    miss every file removed before the newest checkpoint (a stream checkpoints every few
    minutes): the table would keep them forever. The retention defaults to the table's
    delta.deletedFileRetentionDuration and is never below the clean-up safety window.
    """
    table = open_table(location)
    hours = retention_hours if retention_hours is not None else retention_hours_of(table)
    check_retention(hours)
    meta = CommitMetadata(pipeline, "vacuum", attempt=new_attempt_id(), run=run or Run.here())
    deleted = table.vacuum(
        retention_hours=hours,
        dry_run=dry_run,
        enforce_retention_duration=False,
        full=True,
        commit_properties=CommitProperties(custom_metadata={"userMetadata": meta.to_json()}),
    )
    return VacuumResult(location, sorted(deleted), hours, dry_run)


def check_retention(hours: int) -> None:
    if hours < MIN_VACUUM_RETENTION_HOURS:
        raise ConfigError(
            f"vacuum retention {hours} h is below the clean-up safety window of "
            f"{MIN_VACUUM_RETENTION_HOURS} h: a batch in flight or a RESTORE could lose its files"
        )


def retention_hours_of(table: DeltaTable) -> int:
    """The table's delta.deletedFileRetentionDuration ("interval 168 hours", "interval 7 days"), in hours."""
    text = table.metadata().configuration.get("delta.deletedFileRetentionDuration") or "interval 7 days"
    parts = text.split()
    number, unit = int(parts[-2]), parts[-1].rstrip("s")
    return int(number * {"week": 168, "day": 24, "hour": 1, "minute": 1 / 60, "second": 1 / 3600}.get(unit, 24))


def checkpoint(location: Location) -> int:
    """Write a Delta checkpoint of the latest version, then remove commit files older than the table's
    log retention that the checkpoint covers. The ledger (txn actions) is part of the checkpoint."""
    table = open_table(location)
    table.create_checkpoint()
    drop_stale_checksums(location)
    table.cleanup_metadata()
    return table.version()


def parse_offsets(text: str) -> dict[TP, int]:
    """`topic:partition=offset[,...]` from the command line."""
    out: dict[TP, int] = {}
    for item in (text or "").split(","):
        where, _, offset = item.strip().rpartition("=")
        topic, _, partition = where.rpartition(":")
        if not (topic and partition.isdigit() and offset.isdigit()):
            raise ConfigError(f"bad offset {item.strip()!r}: expected topic:partition=offset, e.g. events:0=1200")
        out[(topic, int(partition))] = int(offset)
    return out


def reset(cfg: PipelineConfig, offsets: dict[TP, int], reason: str, run: Run | None = None) -> int:
    """Move the ledger to `offsets` as a `reset` commit (no data). Returns the table version."""
    reason = (reason or "").strip()
    if not reason:
        raise ConfigError("reset needs a reason (it is recorded in the table history)")
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    starts, ends = cluster.start_offsets(tps), cluster.end_offsets(tps, cfg.kafka.isolation_level)
    for tp, offset in offsets.items():
        if tp not in starts:
            raise ConfigError(f"unknown partition {tp[0]}[{tp[1]}] for pipeline {cfg.name!r}")
        if not starts[tp] <= offset <= ends[tp]:
            raise ConfigError(
                f"offset {offset} for {tp[0]}[{tp[1]}] is outside what Kafka holds [{starts[tp]}, {ends[tp]}]"
            )
    schema = table_schema(cfg)
    attempt, run = new_attempt_id(), run or Run.here()

    def decide(table: DeltaTable) -> Change:
        try:
            ledger = read_ledger(cfg.table_location, table, cfg.name, tps)
        except RewindOutOfReach:  # what the reset is for: the offsets given replace what cannot be read
            ledger = ledger_in_txns(cfg.table_location, table, cfg.name, tps)
        new, batch = {**ledger.offsets, **offsets}, ledger.next_batch()
        metadata = CommitMetadata(
            cfg.name,
            "reset",
            batch=batch,
            attempt=attempt,
            reason=reason[:500],
            from_=flat_offsets(ledger.offsets),
            offsets=flat_offsets(new),
            run=run,
        )
        return Change(
            metadata, txns=txn_actions(cfg.name, batch, new), schema=schema, partition_by=cfg.table.partition_by
        )

    outcome = commit(
        cfg.table_location,
        decide,
        "reset",
        open_=lambda location: open_table(
            location, schema, cfg.table.partition_by, cfg.name, properties=cfg.table_properties()
        ),
    )
    assert isinstance(outcome, Committed)  # decide() always writes
    return outcome.version


def restore(cfg: PipelineConfig, version: int, run: Run | None = None) -> int:
    """Delta RESTORE to `version` and, in the same commit, the ledger as it was at that version.

    Committed with no automatic retry, like every commit: a batch committed meanwhile would
    otherwise be rebased under the restore, its rows kept while the ledger goes back to
    `version`, and the next ingest would read them again. We decide again instead.
    """
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    attempt, run = new_attempt_id(), run or Run.here()

    def decide(table: DeltaTable) -> Change:
        if not 0 <= version < table.version():
            raise ConfigError(
                f"version {version} is not an earlier version of {cfg.table_path} (now {table.version()})"
            )
        current = read_ledger(cfg.table_location, table, cfg.name, tps)
        then = ledger_at(cfg.table_location, cfg.name, tps, version)
        # Partitions the ledger did not know at that version start again from their earliest offset.
        offsets = {**cluster.start_offsets(tps), **then.offsets}
        change = restore_ledger(
            cfg.name, version, current.next_batch(), attempt, flat_offsets(current.offsets), offsets, run
        )
        return replace(change, restore_version=version)  # and the files, in the same commit

    outcome = commit(cfg.table_location, decide, "restore")
    assert isinstance(outcome, Committed)  # decide() always writes
    return outcome.version


def restore_ledger(
    pipeline: str, version: int, batch: int, attempt: str, before: Offsets, offsets: dict[TP, int], run: Run
) -> Change:
    """The commit that records a restore to `version`: the ledger as of then (`offsets`), `before` the one it
    replaces, as batch `batch`."""
    metadata = CommitMetadata(
        pipeline,
        "restore",
        batch=batch,
        attempt=attempt,
        restored_version=version,
        from_=before,
        offsets=flat_offsets(offsets),
        run=run,
    )
    return Change(metadata, txns=txn_actions(pipeline, batch, offsets))


def record_pending_rewind(
    cfg: PipelineConfig,
    commit_with: Callable[[Decide, str], Committed | Settled],
    new_partitions_from_earliest: bool = False,
) -> int | None:
    """Record, in a commit of its own (`commit_with`: the pipeline engine's), the ledger a RESTORE by another
    writer took the table back to, if no commit has recorded it yet; the version that did, or None.
    `new_partitions_from_earliest`: partitions the ledger did not know then start from Kafka's earliest offset
    (as offsetlake's own restore has them), not as `starting_offsets` says (as a batch recording it does).

    Until a commit records it, the ledger is read as of the restored version, which log clean-up may remove:
    called before a commit that is not a batch's (optimize, vacuum, a checkpoint, a backfill), since any
    commit may write a checkpoint and clean the log up (delta-spark every 10 commits). Kafka is asked for
    the pipeline's partitions only when such a RESTORE is there."""
    location = cfg.table_location
    if pending_restore(location, open_table(location), cfg.name) is None:
        return None
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    starts = cluster.start_offsets(tps)
    attempt, run = new_attempt_id(), Run.here()

    def decide(table: DeltaTable) -> Change | Settled:
        ledger = read_ledger(location, table, cfg.name, tps)
        if ledger.rewind is None:
            return Settled("already_committed", "a commit recorded the restored ledger first")
        rewind = ledger.rewind
        # A partition the table's `txn` actions name (the rewind's `from_`) but the restored version had not
        # read yet (a RESTORE to before its first batch) starts from the earliest offset, as the next batch
        # would read it: left out of the record, its `txn` action would keep the offset of the batches the
        # RESTORE took away.
        forgotten = unflat_offsets(rewind.from_).keys() - ledger.offsets.keys()
        new = starts if new_partitions_from_earliest else {tp: starts[tp] for tp in forgotten if tp in starts}
        offsets = {**new, **ledger.offsets}
        change = restore_ledger(
            cfg.name, rewind.restored_version, ledger.next_batch(), attempt, rewind.from_, offsets, run
        )
        return replace(change, schema=pa.schema(table.schema()), partition_by=cfg.table.partition_by)  # as it is

    outcome = commit_with(decide, "record the restored ledger")
    return outcome.version if isinstance(outcome, Committed) else None
