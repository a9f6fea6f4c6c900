"""The commit protocol: a batch's data files and the offsets it consumed become visible in ONE Delta commit.

Why it is shaped this way:
- The offsets live in the same commit as the data (`txn` actions), so there is
  no second store that could disagree with the table after a crash.
- The ledger is read right before committing: if the batch is already
  committed (a retry, a duplicate run, a zombie that woke up late), or the
  ledger moved past this plan, we commit nothing and delete our own files.
- The commit is made against the exact snapshot we checked, with delta-rs'
  automatic rebase turned off (max_commit_retries=0). If anyone committed in
  between, Delta's put-if-absent on the next log entry fails us, and we go
  back to reading the ledger. Check-then-commit is therefore atomic.
- Bad records go to the quarantine table first, with their own per-partition
  `txn` offsets, so a crash between the two commits cannot quarantine a record
  twice, and a record is never only in the quarantine of an uncommitted batch
  without being re-read by the retry.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction

from offsetlake import faults
from offsetlake.files import DataFile, from_delta_path, read_file, write_file
from offsetlake.formats import QUARANTINE_SCHEMA
from offsetlake.ledger import Ledger, quarantine_app_id, read_ledger, txn_actions
from offsetlake.planning import BatchPlan
from offsetlake.reader import OffsetRange
from offsetlake.table import delete_attempt_files, open_table

log = logging.getLogger("offsetlake.commit")
MAX_ATTEMPTS = 50  # conflicts with unrelated commits (OPTIMIZE, another writer); each retry re-checks the ledger


@dataclass
class CommitOutcome:
    status: str  # committed | already_committed | superseded
    version: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class WrittenFile:
    range: OffsetRange  # the task range the file holds rows of
    file: DataFile


def add_actions(files: list[DataFile]) -> list[AddAction]:
    return [AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats) for f in files]


def verdict(ledger: Ledger, plan: BatchPlan) -> CommitOutcome | None:
    """None when the plan may still commit; otherwise why it must not."""
    if ledger.batch is not None and ledger.batch >= plan.batch:
        return CommitOutcome("already_committed", reason=f"batch {plan.batch} is already committed "
                                                        f"(ledger at batch {ledger.batch})")
    seen = {tp: ledger.offsets.get(tp) for tp in plan.starts}
    if seen != plan.ledger_offsets:
        return CommitOutcome("superseded", reason="the ledger moved since this batch was planned")
    return None


def commit_batch(plan: BatchPlan, table_uri: str, schema: pa.Schema, partition_by: list[str],
                 data: list[WrittenFile], quarantine: list[WrittenFile], quarantine_uri: str,
                 metadata: dict, attempt: str, fault_settings: dict | None = None) -> CommitOutcome:
    committed_quarantine: set[str] = set()
    outcome: CommitOutcome | None = None
    try:
        for _ in range(MAX_ATTEMPTS):
            table = open_table(table_uri)
            ledger = read_ledger(table, plan.pipeline, list(plan.starts))
            outcome = verdict(ledger, plan)
            if outcome is not None:
                return outcome
            committed_quarantine |= commit_quarantine(plan, quarantine, quarantine_uri, attempt)
            faults.hit("before_commit", fault_settings)
            try:
                table.create_write_transaction(
                    add_actions([w.file for w in data]),
                    mode="append",
                    schema=schema,
                    partition_by=partition_by or None,
                    commit_properties=CommitProperties(
                        custom_metadata={"userMetadata": json.dumps(metadata, separators=(",", ":"))},
                        max_commit_retries=0,
                        app_transactions=txn_actions(plan.pipeline, plan.batch, plan.ends),
                    ),
                )
            except CommitFailedError:
                log.info("batch %s: someone else committed first; re-checking the ledger", plan.batch)
                continue
            # No rebase: a successful commit is exactly the version after the snapshot we checked.
            outcome = CommitOutcome("committed", version=table.version() + 1)
            return outcome
        raise RuntimeError(f"batch {plan.batch}: gave up after {MAX_ATTEMPTS} commit conflicts")
    finally:
        landed = outcome.status == "committed" if outcome else _landed(table_uri, attempt)
        delete_attempt_files(table_uri, attempt, keep={w.file.path for w in data} if landed else set())
        delete_attempt_files(quarantine_uri, attempt, keep=committed_quarantine)


def _landed(table_uri: str, attempt: str) -> bool:
    """After an unexpected error: did this attempt's commit land anyway? Clean-up must never delete a committed file."""
    for entry in DeltaTable(table_uri).history(limit=MAX_ATTEMPTS):
        raw = entry.get("userMetadata")
        if raw and f'"attempt":"{attempt}"' in raw:
            return True
    return False


def commit_quarantine(plan: BatchPlan, files: list[WrittenFile], uri: str, attempt: str) -> set[str]:
    """Commit bad records once per offset: per-partition txn offsets make it idempotent across attempts."""
    if not plan.ranges:
        return set()
    for _ in range(MAX_ATTEMPTS):
        table = open_table(uri, QUARANTINE_SCHEMA)
        covered = {(r.topic, r.partition): table.transaction_version(quarantine_app_id(plan.pipeline, r.topic, r.partition))
                   for r in plan.ranges}
        adds = []
        for w in files:
            f = _uncovered_part(uri, w, covered.get((w.range.topic, w.range.partition)), attempt)
            if f is not None:
                adds.append(f)
        txns = {tp: max(plan.ends[tp], covered[tp] or 0) for tp in covered}
        if all(covered[tp] is not None and covered[tp] >= plan.ends[tp] for tp in covered):
            return set()
        try:
            table.create_write_transaction(
                add_actions(adds), mode="append", schema=QUARANTINE_SCHEMA,
                commit_properties=CommitProperties(
                    custom_metadata={"userMetadata": json.dumps({"pipeline": plan.pipeline, "batch": plan.batch,
                                                                 "kind": "quarantine", "attempt": attempt})},
                    max_commit_retries=0,
                    app_transactions=txn_actions(plan.pipeline, None, txns, prefix=quarantine_app_id),
                ),
            )
            return {f.path for f in adds}
        except CommitFailedError:
            continue
    raise RuntimeError(f"batch {plan.batch}: gave up committing quarantine after {MAX_ATTEMPTS} conflicts")


def _uncovered_part(uri: str, written: WrittenFile, covered_to: int | None, attempt: str) -> DataFile | None:
    """The file, or a rewrite of its rows at or past `covered_to`, or None if all were quarantined before."""
    rng = written.range
    if covered_to is None or covered_to <= rng.start:
        return written.file
    if covered_to >= rng.end:
        return None
    rows = read_file(uri, written.file.path)
    rows = rows.filter(pc.greater_equal(rows["kafka_offset"], covered_to))
    if rows.num_rows == 0:
        return None
    name = from_delta_path(written.file.path).replace(".parquet", f"-from{covered_to}.parquet")
    return write_file(uri, name, rows, {})
