"""`TableChangeTrigger`: the Asset watcher that turns every commit of a pipeline's table into an Asset event.

A task's outlets announce only what the task itself did, when it ends; a stream runs for an hour,
and maintenance, restores, resets and other writers change the table too. So the table announces
itself: this trigger runs in Airflow's triggerer (event-driven scheduling, an `AssetWatcher` on the
table's Asset, see `dags.table_asset`), looks at the Delta log every `poll_seconds`, and yields one
event per run of consecutive commits of one kind (`offsetlake.operations.changes.announcements`). Airflow
records it as an Asset event whose `extra["payload"]` is {pipeline, table, kind, versions, ranges,
rows, quarantined} (and, for upsert batches, the rows inserted, updated and deleted), and starts the
DAGs scheduled on the Asset.

Where it left off (the last version announced) is kept in the Asset's state store, so a restarted
triggerer goes on from there: no commit is skipped and none announced twice, unless the triggerer
dies between yielding an event and storing the version (then that event comes again). A watcher
that finds no stored version starts at the table's current version: it announces what happens from
now on, not the table's whole past. Airflow runs a watcher only while an unpaused DAG is scheduled
on its Asset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from offsetlake.storage.location import Location

log = logging.getLogger("offsetlake.airflow.triggers")
CURSOR = "offsetlake_announced_version"


class TableChangeTrigger(BaseEventTrigger):
    """Yield an event for every change of `table` (the Delta table of `pipeline`).

    :param pipeline: the pipeline's name, written into every event.
    :param table: the table's path or URI.
    :param poll_seconds: how often the Delta log is looked at.
    """

    def __init__(self, pipeline: str, table: str, poll_seconds: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline, self.table, self.poll_seconds = pipeline, table, poll_seconds
        self._cursor: int | None = None  # where this process is, when there is no state store (tests)

    @property
    def announced_version(self) -> int | None:
        """The last version announced (at first, the version it started at); None until it looked."""
        return self._cursor

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"pipeline": self.pipeline, "table": self.table, "poll_seconds": self.poll_seconds},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from offsetlake.operations.changes import announcements, commits_after, table_version

        location = await asyncio.to_thread(self._location)
        announced = await self._load_cursor()
        if announced is None:
            announced = await asyncio.to_thread(table_version, location)
            announced = -1 if announced is None else announced
            await self._store_cursor(announced)
        while True:
            try:
                commits = await asyncio.to_thread(commits_after, location, announced)
            except Exception as err:  # noqa: BLE001 - a table being restored or briefly unreachable: look again
                log.warning(
                    "offsetlake %s: could not read %s (%s); looking again in %ss",
                    self.pipeline,
                    self.table,
                    err,
                    self.poll_seconds,
                )
                commits = []
            for payload in announcements(self.pipeline, self.table, commits):
                yield TriggerEvent(payload)
            if commits:
                announced = commits[-1].version
                await self._store_cursor(announced)
            await asyncio.sleep(self.poll_seconds)

    def _location(self) -> Location:
        """The triggerer is a process of its own: the table's storage options (and table.connection's
        credentials) come from loading the pipeline here. A pipeline that cannot be loaded now leaves the
        table on the store's defaults (a local table needs none); each poll says what fails."""
        from offsetlake.config import load_pipeline
        from offsetlake.config.connections import resolve_connections
        from offsetlake.config.model import effective_storage_options

        try:
            cfg = resolve_connections(load_pipeline(self.pipeline))
        except Exception as err:  # noqa: BLE001 - the watcher keeps running; the poll's error names the table
            log.warning("offsetlake %s: pipeline not loaded in the triggerer (%s)", self.pipeline, err)
            return Location.of(self.table)
        return Location.of(self.table, effective_storage_options(cfg.table))  # a table per topic: the same

    async def _load_cursor(self) -> int | None:
        if self.asset_state_store is None:
            return self._cursor
        value = await self.asset_state_store.aget(CURSOR)
        return int(value) if isinstance(value, (int, float, str)) and str(value).lstrip("-").isdigit() else None

    async def _store_cursor(self, version: int) -> None:
        self._cursor = version
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(CURSOR, version)
