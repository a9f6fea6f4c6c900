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
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from offsetlake.errors import StorageError, one_line

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
STRING_STATS_MAX = 32  # longer strings get no min/max: a truncated max would be wrong for skipping
T = TypeVar("T")


@dataclass(frozen=True)
class DataFile:
    path: str  # relative to the table root, as Delta stores it
    size: int
    modification_time: int  # epoch ms
    partition_values: dict
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


# Object-store settings per table location (a pipeline's `table.storage_options`): registered when a
# pipeline is loaded (config.parse_pipeline) and at the start of each Spark task (read/tasks.py), and read
# by every delta-rs and pyarrow call on that location, so that no signature has to carry them.
_STORAGE: dict[str, dict[str, str]] = {}


def register_storage(uri: str, options: dict[str, str]) -> None:
    if options:
        _STORAGE[uri.rstrip("/")] = dict(options)


def storage_options(uri: str) -> dict[str, str] | None:
    """The options registered for `uri` or the table it lies in (None: the store's defaults)."""
    uri = uri.rstrip("/")
    for prefix in sorted(_STORAGE, key=len, reverse=True):
        if uri == prefix or uri.startswith(prefix + "/"):
            return _STORAGE[prefix]
    return None


def open_filesystem(table_uri: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for a table and the table's root path in it, with the table's storage options
    (S3: endpoint, region, credentials, plain HTTP) when it has any."""
    options = storage_options(table_uri)
    if not options or not table_uri.startswith(("s3://", "s3a://")):
        return pafs.FileSystem.from_uri(table_uri)
    given = {k.lower(): v for k, v in options.items()}
    endpoint = given.get("aws_endpoint_url") or given.get("aws_endpoint") or given.get("endpoint")
    settings: dict[str, str] = {}
    if endpoint:
        scheme, _, host = endpoint.rpartition("://")
        settings.update(endpoint_override=host, scheme=scheme or "https")
    fs = pafs.S3FileSystem(
        # A file is sent when it is closed: one PutObject for a data file, not the three requests of a
        # multipart upload (CreateMultipartUpload, UploadPart, Complete) that an eager open starts.
        allow_delayed_open=True,
        access_key=given.get("aws_access_key_id"),
        secret_key=given.get("aws_secret_access_key"),
        session_token=given.get("aws_session_token"),
        region=given.get("aws_region") or given.get("region") or "us-east-1",
        **settings,
    )
    return fs, table_uri.split("://", 1)[1].rstrip("/")


def write_files(table_uri: str, table: pa.Table, partition_by: list[str], name_for_part) -> list[DataFile]:
    """Write `table` (split by partition values) and return one DataFile per file written."""
    if table.num_rows == 0:
        return []
    written = []
    for part_no, (values, rows) in enumerate(_split_by_partition(table, partition_by)):
        rel_dir = "/".join(f"{quote(c, safe='')}={_dir_value(values[c])}" for c in partition_by)
        rel_path = f"{rel_dir}/{name_for_part(part_no)}" if rel_dir else name_for_part(part_no)
        data = rows.drop_columns(partition_by) if partition_by else rows
        written.append(write_file(table_uri, rel_path, data, {c: _partition_string(values[c]) for c in partition_by}))
    return written


def write_file(table_uri: str, rel_path: str, data: pa.Table, partition_values: dict) -> DataFile:
    """Write one Parquet file (data without partition columns) at `rel_path` under the table. On an object
    store a retriable error is retried until the table's retry bound; a local error fails at once."""
    fs, root = open_filesystem(table_uri)
    full = f"{root.rstrip('/')}/{rel_path}"

    def write() -> pafs.FileInfo:
        try:
            if fs.type_name == "local":  # an object store has no directories: creating one costs 3 requests
                fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
            pq.write_table(data, full, filesystem=fs, compression="zstd", compression_level=1)
            return fs.get_file_info(full)
        except OSError:
            _delete_quietly(fs, full)  # no half-written file is left for the next attempt to trip on
            raise

    try:
        info = retrying(table_uri, write)
    except OSError as err:  # a full disk, a quota, permissions, a store away too long: name the path
        raise StorageError(f"cannot write {full}: {_os_reason(err)}") from None
    return DataFile(
        path=to_delta_path(rel_path),
        size=info.size,
        modification_time=int(info.mtime.timestamp() * 1000) if info.mtime else 0,
        partition_values=dict(partition_values),
        stats=delta_stats(data),
        num_records=data.num_rows,
    )


def retrying(table_uri: str, call: Callable[[], T], errors: tuple[type[Exception], ...] = (OSError,)) -> T:
    """`call()` -- pyarrow on the table's store -- asked again while the store gives an answer that may change
    soon (a 503, throttling, refused or reset connections), until the table's retry bound: the same bound
    delta-rs gets as `retry_timeout`, so the driver's own reads and the executors' writes ride out the same
    outage its commits do. Other errors, and every error on a local table (bound 0), are raised at once.
    `call` must be safe to repeat (a read, a listing, an idempotent delete, a write of a unique name).
    `errors`: the exception types that may carry such an answer (delta-rs raises some as DeltaError)."""
    deadline = time.monotonic() + retry_seconds(table_uri)
    pause = 0.5
    while True:
        try:
            return call()
        except errors as err:
            if not is_transient(err) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


def despite_log_cleanup(read: Callable[[], T], tries: int = 5) -> T:
    """`read()` -- delta-rs loading a table or reading its history -- asked again when a file of the log
    vanished between delta-rs listing the log and reading the file: log clean-up (offsetlake's `cleanup`,
    or another engine's) deletes commit files older than the newest checkpoint, and a read that listed them
    just before finds them gone (seen on S3, where listing and reading are requests apart). Listed again,
    the log starts at that checkpoint. Only a vanished `_delta_log/` file is asked again: locally delta-rs
    raises FileNotFoundError; from S3 a DeltaError ("Object at location .../_delta_log/...checkpoint.parquet
    not found ... 404", met by a stream while the checkpoint fault cleaned the log up)."""
    for attempt in range(tries):
        try:
            return read()
        except Exception as err:
            if not _vanished_log_file(err) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


_NOT_FOUND = re.compile(r"not found|NoSuchKey|No such file", re.IGNORECASE)


def _vanished_log_file(err: Exception) -> bool:
    text = str(err)
    if "_delta_log/" not in text:
        return False
    return isinstance(err, FileNotFoundError) or bool(_NOT_FOUND.search(text))


def retry_seconds(uri: str) -> float:
    """The retry bound registered for an object-store table (its delta-rs `retry_timeout`); 0 locally."""
    timeout = (storage_options(uri) or {}).get("retry_timeout", "0s")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", timeout)
    if not match:
        return 0.0
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]


# What an object store answers when it will not say yes now but may soon: throttling, a server error, a
# connection refused or reset, a timeout. Not retried: access denied, no such bucket, a full local disk.
# pyarrow names the AWS SDK's error kind (`AWS Error SLOW_DOWN during CreateMultipartUpload operation`), often
# without the HTTP status; S3 and delta-rs use the XML codes (SlowDown).
_RETRIABLE = re.compile(
    r"HTTP (response code:|status) (5\d\d|429)|SLOW_?DOWN|SERVICE_?UNAVAILABLE|INTERNAL_?(ERROR|FAILURE)|"
    r"THROTTLING|REQUEST_?TIMEOUT|NETWORK_CONNECTION|curlCode: (6|7|28|52|55|56)|"
    r"Couldn't connect|Could not connect|Connection refused|Connection reset|timed out|Timeout",
    re.IGNORECASE,
)


def is_transient(err: Exception) -> bool:
    """The store's answer may change soon (see _RETRIABLE): asking again is worth it."""
    return bool(_RETRIABLE.search(str(err)))


def delete_if_there(fs: pafs.FileSystem, path: str) -> None:
    """Delete `path`; already gone is fine (an earlier try whose answer the store lost may have deleted it)."""
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass


def _delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass  # never written, or not removable: the attempt's clean-up or `cleanup` tries again


def _os_reason(err: OSError) -> str:
    """pyarrow words it 'Error writing bytes to file. Detail: [errno 28] No space left on device'."""
    text = one_line(err)
    return text.split("Detail: ", 1)[-1] if "Detail: " in text else text


def read_file(table_uri: str, delta_path: str, columns: list[str] | None = None) -> pa.Table:
    fs, root = open_filesystem(table_uri)
    path = f"{root.rstrip('/')}/{from_delta_path(delta_path)}"
    return plain_types(retrying(table_uri, lambda: pq.read_table(path, filesystem=fs, columns=columns)))


def read_with_partitions(
    table_uri: str, delta_path: str, partition_values: dict[str, str | None] | None, types: pa.Schema
) -> pa.Table:
    """A data file's rows with its partition columns put back as `types` types them: a partitioned file
    holds them in its path only (Delta keeps them as strings in the add action)."""
    rows = read_file(table_uri, delta_path)
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


def _split_by_partition(table: pa.Table, partition_by: list[str]):
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


def action_partition_values(action: dict, partition_by: list[str]) -> dict[str, str | None]:
    """A file's partition values as Delta's actions hold them (text), from a row of
    `get_add_actions(flatten=True)`, which types them (an int partition column gives ints)."""
    return {c: _partition_string(action.get(f"partition.{c}")) for c in partition_by}


def _partition_string(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _dir_value(value) -> str:
    text = _partition_string(value)
    return HIVE_NULL if text is None else quote(text, safe="")


def delta_stats(table: pa.Table) -> str:
    """Delta per-file statistics JSON for data skipping."""
    mins, maxs, nulls = {}, {}, {}
    for name in table.column_names:
        column = table[name]
        nulls[name] = column.null_count
        if column.null_count == len(column):
            continue
        bounds = _bounds(column)
        if bounds is not None:
            mins[name], maxs[name] = bounds
    return json.dumps(
        {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}, separators=(",", ":")
    )


def _bounds(column: pa.ChunkedArray):
    t = column.type
    if not (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    ):
        return None  # binary and booleans: nullCount only
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
