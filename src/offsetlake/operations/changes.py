"""The table's changes as Airflow announces them: every commit after a version, grouped into Asset events.

One event per run of consecutive commits of one kind (a stream's batches since the last look, one
backfill, an optimize...), so a downstream DAG gets one event per change rather than one per
micro-batch, and every event says exactly what changed: the pipeline, the kind, the Delta versions
and the offset ranges. Commits by other writers (a Spark job appending, a `RESTORE` in delta-rs)
change the table too: they are announced as kind `other` with their Delta operation (the table's
creation, as kind `create`).
"""

from __future__ import annotations

from dataclasses import dataclass

from deltalake.exceptions import TableNotFoundError

from offsetlake.protocol.metadata import CommitMetadata
from offsetlake.storage.location import Location

MAX_VERSIONS_PER_EVENT = 200  # after a long pause of the watcher, a backlog comes as several events


@dataclass(frozen=True)
class TableCommit:
    version: int
    timestamp: int  # epoch ms
    operation: str | None
    meta: CommitMetadata | None  # None: not an offsetlake commit
    merged: dict[str, int] | None = None  # a MERGE (upsert mode): its rows inserted, updated, deleted

    @property
    def kind(self) -> str:
        if self.meta:
            return self.meta.change
        return "create" if self.operation == "CREATE TABLE" else "other"


def table_version(location: Location) -> int | None:
    """The table's current version; None while there is no table."""
    try:
        return location.delta_table().version()
    except TableNotFoundError:
        return None


def commits_after(location: Location, version: int) -> list[TableCommit]:
    """Every commit of the table after `version`, oldest first (any writer's); [] while there is no table.
    A table now older than `version` was deleted and created again: all its commits are new."""
    try:
        table = location.delta_table()
    except TableNotFoundError:
        return []
    newest = table.version()
    if newest < version:
        version = -1
    if newest == version:
        return []
    entries = table.history(limit=newest - version)
    commits = [
        TableCommit(
            e["version"],
            e.get("timestamp", 0),
            e.get("operation"),
            CommitMetadata.parse(e.get("userMetadata")),
            merge_counts(e),
        )
        for e in entries
        if e.get("version", -1) > version
    ]
    return sorted(commits, key=lambda c: c.version)


MERGE_COUNTS = ("inserted", "updated", "deleted")


def merge_counts(entry: dict) -> dict[str, int] | None:
    """A MERGE commit's rows inserted, updated and deleted, from the metrics Delta keeps in its commitInfo."""
    if entry.get("operation") != "MERGE":
        return None
    metrics = entry.get("operationMetrics") or {}
    return {k: int(metrics.get(f"num_target_rows_{k}", 0)) for k in MERGE_COUNTS}


def announcements(pipeline: str, table: str, commits: list[TableCommit]) -> list[dict]:
    """Asset event payloads for `commits` (oldest first): one per run of consecutive commits of one kind."""
    events: list[dict] = []
    for commit in commits:
        last = events[-1] if events else None
        if last is None or last["kind"] != commit.kind or len(last["versions"]) >= MAX_VERSIONS_PER_EVENT:
            last = {
                "pipeline": pipeline,
                "table": table,
                "kind": commit.kind,
                "versions": [],
                "ranges": {},
                "rows": 0,
                "quarantined": 0,
            }
            events.append(last)
        last["versions"].append(commit.version)
        if commit.meta is None:
            last["operation"] = commit.operation
            continue
        last["rows"] += commit.meta.records.rows
        last["quarantined"] += commit.meta.records.quarantined
        if commit.merged is not None:  # upsert mode: what the batches did to the table's rows
            for count in MERGE_COUNTS:
                last[count] = last.get(count, 0) + commit.merged[count]
        merge_ranges(last["ranges"], commit.meta.ranges)
    return events


def merge_ranges(into: dict, ranges: dict) -> None:
    """Per partition, from the first start to the last end: a stream's consecutive batches tile them."""
    for topic, parts in ranges.items():
        for partition, (start, end) in parts.items():
            known = into.setdefault(topic, {}).get(partition)
            into[topic][partition] = [min(known[0], start), max(known[1], end)] if known else [start, end]
