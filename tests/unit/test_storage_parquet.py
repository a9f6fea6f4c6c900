"""Data files as `storage/parquet.py` writes them, on a local disk: their rows, size and encodings."""

from __future__ import annotations

import datetime as dt
import json
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offsetlake.storage import statistics
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import DICTIONARY_SAMPLE, DataFiles, FileWriter, dictionary_columns, write_files
from offsetlake.storage.statistics import STRING_STATS_MAX, delta_stats

ROWS = 3 * DICTIONARY_SAMPLE


def dictionary_encoded(path: str) -> dict[str, bool]:
    """Whether each column's chunks hold a dictionary, as the file's own metadata says."""
    meta = pq.ParquetFile(path).metadata
    return {
        meta.schema.column(i).path: all(
            meta.row_group(g).column(i).dictionary_page_offset is not None for g in range(meta.num_row_groups)
        )
        for i in range(meta.num_columns)
    }


def test_columns_whose_values_repeat_get_a_dictionary_and_unique_ones_do_not(tmp_path):
    table = pa.table(
        {
            "kafka_offset": pa.array(range(ROWS), pa.int64()),
            "event_id": pa.array([f"e{i:012d}" for i in range(ROWS)]),
            "action": pa.array(["view", "click", "buy"] * (ROWS // 3)),
            "user_id": pa.array([i % 50 for i in range(ROWS)], pa.int64()),
            "never_set": pa.nulls(ROWS, pa.string()),
            "late": pa.array([None] * DICTIONARY_SAMPLE + list(range(ROWS - DICTIONARY_SAMPLE)), pa.int64()),
        }
    )
    [written] = write_files(Location.of(str(tmp_path)), table, [], lambda n: f"part-{n}.parquet")
    path = str(tmp_path / "part-0.parquet")

    assert pq.read_table(path).equals(table)
    assert written.size == os.path.getsize(path) and written.num_records == ROWS
    assert dictionary_encoded(path) == {
        "kafka_offset": False,
        "event_id": False,
        "action": True,
        "user_id": True,
        "never_set": True,
        "late": True,  # its sample is all null: the writer decides, as by default
    }


def encodings(path: str) -> dict[str, set[str]]:
    """Each column's data encodings (levels and dictionary aside), as the file's own metadata says."""
    meta = pq.ParquetFile(path).metadata
    return {
        meta.schema.column(i).path: set(meta.row_group(0).column(i).encodings) - {"RLE", "RLE_DICTIONARY"}
        for i in range(meta.num_columns)
    }


def test_integer_and_time_columns_that_never_decrease_are_written_as_differences(tmp_path):
    start = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    rising = list(range(ROWS - 3)) + [2**63 - 1, -(2**63), 5]  # past the sample, any value: still exact
    table = pa.table(
        {
            "kafka_offset": pa.array(rising, pa.int64()),
            "kafka_timestamp": pa.array([start + dt.timedelta(seconds=i // 2) for i in range(ROWS)]),
            "day": pa.array([start.date() + dt.timedelta(days=i) for i in range(ROWS)], pa.date32()),
            "shuffled": pa.array([(i * 7919) % ROWS for i in range(ROWS)], pa.int64()),
            "falling": pa.array(range(ROWS, 0, -1), pa.int32()),
            "partition": pa.array([3] * ROWS, pa.int32()),
            "late": pa.array([None] * (ROWS - 2) + [1, 2], pa.int64()),
        }
    )
    write_files(Location.of(str(tmp_path)), table, [], lambda n: f"part-{n}.parquet")
    path = str(tmp_path / "part-0.parquet")

    assert pq.read_table(path).equals(table)
    assert encodings(path) == {
        "kafka_offset": {"DELTA_BINARY_PACKED"},
        "kafka_timestamp": {"DELTA_BINARY_PACKED"},
        "day": {"DELTA_BINARY_PACKED"},
        "shuffled": {"PLAIN"},
        "falling": {"PLAIN"},
        "partition": {"PLAIN"},  # its dictionary's page: one value
        "late": {"PLAIN"},  # no values in its sample: the writer's default, a dictionary
    }


def test_a_table_with_a_nested_column_keeps_the_writers_default(tmp_path):
    table = pa.table(
        {
            "kafka_offset": pa.array(range(ROWS), pa.int64()),
            "point": pa.array([{"x": i % 7, "y": i} for i in range(ROWS)]),
        }
    )
    assert dictionary_columns(table) is True
    write_files(Location.of(str(tmp_path)), table, [], lambda n: f"part-{n}.parquet")

    path = str(tmp_path / "part-0.parquet")
    assert pq.read_table(path).equals(table)
    assert dictionary_encoded(path) == {"kafka_offset": True, "point.x": True, "point.y": True}


def python_bounds(values: list) -> tuple[str, str] | None:
    """A string column's Delta min and max by Python's own comparison: None when it has no value, or when
    either bound is longer than Delta's stats keep."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    low, high = min(present), max(present)
    return None if max(len(low), len(high)) > STRING_STATS_MAX else (low, high)


def string_bounds(stats: str, columns: list[str]) -> dict[str, tuple[str, str] | None]:
    parsed = json.loads(stats)
    return {c: (parsed["minValues"][c], parsed["maxValues"][c]) if c in parsed["minValues"] else None for c in columns}


STRINGS = {
    "ascii": [f"k{(i * 7919) % ROWS:06d}" for i in range(ROWS)],
    # Multi-byte characters: UTF-8's byte order is the code points' order, which Python compares by.
    "unicode": [["zeta", "é", "中文", "😀", "Zoë", "", "ß"][i % 7] for i in range(ROWS)],
    "some_null": [None if i % 3 else f"v{i}" for i in range(ROWS)],
    "all_null": [None] * ROWS,
    "too_long": ["short"] * (ROWS - 1) + ["x" * (STRING_STATS_MAX + 1)],
}


def test_string_bounds_in_a_files_stats_are_its_values_own(tmp_path):
    table = pa.table(
        {"kafka_offset": pa.array(range(ROWS), pa.int64()), **{c: pa.array(v, pa.string()) for c, v in STRINGS.items()}}
    )
    [written] = write_files(Location.of(str(tmp_path)), table, [], lambda n: f"part-{n}.parquet")

    assert string_bounds(written.stats, list(STRINGS)) == {c: python_bounds(v) for c, v in STRINGS.items()}
    assert json.loads(written.stats)["nullCount"]["some_null"] == sum(v is None for v in STRINGS["some_null"])


def footer_bounds_kept(path: str, column: int) -> list[bool]:
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(g).column(column).statistics.has_min_max for g in range(meta.num_row_groups)]


def in_tables(table: pa.Table, rows: int) -> list[pa.Table]:
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


def test_string_bounds_over_tables_one_without_bounds_in_the_footer_and_one_without_values(tmp_path):
    """Parquet's writer keeps no bounds for a row group whose smallest or largest value is too long for its
    statistics (4 KiB): that table's bounds come from its values as it is written, and the column's
    smallest value, in that table, still counts."""
    group = 1000
    values = [f"m{i:05d}" for i in range(4 * group)]
    values[10] = "a-smallest"  # in the table the footer keeps no bounds for
    values[20] = "m" + "z" * 5000  # that table's largest value, too long for the writer's statistics
    values[-1] = "n-largest"
    values[2 * group : 3 * group] = [None] * group  # a table with no value at all (num_values 0)
    table = pa.table({"name": pa.array(values, pa.string()), "n": pa.array(range(4 * group), pa.int64())})

    written = write_in_tables(tmp_path, table, group)

    assert footer_bounds_kept(str(tmp_path / "part.parquet"), 0) == [False, True, False, True]  # the cases here
    assert string_bounds(written.stats, ["name"]) == {"name": python_bounds(values)}
    assert written.stats == delta_stats(table)


def test_a_row_group_left_without_bounds_unexpectedly_leaves_the_column_without_bounds(tmp_path, monkeypatch):
    # were the writer to drop bounds for values shorter than LONG_STRING_BYTES, no bounds would be taken from
    # those rows: the file then gives none for the column, never a wrong one
    monkeypatch.setattr(statistics, "LONG_STRING_BYTES", 10_000)
    values = ["b", "m" + "z" * 5000, "c", "a"]
    table = pa.table({"name": pa.array(values, pa.string())})

    written = write_in_tables(tmp_path, table, 2)

    assert footer_bounds_kept(str(tmp_path / "part.parquet"), 0) == [False, True]
    assert string_bounds(written.stats, ["name"]) == {"name": None}
    assert json.loads(written.stats)["numRecords"] == 4


def write_in_tables(tmp_path, table: pa.Table, rows: int):
    parts = in_tables(table, rows)
    with FileWriter(Location.of(str(tmp_path)), "part.parquet", parts[0], {}) as file:
        for part in parts:
            file.write(part)
        written = file.close()
    read = pq.read_table(str(tmp_path / "part.parquet"))
    assert read.schema == table.schema and repr(read.to_pydict()) == repr(table.to_pydict())  # NaN as NaN
    return written


def test_a_file_written_a_table_at_a_time_has_the_statistics_of_its_rows_together(tmp_path):
    nan, inf = math.nan, math.inf
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    columns = {
        "n": pa.array([5, None, 3, 9, None, None], pa.int64()),
        "only_nan_here": pa.array([nan, nan, 1.5, 2.5, 0.5, nan], pa.float64()),  # the first table is NaN only
        "inf_later": pa.array([1.0, 2.0, 3.0, 4.0, inf, 0.0], pa.float64()),
        "ts": pa.array(
            [at + dt.timedelta(microseconds=m) for m in (1500, 7, 2999, 10, 3001, 1)], pa.timestamp("us", tz="UTC")
        ),
        "day": pa.array([dt.date(2026, 1, d) for d in (3, 2, 9, 1, 4, 5)], pa.date32()),
        "s": pa.array(["k", "b", None, None, "x" * 2000, "a"], pa.string()),  # a long value, in the last table
        "late": pa.array([None, None, None, None, "q", "p"], pa.string()),  # values in the last table only
        "bin": pa.array([b"1", None, b"2", b"3", b"4", b"5"], pa.binary()),
        "flag": pa.array([True, False, None, True, True, False], pa.bool_()),
    }
    table = pa.table(columns)

    stats = json.loads(write_in_tables(tmp_path, table, 2).stats)

    assert stats == json.loads(delta_stats(table))  # the rows compared together, as one table
    assert stats["numRecords"] == 6
    assert stats["nullCount"] == {name: column.null_count for name, column in columns.items()}
    assert (stats["minValues"]["n"], stats["maxValues"]["n"]) == (3, 9)
    assert (stats["minValues"]["only_nan_here"], stats["maxValues"]["only_nan_here"]) == (0.5, 2.5)
    assert "inf_later" not in stats["minValues"]  # an infinite bound gives none
    assert (stats["minValues"]["ts"], stats["maxValues"]["ts"]) == (
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:00:00.004Z",
    )
    assert (stats["minValues"]["day"], stats["maxValues"]["day"]) == ("2026-01-01", "2026-01-09")
    assert "s" not in stats["minValues"]  # its largest value is over STRING_STATS_MAX
    assert (stats["minValues"]["late"], stats["maxValues"]["late"]) == ("p", "q")
    assert "bin" not in stats["minValues"] and "flag" not in stats["minValues"]


def test_data_files_split_by_partition_and_start_another_file_when_the_columns_change(tmp_path):
    names = iter(range(100))
    files = DataFiles(Location.of(str(tmp_path)), ["day"], lambda part: f"part-{part}-{next(names)}.parquet")
    first = pa.table({"day": ["d1", "d2", "d1"], "v": [1, 2, 3]})
    wider = pa.table({"day": ["d1", "d2"], "v": [4, 5], "added": ["x", None]})
    with files:
        files.write(first)
        files.write(first.slice(0, 0))  # no rows: nothing is begun
        files.write(wider)
        written = files.close()

    rows = {f.path: pq.read_table(str(tmp_path / f.path)).to_pylist() for f in written}
    assert sorted((f.partition_values["day"], f.num_records) for f in written) == [
        ("d1", 1),
        ("d1", 2),
        ("d2", 1),
        ("d2", 1),
    ]
    assert sorted(map(str, rows.values())) == sorted(
        map(str, [[{"v": 1}, {"v": 3}], [{"v": 2}], [{"v": 4, "added": "x"}], [{"v": 5, "added": None}]])
    )
    assert len({f.path.rsplit("-", 1)[0] for f in written}) == 4  # each file its own part number


def test_data_files_given_up_leave_no_file_behind(tmp_path):
    files = DataFiles(Location.of(str(tmp_path)), ["day"], lambda part: f"part-{part}.parquet")
    with pytest.raises(RuntimeError, match="given up"), files:
        files.write(pa.table({"day": ["d1", "d2"], "v": [1, 2]}))
        files.write(pa.table({"day": ["d1"], "v": [3], "added": [1]}))  # closes d1's first file
        assert len(list(tmp_path.rglob("*.parquet"))) == 3
        raise RuntimeError("given up")
    assert list(tmp_path.rglob("*.parquet")) == []
