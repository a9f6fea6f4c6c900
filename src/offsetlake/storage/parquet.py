"""Write Parquet data files into a table directory and describe them for a Delta `add` action.

Runs in executors. Files get unique names that carry the batch and the attempt
id, and live in ordinary (non-hidden) directories, so an attempt that never
commits leaves orphans that `cleanup` and the attempt itself can find by name.
A file is written a table at a time, so a task holds one chunk of its range as
Arrow, never the whole range; its statistics are gathered as it is written
(`statistics.py`), so the driver never re-reads a file to commit it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
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
from offsetlake.storage.statistics import FileStatistics

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


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
    with DataFiles(location, partition_by, name_for_part) as files:
        files.write(table)
        return files.close()


def write_file(location: Location, rel_path: str, data: pa.Table, partition_values: dict[str, str | None]) -> DataFile:
    """Write one Parquet file (data without partition columns) at `rel_path` under the table."""
    with FileWriter(location, rel_path, data, partition_values) as file:
        file.write(data)
        return file.close()


class DataFiles:
    """The data files of one writer of a table (a task's range, a fold): rows given a table at a time, each
    split by the partition columns into one open file per partition. A table whose columns differ from its
    partition's open file (a registry format's newer writer schema) closes that file and starts another.
    Leaving the `with` block by an error deletes every file written or begun."""

    def __init__(self, location: Location, partition_by: list[str], name_for_part: Callable[[int], str]) -> None:
        self._location = location
        self._partition_by = partition_by
        self._name_for_part = name_for_part
        self._open: dict[tuple[Any, ...], FileWriter] = {}
        self._closed: list[DataFile] = []

    def __enter__(self) -> DataFiles:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is not None:
            self.abort()

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        for values, rows in _split_by_partition(table, self._partition_by):
            key = tuple(values[c] for c in self._partition_by)
            data = rows.drop_columns(self._partition_by) if self._partition_by else rows
            file = self._open.get(key)
            if file is not None and not file.schema.equals(data.schema):
                self._closed.append(self._open.pop(key).close())
                file = None
            if file is None:
                file = self._open[key] = self._start(values, data)
            file.write(data)

    def _start(self, values: dict[str, Any], first: pa.Table) -> FileWriter:
        rel_dir = "/".join(f"{quote(c, safe='')}={_dir_value(values[c])}" for c in self._partition_by)
        name = self._name_for_part(len(self._closed) + len(self._open))
        rel_path = f"{rel_dir}/{name}" if rel_dir else name
        partition_values = {c: _partition_string(values[c]) for c in self._partition_by}
        return FileWriter(self._location, rel_path, first, partition_values)

    def close(self) -> list[DataFile]:
        """Close the open files; every file written, in the order they were closed."""
        while self._open:
            self._closed.append(self._open.pop(next(iter(self._open))).close())
        return self._closed

    def abort(self) -> None:
        for file in self._open.values():
            file.abort()
        self._open.clear()
        fs, root = self._location.filesystem()
        for written in self._closed:
            _delete_quietly(fs, f"{root.rstrip('/')}/{from_delta_path(written.path)}")


class FileWriter:
    """One Parquet data file at `rel_path` under the table, written a table at a time (each a row group or
    more), its statistics gathered as it goes. `first`: its first rows, which choose the dictionary columns.

    A local file is written as the rows come. On an object store the file is made in memory (compressed, a
    fraction of its rows' size) and stored when closed, in one retried upload: a retriable error is retried
    until the table's retry bound, as the whole file can be sent again; a local error fails at once. Any
    error deletes what was written and is raised as one line naming the path."""

    def __init__(
        self, location: Location, rel_path: str, first: pa.Table, partition_values: dict[str, str | None]
    ) -> None:
        self._location = location
        self._rel_path = rel_path
        self._partition_values = dict(partition_values)
        self._fs, root = location.filesystem()
        self._full = f"{root.rstrip('/')}/{rel_path}"
        self._local = self._fs.type_name == "local"
        self.schema = first.schema
        self._statistics = FileStatistics(first.schema)
        self._sink: Any = None
        self._writer: pq.ParquetWriter | None = None
        with self._failing_as_storage_error():
            if self._local:  # an object store has no directories: creating one costs 3 requests
                self._fs.create_dir(self._full.rsplit("/", 1)[0], recursive=True)
                self._sink = self._fs.open_output_stream(self._full, compression=None)
            else:
                self._sink = pa.BufferOutputStream()
            dictionary = dictionary_columns(first)
            self._writer = pq.ParquetWriter(
                self._sink,
                first.schema,
                compression="zstd",
                compression_level=1,
                use_dictionary=dictionary,
                column_encoding=delta_encoded_columns(first, dictionary),
            )

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is not None:
            self.abort()

    def write(self, rows: pa.Table) -> None:
        assert self._writer is not None, "written after it was closed"
        with self._failing_as_storage_error():
            self._writer.write_table(rows)
        self._statistics.add(rows)

    def close(self) -> DataFile:
        assert self._writer is not None, "closed twice"
        with self._failing_as_storage_error():
            self._writer.close()
            footer = self._writer.writer.metadata  # as pyarrow's own close reads it: no public way
            self._writer = None
            if self._local:
                size = self._sink.tell()  # as the writer counted it: asking the store would cost a request
                self._sink.close()
            else:
                contents = self._sink.getvalue()
                size = contents.size
                retrying(self._location, lambda: self._store(contents))
        return DataFile(
            path=to_delta_path(self._rel_path),
            size=int(size),
            modification_time=int(time.time() * 1000),  # when it was written
            partition_values=self._partition_values,
            stats=self._statistics.to_json(footer),
            num_records=self._statistics.rows,
        )

    def _store(self, contents: pa.Buffer) -> None:
        with self._fs.open_output_stream(self._full, compression=None) as sink:  # closed: the object is stored
            sink.write(contents)

    def abort(self) -> None:
        """Close without keeping anything: the file, written or begun, is deleted."""
        writer, self._writer = self._writer, None
        with contextlib.suppress(Exception):  # it failed already, or it is being given up
            if writer is not None:
                writer.close()
            if self._local and self._sink is not None:
                self._sink.close()
        _delete_quietly(self._fs, self._full)

    @contextlib.contextmanager
    def _failing_as_storage_error(self) -> Iterator[None]:
        """A full disk, a quota, permissions, a store away too long: the file deleted (no half-written file
        is left for the next attempt to trip on) and the error raised naming its path."""
        try:
            yield
        except OSError as err:
            self.abort()
            raise StorageError(f"cannot write {self._full}: {_os_reason(err)}") from err


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


def delta_encoded_columns(data: pa.Table, dictionary: list[str] | bool) -> dict[str, str] | None:
    """The integer, timestamp and date columns without a dictionary whose first DICTIONARY_SAMPLE values never
    decrease (an offset, a sequence, a record's time), each to be written DELTA_BINARY_PACKED: a value as its
    difference from the one before, in as few bits as the page's differences need. Such a column is then
    smaller, and the file faster to compress, than written plain. None for a table `dictionary_columns` leaves
    to the writer's defaults (it has a nested column)."""
    if not isinstance(dictionary, list):
        return None
    chosen = {}
    for field in data.schema:
        if field.name in dictionary or not _delta_packable(field.type):
            continue
        sample = data.column(field.name).slice(0, DICTIONARY_SAMPLE).drop_null()
        if len(sample) > 1 and pc.all(pc.greater_equal(sample[1:], sample[:-1])).as_py():
            chosen[field.name] = "DELTA_BINARY_PACKED"
    return chosen or None


def _delta_packable(kind: pa.DataType) -> bool:
    """Stored as Parquet's INT32 or INT64, which DELTA_BINARY_PACKED encodes."""
    return bool(pa.types.is_integer(kind) or pa.types.is_timestamp(kind) or pa.types.is_date(kind))


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
