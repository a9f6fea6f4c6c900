"""Data files as `storage/parquet.py` writes them, on a local disk: their rows, size and encodings."""

from __future__ import annotations

import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from offsetlake.storage.location import Location
from offsetlake.storage.parquet import DICTIONARY_SAMPLE, STRING_STATS_MAX, delta_stats, dictionary_columns, write_files

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


def test_string_bounds_over_row_groups_one_without_bounds_and_one_without_values():
    """Parquet's writer keeps no bounds for a row group whose smallest or largest value is too long for its
    statistics (4 KiB): the column is then compared value by value, and its smallest value, in that row
    group, still counts."""
    group = 1000
    values = [f"m{i:05d}" for i in range(4 * group)]
    values[10] = "a-smallest"  # in the row group that has no bounds
    values[20] = "m" + "z" * 5000  # that row group's largest value, too long for the writer's statistics
    values[-1] = "n-largest"
    values[2 * group : 3 * group] = [None] * group  # a row group with no value at all (num_values 0)
    table = pa.table({"name": pa.array(values, pa.string()), "n": pa.array(range(4 * group), pa.int64())})
    footer: list[pq.FileMetaData] = []
    pq.write_table(table, io.BytesIO(), row_group_size=group, metadata_collector=footer)
    groups = [footer[0].row_group(g).column(0).statistics for g in range(footer[0].num_row_groups)]
    assert [g.has_min_max for g in groups] == [False, True, False, True]  # the cases this test is about

    assert string_bounds(delta_stats(table, footer[0]), ["name"]) == {"name": python_bounds(values)}
    assert delta_stats(table, footer[0]) == delta_stats(table)
