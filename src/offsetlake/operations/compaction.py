"""Compaction: many small data files become a few large ones, committed as a rearrangement.

Every batch adds at least one file per task; a stream at a 5-second interval adds
thousands a day, and every reader pays for every file. `optimize` bin-packs the
files below the target size, per partition, into new files (sorted by the
z-order columns, when given), and commits them through the one commit path:
the small files removed and the new ones added, all with `dataChange=false`
(readers and change feeds see no new data), no `txn` actions (the ledger is
untouched). A batch, backfill or another optimize that commits first makes the
commit fail and us decide again: files already compacted are reused when their
sources are all still in the new snapshot, so a busy stream does not starve it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction, RemoveAction

from offsetlake.protocol.commit import Change, Committed, Settled, attempt_files, commit, new_attempt_id
from offsetlake.protocol.metadata import CommitMetadata, Records, Run
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import (
    DataFile,
    action_partition_values,
    conform,
    from_delta_path,
    read_file,
    write_file,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

MB = 1024 * 1024


@dataclass
class OptimizeResult:
    table: Location
    version: int | None
    files_removed: int = 0
    files_added: int = 0
    rows: int = 0

    def summary(self) -> str:
        if self.version is None:
            return f"{self.table}: nothing to compact"
        return (
            f"{self.table}: compacted {self.files_removed} files into {self.files_added} "
            f"({self.rows} rows) in table version {self.version}"
        )


def optimize(
    location: Location,
    pipeline: str,
    schema: pa.Schema,
    partition_by: list[str],
    target_file_mb: int,
    zorder_by: Sequence[str] = (),
    only: set[str] | None = None,
    run: Run | None = None,
) -> OptimizeResult:
    """Compact the files of `location` smaller than the target (of those in `only`, when given)."""
    attempt, run = new_attempt_id(), run or Run.here()
    written: dict[frozenset[str], DataFile] = {}  # compacted files by their sources, reused across decisions

    def decide(table: DeltaTable) -> Change | Settled:
        bins = _bins(pa.table(table.get_add_actions(flatten=True)), partition_by, target_file_mb * MB, only)
        if not bins:
            return Settled("nothing_to_do", "no partition has two files below the target size")
        removes, adds, rows = [], [], 0
        now = int(time.time() * 1000)
        in_files = pa.schema([f for f in pa.schema(table.schema()) if f.name not in partition_by])
        for _i, files in enumerate(bins):
            sources = frozenset(f["path"] for f in files)
            if sources not in written:
                tag = f"{attempt}-{len(written):05d}"
                written[sources] = _compact(location, files, in_files, partition_by, zorder_by, tag)
                attempt_written.written[location].add(written[sources].path)
            new = written[sources]
            adds.append(AddAction(new.path, new.size, new.partition_values, new.modification_time, False, new.stats))
            removes += [
                RemoveAction(f["path"], False, now, f["size_bytes"], action_partition_values(f, partition_by) or None)
                for f in files
            ]
            rows += new.num_records
        meta = CommitMetadata(pipeline, "optimize", attempt=attempt, records=Records(rows=rows), run=run)
        return Change(meta, [*removes, *adds], schema=schema, partition_by=partition_by)

    with attempt_files(attempt, location) as attempt_written:
        outcome = commit(location, decide, "optimize", rewrites=True)
        if not isinstance(outcome, Committed):
            return OptimizeResult(location, None)
        attempt_written.kept[location] = outcome.added_paths()
    actions = outcome.change.actions
    added = [a for a in actions if isinstance(a, AddAction)]
    return OptimizeResult(
        location, outcome.version, len(actions) - len(added), len(added), outcome.change.metadata.records.rows
    )


def _bins(actions: pa.Table, partition_by: list[str], target: int, only: set[str] | None = None) -> list[list[dict]]:
    """Files below `target` bytes (and in `only`), grouped by partition, packed in path order into bins of
    up to `target` bytes; only bins of two files or more (one file alone is as compact as it gets)."""
    small = [f for f in actions.to_pylist() if f["size_bytes"] < target and (only is None or f["path"] in only)]
    by_partition: dict[tuple, list[dict]] = {}
    for f in sorted(small, key=lambda f: f["path"]):
        by_partition.setdefault(tuple(f.get(f"partition.{c}") for c in partition_by), []).append(f)
    bins: list[list[dict]] = []
    for files in by_partition.values():
        current: list[dict[str, Any]] = []
        size = 0
        for f in files:
            if current and size + f["size_bytes"] > target:
                bins.append(current)
                current, size = [], 0
            current.append(f)
            size += f["size_bytes"]
        bins.append(current)
    return [b for b in bins if len(b) >= 2]


def _compact(
    location: Location,
    files: list[dict],
    schema: pa.Schema,
    partition_by: list[str],
    zorder_by: Sequence[str],
    tag: str,
) -> DataFile:
    """One file of `files`' rows, each file's conformed to the table's `schema` first: files another writer
    wrote may type a column otherwise (Spark writes timestamps as INT96, read back without a zone), and
    older files lack the columns added since (null in them, as Delta reads them)."""
    rows = pa.concat_tables([conform(read_file(location, f["path"]), schema) for f in files])
    if zorder_by:
        rows = rows.take(zorder_indices(rows, zorder_by))
    directory = from_delta_path(files[0]["path"]).rpartition("/")[0]
    name = f"part-compact-{tag}.zstd.parquet"
    return write_file(
        location, f"{directory}/{name}" if directory else name, rows, action_partition_values(files[0], partition_by)
    )


def zorder_indices(rows: pa.Table, columns: Sequence[str]) -> pa.Array:
    """Row order along a Z-order (Morton) curve over `columns`: each column's dense rank, scaled to the
    same number of bits, bits interleaved. Rows close in all the columns end up close in the file, so
    min/max statistics skip files for filters on any of them, not only the first."""
    bits = min(64 // len(columns), 20)
    top = (1 << bits) - 1
    code = np.zeros(rows.num_rows, dtype=np.uint64)
    for i, column in enumerate(columns):
        rank = pc.rank(rows[column].combine_chunks(), sort_keys="ascending", tiebreaker="dense")
        rank = rank.to_numpy().astype(np.float64) - 1
        scaled = np.floor(rank / max(rank.max(initial=0), 1) * top).astype(np.uint64)
        for b in range(bits):
            code |= ((scaled >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * len(columns) + i)
    return pc.sort_indices(pa.array(code))
