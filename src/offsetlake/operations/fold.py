"""Audit and repair of an upsert table: the table against the fold of Kafka, and a rebuild from that fold.

An upsert table holds one row per key, not one per offset, so its audit is not the append audit's
offset-by-offset count. Kafka is read under read_committed from each partition's log start to the
ledger, every record decoded as ingest decodes it (`records.convert`: the same quarantine, the same
tombstones and Debezium deletes), and folded: per key the record that wins (upsert.py's rule: the highest
offset of its partition, or the greatest `write.order_by`), deleted when that record deletes. The table
must hold exactly the fold's live keys, each row the winner's (its lineage names the record, every value
equal).

What Kafka no longer holds is said, not guessed:
- a row whose record lies below its partition's log start (retention deleted it) and whose key no later
  record touches is "beyond retention": counted, not checked, and kept by a rebuild;
- on a compacted topic (`cleanup.policy` compact) the log start is usually 0 but records in the range are
  gone: compaction keeps each key's last record, which is all a fold needs; the report counts the offsets
  Kafka no longer returns (compaction, aborted records and transaction markers alike);
- without `write.order_by` a key found in two partitions has no order Kafka can give: listed, not checked,
  its row kept by a rebuild.

`rebuild` (what `repair` runs for an upsert table) writes the fold as the table's whole content in one
commit through the one commit path: every data file removed, the fold's files added, as a `backfill`
commit by `repair`, which leaves the ledger where it is (no `txn` actions). It is decided against the
version the audit read; a commit that landed since (a batch) refuses it in one line: audit again.

Memory: the fold holds every record of the range and the table's rows; it is an on-demand check.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import RemoveAction

from offsetlake.config import DELETED_COLUMN, LINEAGE_COLUMNS, PipelineConfig
from offsetlake.engine import engine_for
from offsetlake.errors import OffsetlakeError
from offsetlake.formats.records import convert, reads_headers
from offsetlake.kafka import KafkaCluster
from offsetlake.operations.ledger_checks import audited_ranges, continuity_issues, sanity_issues
from offsetlake.protocol import unavailable as placeholders
from offsetlake.protocol.commit import Change, Committed, add_actions, attempt_files, new_attempt_id
from offsetlake.protocol.ledger import pipeline_history, read_ledger
from offsetlake.protocol.merge_batch import rows_to_apply
from offsetlake.protocol.metadata import CommitMetadata, Records, Run, ranges_json
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import (
    LINEAGE,
    SnapshotEnd,
    fold,
    key_text,
    stale_as_deleted,
)
from offsetlake.read.reader import read_range
from offsetlake.read_job import table_columns
from offsetlake.storage.parquet import action_partition_values, conform, plain_types, write_files
from offsetlake.table import open_table, query

if TYPE_CHECKING:
    from deltalake import DeltaTable

SHOWN = 20  # keys listed per kind in a report


@dataclass
class PartitionRead:
    topic: str
    partition: int
    start: int
    end: int
    kafka_records: int = 0  # what Kafka returned under read_committed
    quarantined: int = 0

    @property
    def not_returned(self) -> int:
        """Offsets of the range Kafka did not return: aborted records, transaction markers, compaction."""
        return self.end - self.start - self.kafka_records


@dataclass
class UpsertAuditReport:
    pipeline: str
    version: int  # the table version audited: a rebuild is decided against it
    partitions: list[PartitionRead]
    compacted: list[str] = field(default_factory=list)  # topics with cleanup.policy compact
    keys: int = 0  # live keys in the fold
    table_rows: int = 0
    missing: list[str] = field(default_factory=list)  # live in the fold, not in the table
    unexpected: list[str] = field(default_factory=list)  # in the table, deleted by the fold or never seen
    wrong: list[str] = field(default_factory=list)  # in both, another record's row or another value
    duplicated: list[str] = field(default_factory=list)  # more than one row
    unordered: list[str] = field(default_factory=list)  # in two partitions without order_by: not checked
    beyond_retention: int = 0  # rows whose record Kafka deleted and no later record touches: not checked
    continuity: list[str] = field(default_factory=list)
    sanity: list[str] = field(default_factory=list)
    rebuilt: pa.Table | None = field(default=None, repr=False)  # what a rebuild writes

    @property
    def ok(self) -> bool:
        problems = self.missing or self.unexpected or self.wrong or self.duplicated
        return not (problems or self.continuity or self.sanity)

    def problem_count(self) -> int:
        return len(self.missing) + len(self.unexpected) + len(self.wrong) + len(self.duplicated)

    def as_dict(self) -> dict:
        out = asdict(replace(self, rebuilt=None))  # the rows are not part of the report
        out.pop("rebuilt")
        out["ok"] = self.ok
        for kind in ("missing", "unexpected", "wrong", "duplicated", "unordered"):
            out[f"{kind}_count"] = len(out[kind])
            out[kind] = out[kind][:SHOWN]
        for p, read in zip(out["partitions"], self.partitions):
            p["not_returned"] = read.not_returned
        return out

    def format(self) -> str:
        lines = [f"{'topic':<24} {'part':>4} {'range':>19} {'kafka':>8} {'quar.':>6} {'gone':>6}"]
        for p in self.partitions:
            lines.append(
                f"{p.topic:<24} {p.partition:>4} {f'[{p.start}, {p.end})':>19} {p.kafka_records:>8} "
                f"{p.quarantined:>6} {p.not_returned:>6}"
            )
        lines.append("gone: offsets Kafka no longer returns (aborted records, transaction markers, compaction)")
        for topic in self.compacted:
            lines.append(
                f"{topic} is compacted: the fold from the log start holds each key's last record; what "
                f"compaction removed is in 'gone'"
            )
        lines.append(
            f"fold: {self.keys} live keys; table: {self.table_rows} rows; missing {len(self.missing)}, "
            f"unexpected {len(self.unexpected)}, wrong {len(self.wrong)}, duplicated {len(self.duplicated)}"
        )
        for kind in ("missing", "unexpected", "wrong", "duplicated"):
            keys = getattr(self, kind)
            if keys:
                lines.append(f"{kind} keys: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}")
        if self.beyond_retention:
            lines.append(f"not checked: {self.beyond_retention} rows whose record is below Kafka's log start")
        if self.unordered:
            lines.append(f"not checked: {len(self.unordered)} keys in two partitions (no write.order_by)")
        lines += [f"ledger: {issue}" for issue in self.continuity + self.sanity]
        lines.append(
            "audit: OK, the table is the fold of Kafka"
            if self.ok
            else "audit: PROBLEMS FOUND (offsetlake repair rebuilds the table from the fold)"
        )
        return "\n".join(lines)


def table_rows(cfg: PipelineConfig, columns: Sequence[str] = (), spark: Any = None) -> pa.Table:
    """The pipeline table's rows (`columns` of each; every column when none are named), read by delta-rs --
    or, on the delta-spark engine with a session, by delta-spark, which reads every table feature that engine
    writes (type widening)."""
    if cfg.table.engine == "delta-spark" and spark is not None:
        from offsetlake.spark.session import session_of

        table = session_of(spark).read.format("delta").load(str(cfg.table_location))
        return plain_types((table.select(*columns) if columns else table).toArrow())
    return query(cfg.table_location, f"SELECT {', '.join(columns) or '*'} FROM t")


def audit_upsert(cfg: PipelineConfig, ranges: list[OffsetRange] | None = None, spark: Any = None) -> UpsertAuditReport:
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    table = open_table(cfg.table_location)
    ledger = read_ledger(cfg.table_location, table, cfg.name, tps)
    log_starts = cluster.start_offsets(tps)
    if ranges is None:
        ranges = audited_ranges(tps, log_starts, ledger.offsets)
    columns = table_columns(table)
    reads, rows = _read_and_fold_input(cfg, ranges, columns)
    unavailable = cfg.format.unavailable_value
    snapshot_ends: tuple[SnapshotEnd, ...] = ()
    if rows is not None:
        # As a batch applies them (a TRUNCATE: the table is what came after the last one; a snapshot's end:
        # older rows it did not read are gone; a key change's delete goes with its create, so a range that ends
        # between them leaves the old row, as the batch did). A key change's new row takes what it lacks from
        # the old key's rows in the range, not from the table (that is what is checked): an old row before the
        # range leaves it unknown, and the table's stands.
        write = cfg.write
        deletes = write.deletes != "ignore"
        rows, _, snapshot_ends, _ = rows_to_apply(rows, write.key, write.order_by, unavailable, None, None, deletes)
    winners, unordered = fold(rows, cfg.write.key, cfg.write.order_by, unavailable)
    winners = stale_as_deleted(winners, snapshot_ends)
    current = table_rows(cfg, spark=spark)
    report = UpsertAuditReport(cfg.name, table.version(), reads, compacted=_compacted(cluster, cfg.topics))
    report.table_rows = current.num_rows
    _compare(report, cfg, winners, unordered, current, log_starts, columns)
    history = pipeline_history(cfg.table_location, table, cfg.name)
    report.continuity = continuity_issues(history)
    report.sanity = sanity_issues(ledger.offsets, cluster.end_offsets(tps, cfg.kafka.isolation_level))
    return report


def _read_and_fold_input(cfg: PipelineConfig, ranges: list[OffsetRange], columns: pa.Schema):
    reads, tables = [], []
    group = f"{cfg.consumer_group}.audit"
    for rng in ranges:
        read = PartitionRead(rng.topic, rng.partition, rng.start, rng.end)
        for batch in read_range(cfg.kafka, group, rng, cfg.batch.read_timeout_seconds, headers=reads_headers(cfg)):
            messages = pa.Table.from_batches([batch])
            read.kafka_records += messages.num_rows
            good, bad = convert(cfg, messages, columns)
            read.quarantined += bad.num_rows
            tables.append(good)
        reads.append(read)
    rows = pa.concat_tables(tables, promote_options="permissive") if tables else None
    return reads, rows


def _compacted(cluster: KafkaCluster, topics: list[str]) -> list[str]:
    policies = cluster.cleanup_policies(topics)
    return [t for t in topics if "compact" in (policies.get(t) or "")]


def _compare(report: UpsertAuditReport, cfg, winners, unordered: set[str], current: pa.Table, log_starts, columns):
    key = cfg.write.key
    folded: dict[str, dict] = {}
    if winners is not None:
        for row in winners.to_pylist():
            folded[key_text(row, key)] = row
    by_key: dict[str, list[dict]] = {}
    for row in current.to_pylist():
        by_key.setdefault(key_text(row, key), []).append(row)
    data_columns = [c for c in current.column_names if c not in LINEAGE_COLUMNS]
    unknown = _unknown_values(cfg, columns)
    kept = []
    for k, found in by_key.items():
        if len(found) > 1:
            report.duplicated.append(k)
        row = found[0]
        if k in unordered:
            kept.extend(found)
            continue
        want = folded.get(k)
        if want is None:
            below = row["kafka_offset"] < log_starts.get((row["kafka_topic"], row["kafka_partition"]), 0)
            if below:
                report.beyond_retention += 1
                kept.append(row)
            else:
                report.unexpected.append(k)
            continue
        if want[DELETED_COLUMN]:
            report.unexpected.append(k)
        elif [row[c] for c in LINEAGE] != [want[c] for c in LINEAGE] or any(
            row.get(c) != want.get(c) and not unknown(c, want.get(c)) for c in data_columns
        ):
            report.wrong.append(k)
    report.missing = sorted(k for k, row in folded.items() if not row[DELETED_COLUMN] and k not in by_key)
    report.keys = sum(1 for row in folded.values() if not row[DELETED_COLUMN])
    report.unordered = sorted(unordered)
    for kind in ("duplicated", "unexpected", "wrong"):
        setattr(report, kind, sorted(getattr(report, kind)))
    live = (
        []
        if winners is None
        else [winners.filter(pc.invert(winners.column(DELETED_COLUMN))).drop_columns([DELETED_COLUMN])]
    )
    if kept:
        live.append(pa.Table.from_pylist(kept, schema=current.schema))
    rebuilt = pa.concat_tables([conform(part, columns) for part in live]) if live else columns.empty_table()
    report.rebuilt = _unknown_from_table(rebuilt, current, key, cfg.format.unavailable_value)


def _unknown_values(cfg: PipelineConfig, columns: pa.Schema):
    """Whether a folded value is Debezium's unavailable value: no record in the range holds the column's
    value (a TOASTed one that no event in the range sent), so the fold cannot say it and the table's stands."""
    marker = cfg.format.unavailable_value
    shapes = {} if marker is None else {f.name: placeholders.placeholder(f.type, marker) for f in columns}

    def unknown(column: str, value: object) -> bool:
        return value is not None and value == shapes.get(column)

    return unknown


def _unknown_from_table(rebuilt: pa.Table, current: pa.Table, key: list[str], marker: str | None) -> pa.Table:
    """A rebuild never writes the unavailable value: a column the fold does not know keeps the table's
    value for its key (null for a key the table lacks)."""
    if marker is None:
        return rebuilt
    columns = placeholders.holding_columns(rebuilt, key, marker)
    if not columns:
        return rebuilt
    now = {key_text(row, key): row for row in current.select([*key, *columns]).to_pylist()}
    keys = [key_text(row, key) for row in rebuilt.select(key).to_pylist()]
    for column in columns:
        field = rebuilt.schema.field(column)
        unknown = placeholders.holds(rebuilt.column(column), marker).to_pylist()
        values = rebuilt.column(column).to_pylist()
        known = [now.get(k, {}).get(column) if u else v for k, u, v in zip(keys, unknown, values)]
        rebuilt = rebuilt.set_column(rebuilt.schema.get_field_index(column), field, pa.array(known, field.type))
    return rebuilt


@dataclass
class RebuildResult:
    status: str  # committed | dry_run
    rows: int
    removed_files: int = 0
    version: int | None = None

    def summary(self) -> str:
        if self.status == "dry_run":
            return f"repair (dry run): would rebuild the table from the fold: {self.rows} rows"
        return (
            f"repair: rebuilt the table from the fold in version {self.version}: {self.rows} rows "
            f"(replacing {self.removed_files} files; the ledger unchanged)"
        )


def rebuild(
    cfg: PipelineConfig,
    report: UpsertAuditReport,
    run: Run | None = None,
    dry_run: bool = False,
    spark: Any = None,
) -> RebuildResult:
    """The table becomes `report`'s fold in one commit (see the module docstring); on the delta-spark engine
    committed by delta-spark in `spark` (the fold comes from Kafka, so no deleted row can come back)."""
    assert report.rebuilt is not None, "a report made by audit_upsert"
    rows = report.rebuilt
    if dry_run:
        return RebuildResult("dry_run", rows.num_rows)
    attempt = new_attempt_id()
    run = msgspec.structs.replace(run or Run.here(), via="repair")
    with attempt_files(attempt, cfg.table_location) as files:
        written = write_files(
            cfg.table_location,
            rows,
            cfg.table.partition_by,
            lambda part: f"part-rebuild-{attempt}-{part:05d}.zstd.parquet",
        )
        files.written[cfg.table_location] |= {f.path for f in written}

        def decide(table: DeltaTable) -> Change:
            if table.version() != report.version:
                raise OffsetlakeError(
                    f"repair: {cfg.name}'s table changed since the audit (version {report.version}, now "
                    f"{table.version()}): nothing was changed; audit and repair again"
                )
            now = int(time.time() * 1000)
            current = pa.table(table.get_add_actions(flatten=True)).to_pylist()
            partition_by = cfg.table.partition_by
            removes = [
                RemoveAction(f["path"], True, now, f["size_bytes"], action_partition_values(f, partition_by) or None)
                for f in current
            ]
            ranges = [OffsetRange(p.topic, p.partition, p.start, p.end) for p in report.partitions]
            metadata = CommitMetadata(
                cfg.name,
                "backfill",
                attempt=attempt,
                ranges=ranges_json(ranges),
                records=Records(
                    sum(p.kafka_records for p in report.partitions), rows.num_rows, removed=report.table_rows
                ),
                run=run,
            )
            return Change(
                metadata, [*removes, *add_actions(written)], schema=rows.schema, partition_by=cfg.table.partition_by
            )

        outcome = engine_for(cfg, spark).commit(decide, "repair", rewrites=True)
        assert isinstance(outcome, Committed)  # decide() always writes, or raises
        files.kept[cfg.table_location] = outcome.added_paths()
    removed = sum(isinstance(a, RemoveAction) for a in outcome.change.actions)
    return RebuildResult("committed", rows.num_rows, removed, outcome.version)
