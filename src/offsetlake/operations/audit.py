"""Audit: compare the table with Kafka row by row, and check the ledger. Repair: backfill what audit found.

(Upsert tables: `fold.py`, the table against the fold of Kafka, and a rebuild from it.)

Kafka is read under read_committed over each partition's range (default: from
the log start to the ledger's committed end), and every offset it returns must
be in the table exactly once, or in the quarantine. Rows Kafka does not return
(aborted records, offsets of another topic incarnation) are "unexpected".

Another writer may also change rows in place: a user's UPDATE or MERGE in delta-spark keeps each row's
offset but not its record's values. The rows of every file such a commit added that the table still
holds are "rewritten"; repair backfills their offsets, which replaces those files. A commit whose log
entry clean-up removed cannot be located any more: audit names its version instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from offsetlake.config import PipelineConfig
from offsetlake.errors import OffsetlakeError, TableError
from offsetlake.formats.columns import LINEAGE_SCHEMA
from offsetlake.kafka import TP, KafkaCluster
from offsetlake.operations.fold import UpsertAuditReport, audit_upsert, rebuild, table_rows
from offsetlake.operations.ledger_checks import audited_ranges, continuity_issues, sanity_issues
from offsetlake.protocol.ledger import pipeline_history, read_ledger
from offsetlake.protocol.metadata import CommitMetadata, HistoryEntry, Run, unflat_offsets
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import LINEAGE
from offsetlake.read.reader import read_range
from offsetlake.storage.location import Location, despite_log_cleanup
from offsetlake.storage.parquet import (
    action_partition_values,
    from_delta_path,
    read_with_partitions,
)
from offsetlake.table import files_added_in, open_table, query


@dataclass
class PartitionAudit:
    topic: str
    partition: int
    start: int
    end: int
    kafka_records: int = 0
    table_rows: int = 0
    quarantined: int = 0
    missing: list[int] = field(default_factory=list)
    skipped: int = 0  # records an operator reset (or on_data_loss: skip) chose to leave out
    duplicated: list[int] = field(default_factory=list)
    unexpected: list[int] = field(default_factory=list)
    rewritten: list[int] = field(default_factory=list)  # rows another writer's UPDATE or MERGE wrote

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected or self.rewritten)

    def problem_ranges(self) -> list[OffsetRange]:
        """Contiguous spans covering every offset with a problem (what a backfill must rewrite)."""
        offsets = sorted(set(self.missing) | set(self.duplicated) | set(self.unexpected) | set(self.rewritten))
        spans: list[list[int]] = []
        for o in offsets:
            if spans and o == spans[-1][1]:
                spans[-1][1] = o + 1
            else:
                spans.append([o, o + 1])
        return [OffsetRange(self.topic, self.partition, lo, hi) for lo, hi in spans]


@dataclass
class AuditReport:
    pipeline: str
    partitions: list[PartitionAudit]
    continuity: list[str] = field(default_factory=list)
    sanity: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.partitions) and not self.continuity and not self.sanity

    def problem_count(self) -> int:
        return sum(len(p.missing) + len(p.duplicated) + len(p.unexpected) + len(p.rewritten) for p in self.partitions)

    def repair_ranges(self) -> list[OffsetRange]:
        return [r for p in self.partitions for r in p.problem_ranges()]

    def as_dict(self) -> dict:
        out = asdict(self)
        out["ok"] = self.ok
        for p in out["partitions"]:  # offsets can be many: report counts and the first few
            for key in ("missing", "duplicated", "unexpected", "rewritten"):
                p[f"{key}_count"] = len(p[key])
                p[key] = p[key][:20]
        return out

    def format(self) -> str:
        lines = [
            f"{'topic':<24} {'part':>4} {'range':>19} {'kafka':>8} {'rows':>8} {'quar.':>6} "
            f"{'missing':>8} {'dup':>6} {'unexp':>6} {'rewr.':>6}"
        ]
        for p in self.partitions:
            lines.append(
                f"{p.topic:<24} {p.partition:>4} {f'[{p.start}, {p.end})':>19} {p.kafka_records:>8} "
                f"{p.table_rows:>8} {p.quarantined:>6} {len(p.missing):>8} {len(p.duplicated):>6} "
                f"{len(p.unexpected):>6} {len(p.rewritten):>6}"
            )
        lines += [f"ledger: {issue}" for issue in self.continuity + self.sanity]
        lines.append(
            "audit: OK, every record exactly once"
            if self.ok
            else "audit: PROBLEMS FOUND (offsetlake repair fixes rows)"
        )
        return "\n".join(lines)


def audit(
    cfg: PipelineConfig, ranges: list[OffsetRange] | None = None, spark: Any = None
) -> AuditReport | UpsertAuditReport:
    """Append mode: every offset exactly once (module docstring). Upsert mode: the table against the fold
    of Kafka (`fold.audit_upsert`). `spark`: on the delta-spark engine, the session the table is read in
    (`table_rows`)."""
    if cfg.write.upsert:
        return audit_upsert(cfg, ranges, spark)
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    table = open_table(cfg.table_location)
    ledger = read_ledger(cfg.table_location, table, cfg.name, tps)
    if ranges is None:
        ranges = audited_ranges(tps, cluster.start_offsets(tps), ledger.offsets)
    rows = _lineage_counts(cfg.table_location, lambda: table_rows(cfg, LINEAGE, spark))
    quarantine = cfg.quarantine_location
    quarantined = _lineage_counts(quarantine, lambda: query(quarantine, f"SELECT {', '.join(LINEAGE)} FROM t"), True)
    history = pipeline_history(cfg.table_location, table, cfg.name)
    skipped = skipped_ranges(history)
    rewritten, unlocated = rewritten_by_others(cfg.table_location, table, cfg.table.partition_by)
    report = AuditReport(cfg.name, [_audit_partition(cfg, r, rows, quarantined, skipped, rewritten) for r in ranges])
    report.continuity = continuity_issues(history)
    report.sanity = sanity_issues(ledger.offsets, cluster.end_offsets(tps, cfg.kafka.isolation_level)) + [
        f"version {v}: {op} by another writer changed rows, and its log entry is gone (log clean-up): "
        f"its rows cannot be located; a backfill of the whole table mends them"
        for v, op in unlocated
    ]
    return report


# Another writer's operations that change rows in place (a DELETE leaves offsets missing: found as such).
ROW_REWRITES = ("UPDATE", "MERGE")


def rewritten_by_others(
    location: Location, table: DeltaTable, partition_by: list[str]
) -> tuple[dict[TP, set[int]], list[tuple[int, str]]]:
    """({partition: offsets of rows in files another writer's UPDATE or MERGE added, still in the table},
    [(version, operation) of such commits whose log entry is gone]). offsetlake's own MERGEs (upsert mode)
    carry its commit metadata and are not another writer's."""
    theirs = [
        (h["version"], h["operation"])
        for h in despite_log_cleanup(table.history)
        if h.get("operation") in ROW_REWRITES and CommitMetadata.parse(h.get("userMetadata")) is None
    ]
    if not theirs:
        return {}, []
    live = {from_delta_path(a["path"]): a for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
    suspect, unlocated = set(), []
    for version, operation in theirs:
        added = files_added_in(location, version)
        if added is None:
            unlocated.append((version, operation))
        else:
            suspect |= added & live.keys()
    lineage_partitions = [c for c in partition_by if c in LINEAGE_SCHEMA.names]  # the only ones read back
    offsets: dict[TP, set[int]] = {}
    for path in suspect:
        values = action_partition_values(live[path], lineage_partitions)
        rows = read_with_partitions(location, path, values, LINEAGE_SCHEMA)
        where = (rows.column(c).to_pylist() for c in ("kafka_topic", "kafka_partition", "kafka_offset"))
        for topic, partition, offset in zip(*where):
            offsets.setdefault((topic, partition), set()).add(offset)
    return offsets, unlocated


def _lineage_counts(location: Location, read: Callable[[], pa.Table], missing_ok: bool = False) -> dict[TP, Counter]:
    try:
        lineage = read()
    except (TableError, TableNotFoundError):
        if missing_ok:
            return {}
        raise
    out: dict[TP, Counter] = {}
    grouped = lineage.group_by(["kafka_topic", "kafka_partition", "kafka_offset"]).aggregate([([], "count_all")])
    for topic, partition, offset, n in zip(*(grouped.column(i).to_pylist() for i in range(4))):
        out.setdefault((topic, partition), Counter())[offset] = n
    return out


def _kafka_offsets(cfg: PipelineConfig, rng: OffsetRange) -> list[int]:
    offsets: list[int] = []
    for batch in read_range(cfg.kafka, f"{cfg.consumer_group}.audit", rng, cfg.batch.read_timeout_seconds):
        offsets.extend(batch.column("kafka_offset").to_pylist())
    return offsets


def skipped_ranges(history: list[HistoryEntry]) -> dict[TP, list[tuple[int, int]]]:
    """Offsets the ledger jumped over on purpose: forward resets and losses recorded with on_data_loss: skip."""
    out: dict[TP, list[tuple[int, int]]] = {}
    for h in history:
        if h.meta.kind == "reset":
            before = unflat_offsets(h.meta.from_)
            for tp, to in unflat_offsets(h.meta.offsets).items():
                if tp in before and to > before[tp]:
                    out.setdefault(tp, []).append((before[tp], to))
        for t, parts in h.meta.lost.items():
            for p, (lo, hi) in parts.items():
                out.setdefault((t, int(p)), []).append((lo, hi))
    return out


def _audit_partition(
    cfg: PipelineConfig, rng: OffsetRange, table_rows: dict, quarantined: dict, skipped: dict, rewritten: dict
) -> PartitionAudit:
    kafka = set(_kafka_offsets(cfg, rng))
    rows = {o: n for o, n in table_rows.get((rng.topic, rng.partition), Counter()).items() if rng.start <= o < rng.end}
    bad = {o: n for o, n in quarantined.get((rng.topic, rng.partition), Counter()).items() if rng.start <= o < rng.end}
    seen = Counter(rows) + Counter(bad)
    spans = skipped.get((rng.topic, rng.partition), [])
    absent = kafka - set(seen)
    excused = {o for o in absent if any(lo <= o < hi for lo, hi in spans)}
    return PartitionAudit(
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        kafka_records=len(kafka),
        table_rows=sum(rows.values()),
        quarantined=sum(bad.values()),
        missing=sorted(absent - excused),
        skipped=len(excused),
        duplicated=sorted(o for o, n in seen.items() if n > 1 and o in kafka),
        unexpected=sorted(o for o in seen if o not in kafka),
        rewritten=sorted(o for o in rewritten.get((rng.topic, rng.partition), ()) if o in rows and o in kafka),
    )


def repair(
    spark: Any,
    cfg: PipelineConfig,
    run: Run | None = None,
    dry_run: bool = False,
    report: AuditReport | UpsertAuditReport | None = None,
) -> tuple[AuditReport | UpsertAuditReport, Any]:
    """Audit (unless `report` is one just made), then backfill every span with a problem (upsert mode:
    rebuild the table from the fold). Returns (audit before, backfill or rebuild result, or None)."""
    import msgspec

    from offsetlake.operations.backfill import backfill

    if report is None:
        report = audit(cfg, spark=spark)
    if isinstance(report, UpsertAuditReport):  # upsert mode: the table rebuilt from the fold, in one commit
        return report, None if report.ok else rebuild(cfg, report, run, dry_run, spark)
    ranges = report.repair_ranges()
    if not ranges:
        return report, None
    try:
        return report, backfill(
            spark, cfg, ranges, msgspec.structs.replace(run or Run.here(), via="repair"), dry_run=dry_run
        )
    except OffsetlakeError as err:
        raise OffsetlakeError(f"repair could not backfill what audit found: {err}") from err
