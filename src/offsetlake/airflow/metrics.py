"""What the offsetlake view and its Prometheus endpoint show of a pipeline, gathered in one place.

`snapshot` reads a pipeline's lag (ledger vs Kafka's end offsets), its recent commits and the
table's version; `CommitTotals` counts what commits added since this process first looked (the
Prometheus counters: they start at 0 with the api-server, as counters do, and `rate()` is what
one reads of them). Both read the table's own history: each commit records its rows, quarantined
records, duration and commit conflicts in its userMetadata (`metadata.CommitMetadata`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from offsetlake.config import PipelineConfig
from offsetlake.errors import one_line
from offsetlake.kafka import topic_lister
from offsetlake.operations.changes import commits_after, table_version
from offsetlake.operations.status import PartitionStatus, history, status
from offsetlake.protocol.metadata import HistoryEntry

RECENT_COMMITS = 30
CHART_COMMITS = 200
LAST_INGEST_LOOKBACK = 50  # commits read back for the newest ingest's time when counting starts


@dataclass
class Snapshot:
    cfg: PipelineConfig
    partitions: list[PartitionStatus]
    # Each table's newest commits, oldest first (the pipeline's name for a single table's).
    by_table: dict[str, list[HistoryEntry]]
    version: int | None  # the table's, None before the first commit (or with a table per topic)
    error: str | None = None  # Kafka or the table could not be read: what was wrong
    tables: list[dict] = field(default_factory=list)  # a table per topic: each one's name, path, version, lag

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def commits(self) -> list[HistoryEntry]:
        """Every table's newest commits together, oldest first."""
        if len(self.by_table) == 1:
            return next(iter(self.by_table.values()))
        return sorted((h for commits in self.by_table.values() for h in commits), key=lambda h: h.timestamp)

    def series(self) -> dict[str, list[dict]]:
        """Per table (its name; the pipeline's for a single table), per ingest commit oldest first: when (Unix
        seconds), its version and batch, the lag when it was planned, its rows, quarantined records, seconds
        and rows per second, as its commit metadata holds them (what the view's charts draw)."""
        return {
            table: [_point(h) for h in commits if h.meta.kind == "ingest"] for table, commits in self.by_table.items()
        }


def _point(h: HistoryEntry) -> dict:
    rows, seconds = h.meta.records.rows, h.meta.seconds
    return {
        "t": h.timestamp / 1000,
        "version": h.version,
        "batch": h.meta.batch,
        "lag": h.meta.lag,
        "rows": rows,
        "quarantined": h.meta.records.quarantined,
        "seconds": seconds,
        "rows_per_second": round(rows / seconds, 1) if seconds else None,
    }


def snapshot(cfg: PipelineConfig, limit: int = CHART_COMMITS) -> Snapshot:
    """Lag, the newest `limit` commits (none for `limit=0`) and the table's version. A pipeline with a
    table per topic: every table's partitions and commits together (each partition names its topic),
    and each table's own figures in `tables`."""
    from offsetlake.config.connections import resolve_connections
    from offsetlake.config.topic_tables import pipeline_tables

    try:
        cfg = resolve_connections(cfg)  # kafka.connection, table.connection: read where the view runs
    except Exception as err:  # noqa: BLE001 - shown on the page, one line
        return Snapshot(cfg, [], {}, None, f"connections: {_line(err)}")
    try:
        tables = pipeline_tables(cfg, topic_lister(cfg.kafka))
    except Exception as err:  # noqa: BLE001
        return Snapshot(cfg, [], {}, None, f"Kafka: {_line(err)}")
    if tables[0].name is None:
        return table_snapshot(tables[0].cfg, limit)
    parts = [(t, table_snapshot(t.cfg, limit)) for t in tables]
    return Snapshot(
        cfg,
        [p for _, snap in parts for p in snap.partitions],
        {str(t.name): snap.commits for t, snap in parts},
        None,
        "; ".join(f"{t.name}: {snap.error}" for t, snap in parts if snap.error) or None,
        [
            {"name": t.name, "path": t.cfg.table_path, "version": snap.version, "lag": snap.total_lag}
            for t, snap in parts
        ],
    )


def table_snapshot(cfg: PipelineConfig, limit: int = CHART_COMMITS) -> Snapshot:
    """`snapshot` of one table (a single-table pipeline, connections resolved)."""
    partitions, commits, version, errors = [], [], None, []
    try:
        partitions = status(cfg)
    except Exception as err:  # noqa: BLE001 - shown on the page, one line
        errors.append(f"Kafka: {_line(err)}")
    try:
        version = table_version(cfg.table_location)
        commits = history(cfg, limit) if version is not None and limit else []
    except Exception as err:  # noqa: BLE001
        errors.append(f"table: {_line(err)}")
    return Snapshot(cfg, partitions, {cfg.name: commits}, version, "; ".join(errors) or None)


def _line(err: Exception) -> str:
    return (one_line(err) or type(err).__name__)[:300]


@dataclass
class Totals:
    rows: int = 0
    quarantined: int = 0
    conflicts: int = 0
    commits: dict[str, int] = field(default_factory=dict)  # by kind
    batch_seconds_sum: float = 0.0
    batches: int = 0
    last_batch_seconds: float | None = None
    last_ingest_ms: int | None = None  # the newest ingest commit's time (epoch ms), also from before counting


class CommitTotals:
    """Per pipeline, what the commits since this process first looked added (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}  # table path -> last version counted
        self._totals: dict[str, Totals] = {}

    def update(self, cfg: PipelineConfig) -> Totals:
        with self._lock:
            key = cfg.table_path  # a pipeline with a table per topic counts each table's
            totals = self._totals.setdefault(key, Totals())
            seen = self._seen.get(key)
            if seen is None:  # counting starts now: a counter's value is what happened while it ran
                current = table_version(cfg.table_location)
                self._seen[key] = -1 if current is None else current
                if current is not None:  # a time is a gauge: the newest ingest's, whenever it was
                    ingests = [h.timestamp for h in history(cfg, LAST_INGEST_LOOKBACK) if h.meta.kind == "ingest"]
                    totals.last_ingest_ms = max(ingests, default=None)
                return totals
            for commit in commits_after(cfg.table_location, seen):
                self._seen[key] = commit.version
                meta = commit.meta
                if meta is None or meta.pipeline != cfg.name:
                    continue
                totals.commits[meta.change] = totals.commits.get(meta.change, 0) + 1
                if meta.kind == "ingest":  # backfills replace rows, optimize rewrites them: not new records
                    totals.rows += meta.records.rows
                    totals.quarantined += meta.records.quarantined
                    totals.last_ingest_ms = commit.timestamp
                totals.conflicts += meta.conflicts
                if meta.seconds is not None:
                    totals.batch_seconds_sum += meta.seconds
                    totals.batches += 1
                    totals.last_batch_seconds = meta.seconds
            return totals


def labelled_tables(configs: list[PipelineConfig]) -> list[tuple[str, PipelineConfig, bool]]:
    """Each table the metrics describe: its `pipeline` label (the pipeline's name, or for a table per topic
    `pipeline/table`), its config, and whether that is already one table's with its connections resolved
    (the tables as of now; a pipeline whose tables cannot be listed keeps its name, and its snapshot says
    why)."""
    from offsetlake.config.connections import resolve_connections
    from offsetlake.config.topic_tables import per_topic, pipeline_tables

    out: list[tuple[str, PipelineConfig, bool]] = []
    for cfg in configs:
        if not per_topic(cfg):
            out.append((cfg.name, cfg, False))
            continue
        try:
            resolved = resolve_connections(cfg)
            out.extend((t.label, t.cfg, True) for t in pipeline_tables(resolved, topic_lister(resolved.kafka)))
        except Exception:  # noqa: BLE001 - offsetlake_up says it
            out.append((cfg.name, cfg, False))
    return out


PIPELINE = ["pipeline"]
PARTITION = ["pipeline", "topic", "partition"]
# What /offsetlake/metrics exposes: name, (type, help, labels). A counter's samples end in _total, a
# summary's in _sum and _count. The alert rules and the dashboard (monitoring/) read these names.
METRICS = {
    "offsetlake_lag_records": ("gauge", "Records in Kafka (to the LSO) not yet in the table", PARTITION),
    "offsetlake_pipeline_lag_records": ("gauge", "Sum of the lag over all partitions", PIPELINE),
    "offsetlake_committed_offset": ("gauge", "Next offset the ledger will read", PARTITION),
    "offsetlake_end_offset": ("gauge", "Kafka's end offset (LSO under read_committed)", PARTITION),
    "offsetlake_table_version": ("gauge", "The Delta table's version", PIPELINE),
    "offsetlake_up": ("gauge", "1 if Kafka and the table could be read", PIPELINE),
    "offsetlake_committed_records": ("counter", "Rows ingest batches committed", PIPELINE),
    "offsetlake_quarantined_records": ("counter", "Records quarantined", PIPELINE),
    "offsetlake_commit_conflicts": ("counter", "Commits that lost a race and decided again", PIPELINE),
    "offsetlake_commits": ("counter", "Commits, by kind", ["pipeline", "kind"]),
    "offsetlake_batch_duration_seconds": ("summary", "Batch time from plan to commit", PIPELINE),
    "offsetlake_last_batch_duration_seconds": ("gauge", "The newest batch's duration", PIPELINE),
    "offsetlake_last_ingest_timestamp_seconds": (
        "gauge",
        "When the newest ingest batch was committed (Unix time)",
        PIPELINE,
    ),
    "offsetlake_alert_max_lag_records": ("gauge", "alerts.max_lag_records (OffsetlakeLagHigh)", PIPELINE),
    "offsetlake_alert_max_quarantine_share": (
        "gauge",
        "alerts.max_quarantine_share (OffsetlakeQuarantineHigh)",
        PIPELINE,
    ),
    "offsetlake_alert_stall_seconds": (
        "gauge",
        "How long a stream may go without a commit while records wait (OffsetlakeStreamStalled)",
        PIPELINE,
    ),
    "offsetlake_last_run_failed": (
        "gauge",
        "1 if the newest finished run of the pipeline's DAG failed (OffsetlakeRunFailed)",
        ["pipeline", "dag_id"],
    ),
}


def prometheus_text(
    configs: list[PipelineConfig], totals: CommitTotals, last_runs: Callable[[str], dict[str, bool]] | None = None
) -> bytes:
    """The Prometheus text exposition of every pipeline's lag and commit counters (per table, for a
    pipeline with a table per topic: label `pipeline/table`), with the thresholds of its alert rules
    (`alerts`) beside them; `last_runs(pipeline)`: whether the newest finished run of each of its DAGs
    failed (Airflow's, where the endpoint runs in Airflow)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

    kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "summary": SummaryMetricFamily}

    class Collector:
        def collect(self):
            families = {name: kinds[kind](name, text, labels=labels) for name, (kind, text, labels) in METRICS.items()}
            for cfg in configs:
                for dag_id, was_failed in sorted((last_runs(cfg.name) if last_runs else {}).items()):
                    families["offsetlake_last_run_failed"].add_metric([cfg.name, dag_id], int(was_failed))
            for name, cfg, one_table in labelled_tables(configs):
                _add_table(families, name, cfg, one_table, totals)
            yield from families.values()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry)


def _add_table(families: dict, name: str, cfg: PipelineConfig, one_table: bool, totals: CommitTotals) -> None:
    """One table's samples, labelled `name`: its thresholds, its lag and version, its commits' counters."""

    def add(metric: str, labels: list[str], *value: float) -> None:
        families[metric].add_metric(labels, *value)

    if cfg.alerts.max_lag_records is not None:
        add("offsetlake_alert_max_lag_records", [name], cfg.alerts.max_lag_records)
    add("offsetlake_alert_max_quarantine_share", [name], cfg.alerts.max_quarantine_share)
    if cfg.mode == "stream":
        add("offsetlake_alert_stall_seconds", [name], cfg.alerts.stall_seconds(cfg.stream_interval_seconds))
    # limit 0: the counters read the commits themselves
    snap = table_snapshot(cfg, limit=0) if one_table else snapshot(cfg, limit=0)
    add("offsetlake_up", [name], 0 if snap.error else 1)
    for p in snap.partitions:
        labels = [name, p.topic, str(p.partition)]
        add("offsetlake_lag_records", labels, p.lag)
        add("offsetlake_end_offset", labels, p.end)
        if p.committed is not None:
            add("offsetlake_committed_offset", labels, p.committed)
    if snap.partitions:
        add("offsetlake_pipeline_lag_records", [name], snap.total_lag)
    if snap.version is not None:
        add("offsetlake_table_version", [name], snap.version)
    try:
        t = totals.update(cfg)
    except Exception:  # noqa: BLE001 - offsetlake_up already says the table could not be read
        return
    add("offsetlake_committed_records", [name], t.rows)
    add("offsetlake_quarantined_records", [name], t.quarantined)
    add("offsetlake_commit_conflicts", [name], t.conflicts)
    for kind, n in sorted(t.commits.items()):
        add("offsetlake_commits", [name, kind], n)
    add("offsetlake_batch_duration_seconds", [name], t.batches, t.batch_seconds_sum)
    if t.last_batch_seconds is not None:
        add("offsetlake_last_batch_duration_seconds", [name], t.last_batch_seconds)
    if t.last_ingest_ms is not None:
        add("offsetlake_last_ingest_timestamp_seconds", [name], t.last_ingest_ms / 1000)
