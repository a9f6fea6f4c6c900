"""Plan one batch: which offset range of each partition it reads. Pure logic, runs on the driver.

start = the ledger's next offset (first batch: `starting_offsets`; a partition
the ledger has never seen: its earliest offset). end = the end offset taken at
plan time (LSO under read_committed), capped so the whole batch stays within
`max_records_per_batch`. Offsets are counted as span (end - start), never as
records: markers and aborted records take offsets too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offsetlake.errors import DataLossError
from offsetlake.kafka import TP
from offsetlake.protocol.metadata import Rewind
from offsetlake.protocol.ranges import OffsetRange


@dataclass
class BatchPlan:
    pipeline: str
    batch: int
    starts: dict[TP, int]  # the ledger this plan was made from (every partition)
    ends: dict[TP, int]  # the ledger after this batch commits (every partition)
    ledger_offsets: dict[TP, int | None] = field(default_factory=dict)  # as read, before defaults
    lost: dict[TP, tuple[int, int]] = field(default_factory=dict)
    rewind: Rewind | None = None  # a RESTORE moved the ledger back: this batch records it
    initialises: bool = False  # first batch with starting_offsets=latest: pin the position

    @property
    def ranges(self) -> list[OffsetRange]:
        return [
            OffsetRange(t, p, self.starts[(t, p)], self.ends[(t, p)])
            for (t, p) in sorted(self.ends)
            if self.ends[(t, p)] > self.starts[(t, p)]
        ]

    @property
    def span(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def needs_commit(self) -> bool:
        return bool(self.ranges or self.lost or self.rewind or self.initialises)


def start_offsets(
    ledger_offsets: dict[TP, int], first_batch: bool, starting: str, log_starts: dict[TP, int], ends: dict[TP, int]
) -> dict[TP, int]:
    starts = {}
    for tp in ends:
        if tp in ledger_offsets:
            starts[tp] = ledger_offsets[tp]
        elif first_batch and starting == "latest":
            starts[tp] = ends[tp]
        else:
            starts[tp] = log_starts[tp]
    return starts


def apply_data_loss(
    starts: dict[TP, int], log_starts: dict[TP, int], policy: str
) -> tuple[dict[TP, int], dict[TP, tuple[int, int]]]:
    """Offsets below the log start were deleted before being ingested: fail, or skip and record."""
    lost = {tp: (starts[tp], log_starts[tp]) for tp in starts if starts[tp] < log_starts[tp]}
    if lost and policy == "fail":
        (topic, partition), (lo, hi) = sorted(lost.items())[0]
        more = f" (and {len(lost) - 1} more partitions)" if len(lost) > 1 else ""
        raise DataLossError(
            f"records lost: {topic}[{partition}] offsets [{lo}, {hi}) were deleted from Kafka "
            f"before being ingested{more}; set on_data_loss: skip to record the loss and go on"
        )
    return {tp: max(starts[tp], log_starts[tp]) for tp in starts}, lost


def cap_ends(starts: dict[TP, int], ends: dict[TP, int], max_records: int) -> dict[TP, int]:
    """Share `max_records` of offset span fairly among partitions with a backlog (water-filling)."""
    backlog = {tp: max(0, ends[tp] - starts[tp]) for tp in starts}
    grant = {tp: 0 for tp in starts}
    remaining = max_records
    active = sorted(tp for tp, n in backlog.items() if n > 0)
    while remaining > 0 and active:
        share = max(1, remaining // len(active))
        for tp in active:
            give = min(share, backlog[tp] - grant[tp], remaining)
            grant[tp] += give
            remaining -= give
            if remaining == 0:
                break
        active = [tp for tp in active if grant[tp] < backlog[tp]]
    return {tp: starts[tp] + grant[tp] for tp in starts}


def split_ranges(ranges: list[OffsetRange], max_per_task: int) -> list[OffsetRange]:
    """Tasks: each reads one slice of one partition, at most `max_per_task` offsets."""
    tasks = []
    for r in ranges:
        for lo in range(r.start, r.end, max_per_task):
            tasks.append(OffsetRange(r.topic, r.partition, lo, min(lo + max_per_task, r.end)))
    return tasks


def assign_slots(sizes: list[int], slots: int | None) -> list[list[int]]:
    """The tasks (indexes into `sizes`, their record counts) that each of `slots` Spark tasks runs, in
    order: the largest first, each to the slot with the fewest records so far, so the slots finish
    together. None (slots unknown) or at least one slot per task: one task each, as Spark would."""
    if slots is None or slots >= len(sizes):
        return [[i] for i in range(len(sizes))]
    load = [0] * slots
    assigned: list[list[int]] = [[] for _ in range(slots)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        slot = min(range(slots), key=lambda s: (load[s], s))
        load[slot] += sizes[i]
        assigned[slot].append(i)
    return [sorted(tasks) for tasks in assigned]
