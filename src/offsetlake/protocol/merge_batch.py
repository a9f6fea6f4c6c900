"""An upsert batch's staging rows to the Merge its commit applies: the rows after the batch's last
TRUNCATE and snapshot end, the values primary-key changes left out carried over, one row per key."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from offsetlake.protocol.key_changes import (
    KeyChanges,
    OldRows,
    carry_across_key_changes,
    with_creates_deleting_old_keys,
)
from offsetlake.protocol.upsert import (
    Merge,
    SnapshotEnd,
    after_last_truncate,
    after_snapshot_end,
    latest_per_key,
    stale_as_deleted,
)


def merge_of_batch(
    rows: pa.Table,
    key: Sequence[str],
    order_by: str | None,
    unavailable: str | None,
    batch: int,
    old_rows: OldRows | None,
    deletes: bool = True,
) -> tuple[Merge, KeyChanges]:
    """The Merge of one batch's staging `rows`, and what its key changes took from older rows (`old_rows`:
    the table's rows of given keys; not asked after a TRUNCATE, which emptied the table). `deletes`: False
    under write.deletes ignore."""
    rows, truncated, snapshot_ends, moved = rows_to_apply(rows, key, order_by, unavailable, batch, old_rows, deletes)
    winners = latest_per_key(rows, key, order_by, batch, unavailable)
    winners = stale_as_deleted(winners, snapshot_ends)
    return Merge(winners, list(key), order_by, unavailable, truncated, snapshot_ends), moved


def rows_to_apply(
    rows: pa.Table,
    key: Sequence[str],
    order_by: str | None,
    unavailable: str | None,
    batch: int | None,
    old_rows: OldRows | None,
    deletes: bool,
) -> tuple[pa.Table, bool, tuple[SnapshotEnd, ...], KeyChanges]:
    """Staging rows as an upsert applies them, a batch's MERGE and audit's fold of a range alike: the rows
    after the last TRUNCATE (and whether there was one) and without the snapshot ends' markers (and those
    ends), each key change's delete applied by its create, the values key changes left out carried over from
    the rows before them (`old_rows`: the table's, or None)."""
    rows, truncated = after_last_truncate(rows, order_by, batch)
    rows, snapshot_ends = after_snapshot_end(rows)
    rows = with_creates_deleting_old_keys(rows, key, order_by, deletes)
    rows, moved = carry_across_key_changes(rows, key, order_by, unavailable, None if truncated else old_rows)
    return rows, truncated, snapshot_ends, moved
