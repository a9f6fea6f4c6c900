"""Read-only views of a pipeline: lag per partition (ledger vs Kafka) and committed history."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from deltalake.exceptions import TableNotFoundError

from offsetlake.config import PipelineConfig
from offsetlake.kafka import KafkaCluster
from offsetlake.operations.changes import merge_ranges
from offsetlake.protocol.ledger import pipeline_history, read_ledger
from offsetlake.protocol.metadata import HistoryEntry
from offsetlake.table import open_table


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    committed: int | None  # next offset the ledger will read; None: never ingested
    log_start: int
    end: int  # LSO under read_committed, high watermark otherwise
    lag: int

    def as_dict(self) -> dict:
        return asdict(self)


def status(cfg: PipelineConfig) -> list[PartitionStatus]:
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    ends = cluster.end_offsets(tps, cfg.kafka.isolation_level)
    starts = cluster.start_offsets(tps)
    try:
        offsets = read_ledger(cfg.table_location, open_table(cfg.table_location), cfg.name, tps).offsets
    except Exception as err:  # no table yet: everything is lag
        if not _is_missing_table(err):
            raise
        offsets = {}
    rows = []
    for tp in tps:
        committed = offsets.get(tp)
        base = committed if committed is not None else starts[tp]
        rows.append(PartitionStatus(tp[0], tp[1], committed, starts[tp], ends[tp], max(0, ends[tp] - base)))
    return rows


def _is_missing_table(err: Exception) -> bool:
    return isinstance(err, TableNotFoundError) or "no Delta table at" in str(err)


def history(cfg: PipelineConfig, limit: int | None = None) -> list[HistoryEntry]:
    return pipeline_history(cfg.table_location, open_table(cfg.table_location), cfg.name, limit)


def format_status(rows: list[PartitionStatus]) -> str:
    header = f"{'topic':<24} {'part':>4} {'committed':>10} {'log start':>10} {'end (LSO)':>10} {'lag':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        committed = "-" if r.committed is None else str(r.committed)
        lines.append(f"{r.topic:<24} {r.partition:>4} {committed:>10} {r.log_start:>10} {r.end:>10} {r.lag:>8}")
    lines.append(f"total lag: {sum(r.lag for r in rows)}")
    return "\n".join(lines)


def format_history(rows: list[HistoryEntry]) -> str:
    header = f"{'version':>7}  {'batch':>5}  {'kind':<8} {'rows':>8} {'quar.':>6}  ranges"
    lines = [header, "-" * 80]
    for h in rows:
        meta = h.meta
        ranges = ranges_text(meta.ranges)
        batch = "-" if meta.batch is None else meta.batch
        lines.append(
            f"{h.version:>7}  {batch!s:>5}  {meta.change:<8} {meta.records.rows:>8} "
            f"{meta.records.quarantined:>6}  {ranges or '(no new offsets)'}"
        )
        if meta.rewind:
            lines.append(f"{'':>7}  rewound after RESTORE of version {meta.rewind.restored_version}")
        if meta.lost:
            lines.append(f"{'':>7}  LOST (deleted before ingest): {meta.lost}")
    return "\n".join(lines)


def ranges_text(ranges: dict) -> str:
    """`topic[partition] start-end; ...`: a commit's ranges as `offsetlake history` and the view show them."""
    return "; ".join(f"{t}[{p}] {r[0]}-{r[1]}" for t, parts in ranges.items() for p, r in parts.items())


def commits_of_task_try(
    pipeline: str | PipelineConfig, dag_id: str, run_id: str, try_number: int | None, started_ms: int | None = None
) -> dict:
    """What one Airflow task try committed to the pipeline's table, read back from the table history
    (newest first, no further back than `started_ms`, when the try started).

    JSON-ready (it travels as XCom): the versions, kinds, rows, and the ranges merged per
    partition from the lowest start to the highest end (consecutive ingest batches tile them).

    `pipeline`: its name, or the pipeline as the task resolved it (its Airflow connections applied: loading
    it again by name would register the table's storage options without the connection's credentials).
    """
    from offsetlake.config import load_pipeline

    cfg = load_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    pipeline = cfg.name
    try:
        entries = pipeline_history(cfg.table_location, open_table(cfg.table_location), pipeline, since_ms=started_ms)
    except Exception as err:
        if not _is_missing_table(err):
            raise
        entries = []
    mine = [h for h in entries if h.meta.run.is_task_try(dag_id, run_id, try_number)]
    ranges: dict[str, dict[str, list[int]]] = {}
    for h in mine:
        merge_ranges(ranges, h.meta.ranges)
    return {
        "pipeline": pipeline,
        "table": cfg.table_path,
        "versions": [h.version for h in mine],
        "kinds": sorted({h.meta.kind for h in mine}),
        "rows": sum(h.meta.records.rows for h in mine),
        "ranges": ranges,
    }
