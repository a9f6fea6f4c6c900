"""Write Parquet data files into a table directory and describe them for a Delta `add` action.

Runs in executors. Files get unique names that carry the batch and the attempt
id, and live in ordinary (non-hidden) directories, so an attempt that never
commits leaves orphans that `cleanup` and the attempt itself can find by name.
Statistics (numRecords, min/max, nullCount) are computed from the Arrow data
already in memory, so the driver never re-reads a file to commit it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from offsetlake.errors import StorageError, one_line
from offsetlake.storage.location import Location, retrying

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
STRING_STATS_MAX = 32  # longer strings get no min/max: a truncated max would be wrong for skipping


@dataclass(frozen=True)
class DataFile:
    path: str  # relative to the table root, as Delta stores it
    size: int
    modification_time: int  # epoch ms
    partition_values: dict[str, str | None]
    stats: str
    num_records: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> DataFile:
        return DataFile(**json.loads(text))


def to_delta_path(relative: str) -> str:
    """Delta stores paths as URIs: what is on disk, percent-encoded once more."""
    return quote(relative, safe="/=")


def from_delta_path(path: str) -> str:
    return unquote(path)


def attempt_file_name(batch: int, attempt: str, task: int, task_attempt: int, part: int) -> str:
    """`attempt` names the driver's attempt at the batch (clean-up finds its files by it);
    `task_attempt` is Spark's id of this task attempt, so a retried or speculative copy of
    a task never writes the path its twin wrote."""
    return f"part-{batch:08d}-{attempt}-t{task:05d}-a{task_attempt}-{part:03d}.zstd.parquet"


def write_files(
    location: Location, table: pa.Table, partition_by: list[str], name_for_part: Callable[[int], str]
) -> list[DataFile]:
    """Write `table` (split by partition values) and return one DataFile per file written."""
    if table.num_rows == 0:
        return []
    written = []
    for part_no, (values, rows) in enumerate(_split_by_partition(table, partition_by)):
        rel_dir = "/".join(f"{quote(c, safe='')}={_dir_value(values[c])}" for c in partition_by)
        rel_path = f"{rel_dir}/{name_for_part(part_no)}" if rel_dir else name_for_part(part_no)
        data = rows.drop_columns(partition_by) if partition_by else rows
        written.append(write_file(location, rel_path, data, {c: _partition_string(values[c]) for c in partition_by}))
    return written


def write_file(location: Location, rel_path: str, data: pa.Table, partition_values: dict[str, str | None]) -> DataFile:
    """Write one Parquet file (data without partition columns) at `rel_path` under the table. On an object
    store a retriable error is retried until the table's retry bound; a local error fails at once."""
    fs, root = location.filesystem()
    full = f"{root.rstrip('/')}/{rel_path}"

    def write() -> tuple[int, pq.FileMetaData]:
        """The file's size, as the writer counted it (asking the store, a HEAD, would cost a request a
        file), and the footer it wrote."""
        try:
            if fs.type_name == "local":  # an object store has no directories: creating one costs 3 requests
                fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
            with fs.open_output_stream(full, compression=None) as sink:  # closed: the object is stored
                # A writer of our own rather than write_table's metadata_collector, which asks a writer that
                # failed for its footer and raises that RuntimeError instead of the failure (a full disk).
                with pq.ParquetWriter(
                    sink, data.schema, compression="zstd", compression_level=1, use_dictionary=dictionary_columns(data)
                ) as writer:
                    writer.write_table(data)
                size = sink.tell()
            return int(size), writer.writer.metadata  # the footer, as pyarrow's own close reads it
        except OSError:
            _delete_quietly(fs, full)  # no half-written file is left for the next attempt to trip on
            raise

    try:
        size, footer = retrying(location, write)
    except OSError as err:  # a full disk, a quota, permissions, a store away too long: name the path
        raise StorageError(f"cannot write {full}: {_os_reason(err)}") from err
    return DataFile(
        path=to_delta_path(rel_path),
        size=size,
        modification_time=int(time.time() * 1000),  # when it was written
        partition_values=dict(partition_values),
        stats=delta_stats(data, footer),
        num_records=data.num_rows,
    )


DICTIONARY_SAMPLE = 2000  # a column's first values, which say whether its values repeat


def dictionary_columns(data: pa.Table) -> list[str] | bool:
    """The columns to write with a dictionary: those of whose first DICTIONARY_SAMPLE values fewer than half
    are distinct. Parquet's writer otherwise starts a dictionary for every column and gives it up only once
    it outgrows its page (1 MiB), having hashed every value until then: an offset, an id, a timestamp of each
    record's own are unique. A table with a nested column keeps the writer's default (a nested column's
    dictionaries are its leaves', named by their paths)."""
    if any(pa.types.is_nested(f.type) for f in data.schema):
        return True
    chosen = []
    for name in data.column_names:
        sample = data.column(name).slice(0, DICTIONARY_SAMPLE)
        present = len(sample) - sample.null_count
        if present == 0 or 2 * pc.count_distinct(sample).as_py() < present:
            chosen.append(name)
    return chosen


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass  # never written, or not removable: the attempt's clean-up or `cleanup` tries again


def _os_reason(err: OSError) -> str:
    """pyarrow words it 'Error writing bytes to file. Detail: [errno 28] No space left on device'."""
    text = one_line(err)
    return text.split("Detail: ", 1)[-1] if "Detail: " in text else text


def read_file(location: Location, delta_path: str, columns: list[str] | None = None) -> pa.Table:
    fs, root = location.filesystem()
    path = f"{root.rstrip('/')}/{from_delta_path(delta_path)}"
    return plain_types(retrying(location, lambda: pq.read_table(path, filesystem=fs, columns=columns)))


def read_with_partitions(
    location: Location, delta_path: str, partition_values: dict[str, str | None] | None, types: pa.Schema
) -> pa.Table:
    """A data file's rows with its partition columns put back as `types` types them: a partitioned file
    holds them in its path only (Delta keeps them as strings in the add action)."""
    rows = read_file(location, delta_path)
    for column, value in (partition_values or {}).items():
        if column not in rows.column_names:
            values = pa.array([value] * rows.num_rows, pa.string())
            rows = rows.append_column(column, values.cast(types.field(column).type))
    return rows


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with exactly `schema`'s columns, in its order: columns it lacks are null."""
    columns = [
        rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def plain_types(table: pa.Table) -> pa.Table:
    """Other writers (DataFusion, delta-rs) use string_view/large types; Arrow kernels here want plain ones."""

    def plain(field: pa.Field) -> pa.Field:
        t = field.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            return field.with_type(pa.string())
        if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            return field.with_type(pa.binary())
        return field

    return table.cast(pa.schema([plain(f) for f in table.schema]))


def _split_by_partition(table: pa.Table, partition_by: list[str]) -> Iterator[tuple[dict[str, Any], pa.Table]]:
    if not partition_by:
        yield {}, table
        return
    keys = table.select(partition_by).group_by(partition_by).aggregate([]).to_pylist()
    for key in keys:
        mask = None
        for col, value in key.items():
            cond = (
                pc.is_null(table[col])
                if value is None
                else pc.equal(table[col], pa.scalar(value, table.schema.field(col).type))
            )
            mask = cond if mask is None else pc.and_(mask, cond)
        yield key, table.filter(mask)


def action_partition_values(action: dict[str, Any], partition_by: list[str]) -> dict[str, str | None]:
    """A file's partition values as Delta's actions hold them (text), from a row of
    `get_add_actions(flatten=True)`, which types them (an int partition column gives ints)."""
    return {c: _partition_string(action.get(f"partition.{c}")) for c in partition_by}


def _partition_string(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _dir_value(value: Any) -> str:
    text = _partition_string(value)
    return HIVE_NULL if text is None else quote(text, safe="")


def delta_stats(table: pa.Table, footer: pq.FileMetaData | None = None) -> str:
    """Delta per-file statistics JSON for data skipping. `footer`: the Parquet footer written for `table`,
    whose string columns' bounds are taken from the writer's own statistics (it has compared every value
    already; comparing them again took most of the time this function took)."""
    mins, maxs, nulls = {}, {}, {}
    written = _written_string_bounds(table, footer) if footer is not None else {}
    for name in table.column_names:
        column = table[name]
        nulls[name] = column.null_count
        if column.null_count == len(column):
            continue
        bounds = _bounds(column, written.get(name))
        if bounds is not None:
            mins[name], maxs[name] = bounds
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}, separators=(",", ":")
    )


def _written_string_bounds(table: pa.Table, footer: pq.FileMetaData) -> dict[str, tuple[str, str]]:
    """The smallest and largest value of each string column by the footer's row groups' statistics, for the
    columns every row group holding a value has them for. A table with a nested column gets none (its
    columns are not the footer's leaves one for one). Parquet's writer orders strings by their UTF-8 bytes,
    which is the order of their code points, as Arrow's min_max and Python's comparison are."""
    if any(pa.types.is_nested(f.type) for f in table.schema):
        return {}
    found = {}
    for index, field in enumerate(table.schema):
        if not pa.types.is_string(field.type):
            continue
        lows, highs = [], []
        for group in range(footer.num_row_groups):
            stats = footer.row_group(group).column(index).statistics
            if stats is not None and stats.has_min_max:
                lows.append(stats.min)
                highs.append(stats.max)
            elif stats is None or stats.num_values > 0:
                break  # a row group with values but no bounds (one too long to keep): compared as before
        else:
            if lows:
                found[field.name] = (min(lows), max(highs))
    return found


def _bounds(column: pa.ChunkedArray, written: tuple[str, str] | None = None) -> tuple[Any, Any] | None:
    """The column's Delta min and max, or None when Delta gets none for it; `written`: a string column's
    bounds as the Parquet writer found them."""
    t = column.type
    if not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    ):
        return None  # binary and booleans: nullCount only
    low: Any
    high: Any
    if written is not None:
        low, high = written
    else:
        result = pc.min_max(column)
        low, high = result["min"].as_py(), result["max"].as_py()
    if pa.types.is_floating(t) and not (math.isfinite(low) and math.isfinite(high)):
        return None
    if pa.types.is_string(t):
        if len(low) > STRING_STATS_MAX or len(high) > STRING_STATS_MAX:
            return None
        return low, high
    if pa.types.is_timestamp(t):
        # Delta stores millisecond precision: round the min down and the max up so skipping stays safe.
        low = low.replace(microsecond=low.microsecond // 1000 * 1000)
        if high.microsecond % 1000:
            high = high.replace(microsecond=high.microsecond // 1000 * 1000) + dt.timedelta(milliseconds=1)
        return _iso_ms(low), _iso_ms(high)
    if pa.types.is_date(t):
        return low.isoformat(), high.isoformat()
    return low, high


def _iso_ms(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
