"""Data files as `storage/parquet.py` writes them, on a local disk: their rows, size and encodings."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from offsetlake.storage.location import Location
from offsetlake.storage.parquet import DICTIONARY_SAMPLE, dictionary_columns, write_files

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
