"""A round over a pipeline's tables (a table per topic): a few at a time in one Spark session.

Each table's batch is mostly waiting: on its Spark job (whose tasks may use fewer cores than the session
has, one per Kafka partition of the range), on the broker, on the object store. Working on several tables
at once lets their jobs share the session's cores; each table still commits, fails and retries on its own,
through its own ledger, so nothing about exactly-once changes. `batch.tables_at_once` bounds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class NotStarted:
    """The place of an item a round did not start: `stop` was set before its turn came."""


NOT_STARTED = NotStarted()


def each_at_once(
    items: list[Item],
    work: Callable[[Item], Result],
    at_once: int,
    stop: threading.Event | None = None,
) -> list[Result | BaseException | NotStarted]:
    """`work(item)` for each item, at most `at_once` at a time; in the items' order, what each returned or
    raised, or NOT_STARTED for an item whose turn came after `stop` was set. One at a time runs in the
    calling thread, item after item, as a loop would."""

    def attempt(item: Item) -> Result | BaseException | NotStarted:
        if stop is not None and stop.is_set():
            return NOT_STARTED
        try:
            return work(item)
        except Exception as err:  # noqa: BLE001 - handed back in its place: the caller decides per item
            return err

    if at_once <= 1 or len(items) <= 1:
        return [attempt(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(at_once, len(items)), thread_name_prefix="offsetlake-table") as pool:
        return list(pool.map(attempt, items))


def one_at_a_time(report: Callable[[Item], None]) -> Callable[[Item], None]:
    """`report` called by one table's thread at a time: a line printed by two at once would interleave
    (print writes the text and its newline apart)."""
    lock = threading.Lock()

    def locked(item: Item) -> None:
        with lock:
            report(item)

    return locked
