"""Every change of a pipeline's table becomes an Asset event payload (`offsetlake.operations.changes`), and the
Asset watcher (`TableChangeTrigger`, run here as the triggerer runs it) yields them as they land.
Real broker, real Spark, real Delta tables on disk."""

from __future__ import annotations

import asyncio
import threading
import time

from deltalake import DeltaTable

from offsetlake.airflow.triggers import TableChangeTrigger
from offsetlake.formats.columns import table_schema
from offsetlake.operations.audit import repair
from offsetlake.operations.backfill import backfill
from offsetlake.operations.changes import announcements, commits_after
from offsetlake.operations.compaction import optimize
from offsetlake.operations.maintenance import reset, restore
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.streaming import stream
from support import ledger_offsets, pipeline_commits, produce


def test_every_kind_of_change_is_announced_with_its_versions_and_ranges(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=300, ingest=True)
    produce(cfg.kafka, topic, 200, seed=7)
    stopped = threading.Event()
    stream(spark, cfg, stopped, interval=0.2, max_seconds=1)  # at least one batch: the 200 records
    backfill(spark, cfg, [OffsetRange(topic, 0, 10, 50)])
    DeltaTable(cfg.table_path).delete("kafka_partition = 1 AND kafka_offset < 20")  # another writer
    repair(spark, cfg)
    optimize(cfg.table_location, cfg.name, table_schema(cfg), [], 64)
    end = ledger_offsets(cfg)[(topic, 0)]
    reset(cfg, {(topic, 0): end}, "nothing skipped: a reset to where it is")
    restore(cfg, DeltaTable(cfg.table_path).version() - 1)

    commits = commits_after(cfg.table_location, -1)
    events = announcements(cfg.name, cfg.table_path, commits)

    assert [c.version for c in commits] == list(range(DeltaTable(cfg.table_path).version() + 1))
    assert [e["kind"] for e in events] == [
        "create",
        "ingest",
        "stream",
        "backfill",
        "other",
        "repair",
        "optimize",
        "reset",
        "restore",
    ]
    repaired = next(h for h in pipeline_commits(cfg) if h.version == events[5]["versions"][0])
    assert repaired.meta.kind == "backfill" and repaired.meta.run.via == "repair"
    assert events[4]["operation"] == "DELETE"
    assert [v for e in events for v in e["versions"]] == [c.version for c in commits]  # each once, in order
    assert events[3]["ranges"] == {topic: {"0": [10, 50]}}
    streamed = [h for h in pipeline_commits(cfg) if h.version in events[2]["versions"]]
    assert streamed and all(h.meta.run.via == "stream" and h.meta.seconds > 0 for h in streamed)
    assert events[2]["rows"] == sum(h.meta.records.rows for h in streamed) == 200
    for partition in ("0", "1"):
        spans = [h.meta.ranges[topic][partition] for h in streamed if partition in h.meta.ranges[topic]]
        assert events[2]["ranges"][topic][partition] == [spans[0][0], spans[-1][1]]
    ingested = next(h for h in pipeline_commits(cfg) if h.version == events[1]["versions"][0])
    # It caught up in one batch: the lag it was planned against is exactly what it read.
    assert ingested.meta.lag == sum(e - s for s, e in ingested.meta.ranges[topic].values()) > 300


async def _started(trigger: TableChangeTrigger, timeout: float = 60) -> None:
    """Until the trigger has read the version it announces after (its first step)."""
    deadline = time.monotonic() + timeout
    while trigger.announced_version is None:
        assert time.monotonic() < deadline, f"the trigger did not read {trigger.table} in {timeout} s"
        await asyncio.sleep(0.02)


def test_the_watcher_yields_an_event_for_commits_made_after_it_started(spark, pipeline):
    cfg, topic = pipeline(partitions=2, records=200, ingest=True)
    before = DeltaTable(cfg.table_path).version()

    async def first_event():
        trigger = TableChangeTrigger(pipeline=cfg.name, table=cfg.table_path, poll_seconds=0.2)
        events = trigger.run()
        waiting = asyncio.ensure_future(anext(events))
        await _started(trigger)
        assert trigger.announced_version == before and not waiting.done()  # it announces what comes after
        await asyncio.to_thread(backfill, spark, cfg, [OffsetRange(topic, 1, 0, 30)])
        event = await asyncio.wait_for(waiting, timeout=60)
        await events.aclose()
        return event, trigger.serialize()

    event, serialized = asyncio.run(first_event())

    assert event.payload == {
        "pipeline": cfg.name,
        "table": cfg.table_path,
        "kind": "backfill",
        "versions": [before + 1],
        "ranges": {topic: {"1": [0, 30]}},
        "rows": pipeline_commits(cfg)[-1].meta.records.rows,
        "quarantined": 0,
    }
    assert serialized == (
        "offsetlake.airflow.triggers.TableChangeTrigger",
        {"pipeline": cfg.name, "table": cfg.table_path, "poll_seconds": 0.2},
    )
