"""Backfill: re-read exact offset ranges and replace the table's rows for them, in ONE Delta commit.

The commit removes every file holding rows of those offsets (a file that also
holds other offsets is rewritten without them) and adds the re-read rows, so
readers see either the old rows or the new ones, never both or neither. Run it
twice, get the same table. It never moves the ledger: offsets past the
ledger's committed end belong to ingest and are refused (checked again on every
snapshot the commit is decided on: a restore or reset meanwhile may have moved
the ledger back), and so are offsets Kafka no longer holds.

On the delta-spark engine the rows are found and removed by delta-spark in the commit's own transaction
(`spark_merge.replace_ranges`): the files holding them are read as Delta reads them, deletion vectors
applied, and written again without them beside the re-read rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import RemoveAction

from offsetlake import faults
from offsetlake.config import PipelineConfig
from offsetlake.engine import engine_for
from offsetlake.errors import ConfigError, DataLossError
from offsetlake.formats.columns import table_schema
from offsetlake.kafka import TP, KafkaCluster
from offsetlake.operations.fold import table_rows
from offsetlake.operations.maintenance import record_pending_rewind
from offsetlake.protocol.commit import Change, Committed, add_actions, attempt_files, new_attempt_id
from offsetlake.protocol.ledger import read_ledger
from offsetlake.protocol.metadata import CommitMetadata, Records, Run, ranges_json
from offsetlake.protocol.planning import split_ranges
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import LINEAGE
from offsetlake.read.tasks import TaskContext
from offsetlake.read_job import TaskFiles, evolved_schema, run_tasks, table_columns
from offsetlake.storage.parquet import action_partition_values, from_delta_path, read_with_partitions, write_file
from offsetlake.table import open_table

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger("offsetlake.operations.backfill")
RANGE_RE = re.compile(r"^\s*([A-Za-z0-9._-]{1,249}):(\d{1,9}):(\d{1,18})-(\d{1,18})\s*$")


@dataclass
class BackfillResult:
    status: str  # committed | dry_run | nothing_to_do
    ranges: list[OffsetRange]
    version: int | None = None
    rows_removed: int = 0
    rows_added: int = 0
    files_removed: int = 0
    files_rewritten: int = 0
    extra: dict = field(default_factory=dict)

    def summary(self) -> str:
        spans = ", ".join(str(r) for r in self.ranges)
        if self.status == "dry_run":
            return f"dry run: would re-read {spans}, replacing {self.rows_removed} rows now in the table"
        return (
            f"backfill committed table version {self.version}: {spans}; {self.rows_removed} rows removed, "
            f"{self.rows_added} added ({self.files_removed} files removed, {self.files_rewritten} rewritten)"
        )


def parse_ranges(text: str) -> list[OffsetRange]:
    """`topic:partition:start-end[,...]` (end exclusive) from the command line."""
    ranges = []
    for item in (text or "").split(","):
        match = RANGE_RE.match(item)
        if not match:
            raise ConfigError(f"bad range {item.strip()!r}: expected topic:partition:start-end, e.g. events:0:100-200")
        topic, partition, start, end = match.groups()
        ranges.append(OffsetRange(topic, int(partition), int(start), int(end)))
    return ranges


def ranges_for_time_window(
    cfg: PipelineConfig, cluster: KafkaCluster, start: dt.datetime, end: dt.datetime
) -> list[OffsetRange]:
    """Offsets of records with timestamps in [start, end), per partition, via offsets_for_times."""
    if end <= start:
        raise ConfigError(f"time window end {end.isoformat()} is not after its start {start.isoformat()}")
    tps = cluster.partitions(cfg.topics)
    ends_now = cluster.end_offsets(tps, cfg.kafka.isolation_level)
    lo = cluster.offsets_for_time(tps, int(start.timestamp() * 1000))
    hi = cluster.offsets_for_time(tps, int(end.timestamp() * 1000))
    ranges = []
    for tp in tps:
        first = lo[tp] if lo[tp] >= 0 else ends_now[tp]  # -1: no record at or after the time
        last = hi[tp] if hi[tp] >= 0 else ends_now[tp]
        if last > first:
            ranges.append(OffsetRange(tp[0], tp[1], first, last))
    return ranges


def validate(cfg: PipelineConfig, cluster: KafkaCluster, ranges: list[OffsetRange], committed: dict[TP, int]) -> None:
    """Every problem is refused before anything is read or written."""
    if not ranges:
        raise ConfigError("no offset ranges to backfill")
    known = set(cluster.partitions(cfg.topics))
    log_starts = cluster.start_offsets(sorted({(r.topic, r.partition) for r in ranges} & known))
    seen: dict[TP, list[OffsetRange]] = {}
    for r in ranges:
        tp = (r.topic, r.partition)
        if r.topic not in cfg.topics:
            raise ConfigError(f"topic {r.topic!r} is not read by pipeline {cfg.name!r} (topics: {cfg.topics})")
        if tp not in known:
            raise ConfigError(f"unknown partition {r.topic}[{r.partition}]")
        if r.end <= r.start:
            raise ConfigError(f"range {r}: end must be greater than start")
        check_within_ledger(r, committed)
        if r.start < log_starts[tp]:
            raise DataLossError(
                f"range {r}: offsets [{r.start}, {log_starts[tp]}) are no longer in Kafka "
                f"(retention); they cannot be re-read"
            )
        for other in seen.get(tp, []):
            if r.start < other.end and other.start < r.end:
                raise ConfigError(f"ranges {other} and {r} overlap")
        seen.setdefault(tp, []).append(r)


def check_within_ledger(r: OffsetRange, committed: dict[TP, int], moved: bool = False) -> None:
    """A backfill may only replace what ingest has committed: offsets at or past the ledger's end are
    ingest's, and rows added there would be read again by the next ingest."""
    end = committed.get((r.topic, r.partition), 0)
    if r.end > end:
        why = " (the ledger moved back while the backfill ran: a restore or a reset)" if moved else ""
        raise ConfigError(
            f"range {r} goes past the ledger's committed end {end} for {r.topic}[{r.partition}]"
            f"{why}: ingest owns those offsets"
        )


def backfill(
    spark: Any, cfg: PipelineConfig, ranges: list[OffsetRange], run: Run | None = None, dry_run: bool = False
) -> BackfillResult:
    cfg.refuse_in_upsert_mode(
        "backfill", "is not defined for it yet: an upsert table keeps one row per key, not one per offset"
    )
    cluster = KafkaCluster(cfg.kafka)
    schema = table_schema(cfg)
    by_spark = cfg.table.engine == "delta-spark"  # which finds and rewrites the rows itself (module docstring)
    if not dry_run:  # a RESTORE by another writer recorded first: this commit may clean the log up
        record_pending_rewind(cfg, engine_for(cfg, spark).commit)
    table = open_table(
        cfg.table_location, schema, cfg.table.partition_by, cfg.name, create=False, writer=cfg.table.engine
    )
    tps = cluster.partitions(cfg.topics)
    ledger = read_ledger(cfg.table_location, table, cfg.name, tps)
    ranges = sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))
    validate(cfg, cluster, ranges, ledger.offsets)
    if dry_run:
        return BackfillResult("dry_run", ranges, rows_removed=_rows_in(table_rows(cfg, LINEAGE, spark), ranges))

    attempt = new_attempt_id()
    fault_settings = faults.settings_from_env()
    tasks = split_ranges(ranges, cfg.batch.max_records_per_task)
    # Bad records of these offsets were quarantined at ingest: this attempt's quarantine files all go.
    with attempt_files(attempt, cfg.table_location, cfg.quarantine_location) as files:
        out = run_tasks(
            spark, TaskContext(cfg, ledger.batch or 0, attempt, tuple(tasks), fault_settings, table_columns(table))
        )
        new_files = [f for _, f in out.data]
        files.written[cfg.table_location] |= {f.path for f in new_files}
        files.written[cfg.quarantine_location] |= {f.path for _, f in out.quarantine}
        records = Records(read=sum(out.read.values()), rows=sum(f.num_records for f in new_files))
        replaced: dict = {}

        def decide(table: DeltaTable) -> Change:
            # A restore or reset that committed since the plan may have moved the ledger back below these
            # ranges: checked against every snapshot the commit is decided on, not only the plan's.
            committed = read_ledger(cfg.table_location, table, cfg.name, tps).offsets
            for r in ranges:
                check_within_ledger(r, committed, moved=committed != ledger.offsets)
            # Rewrites decided against a snapshot that loses the race are this attempt's files: they go too.
            removes, rewritten, removed_rows = ([], [], 0) if by_spark else _replacement(cfg, table, ranges, attempt)
            files.written[cfg.table_location] |= {f.path for f in rewritten}
            replaced.update(files=len(removes) - len(rewritten), rewritten=len(rewritten), rows=removed_rows)
            faults.hit("before_commit", fault_settings)
            metadata = CommitMetadata(
                cfg.name,
                "backfill",
                attempt=attempt,
                ranges=ranges_json(ranges),
                records=Records(records.read, records.rows, removed=removed_rows),
                run=run or Run.here(),
            )
            wider = evolved_schema(table, TaskFiles(records.read, [], [], out.schemas))
            return Change(
                metadata,
                [*removes, *add_actions(new_files + rewritten)],
                schema=wider or schema,
                partition_by=cfg.table.partition_by,
                evolve=wider is not None,
                replaces=tuple(ranges) if by_spark else (),
            )

        outcome = engine_for(cfg, spark).commit(decide, "backfill", rewrites=True)
        assert isinstance(outcome, Committed)  # decide() always writes, or raises
        files.kept[cfg.table_location] = outcome.added_paths()
        if outcome.replaced is not None:  # every file holding rows of the ranges was written again
            replaced.update(files=0, rewritten=outcome.replaced["files"], rows=outcome.replaced["removed"])
    return BackfillResult(
        "committed", ranges, outcome.version, replaced["rows"], records.rows, replaced["files"], replaced["rewritten"]
    )


def _rows_in(lineage: pa.Table, ranges: list[OffsetRange]) -> int:
    """The rows of `ranges` among the table's (as its engine reads it: delta-spark applies deletion vectors)."""
    return int(pc.sum(_in_ranges(lineage, ranges)).as_py() or 0)


def _in_ranges(lineage: pa.Table, ranges: list[OffsetRange]) -> pa.ChunkedArray:
    mask = pa.repeat(False, lineage.num_rows)
    for r in ranges:
        hit = pc.and_(
            pc.and_(pc.equal(lineage["kafka_topic"], r.topic), pc.equal(lineage["kafka_partition"], r.partition)),
            pc.and_(pc.greater_equal(lineage["kafka_offset"], r.start), pc.less(lineage["kafka_offset"], r.end)),
        )
        mask = pc.or_(mask, hit)
    return mask


def _replacement(cfg: PipelineConfig, table, ranges: list[OffsetRange], attempt: str):
    """Remove actions for every file holding rows in `ranges`; files that also hold other rows are rewritten."""
    actions = pa.table(table.get_add_actions(flatten=True))
    types = table_columns(table)
    removes, rewritten, removed_rows = [], [], 0
    now = int(time.time() * 1000)
    for i, row in enumerate(actions.to_pylist()):
        if not _may_overlap(row, ranges):
            continue
        partition_values = action_partition_values(row, cfg.table.partition_by)
        rows = read_with_partitions(cfg.table_location, row["path"], partition_values, types)
        hit = _in_ranges(rows, ranges)
        hits = int(pc.sum(hit).as_py() or 0)
        if hits == 0:
            continue
        removed_rows += hits
        removes.append(RemoveAction(row["path"], True, now, row["size_bytes"], partition_values or None))
        if hits < rows.num_rows:
            kept = rows.filter(pc.invert(hit))
            kept = kept.drop_columns([c for c in partition_values if c in kept.column_names])
            base = from_delta_path(row["path"]).rsplit("/", 1)
            name = f"part-rewrite-{attempt}-{i:05d}.zstd.parquet"
            rel = f"{base[0]}/{name}" if len(base) == 2 else name
            rewritten.append(write_file(cfg.table_location, rel, kept, partition_values))
    return removes, rewritten, removed_rows


def _may_overlap(action: dict, ranges: list[OffsetRange]) -> bool:
    """Data skipping on the file's statistics; files without them are read."""
    lo_off, hi_off = action.get("min.kafka_offset"), action.get("max.kafka_offset")
    lo_p, hi_p = action.get("min.kafka_partition"), action.get("max.kafka_partition")
    if lo_off is None or hi_off is None or lo_p is None or hi_p is None:
        return True
    return any(lo_p <= r.partition <= hi_p and lo_off < r.end and r.start <= hi_off for r in ranges)
