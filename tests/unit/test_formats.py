"""Record formats and file statistics: pure Arrow logic."""
import datetime as dt
import json

import pyarrow as pa

from offsetlake.config import parse_pipeline
from offsetlake.files import delta_stats, write_files
from offsetlake.formats import QUARANTINE_SCHEMA, convert, table_schema
from offsetlake.reader import MESSAGE_SCHEMA


def pipeline(fmt):
    return parse_pipeline({
        "name": "p", "topics": ["t"], "kafka": {"bootstrap_servers": "x:1"}, "table": {"path": "/tmp/x"},
        "format": fmt,
    }, "p.yaml")


JSON = {"type": "json", "schema": [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "at", "type": "timestamp"},
    {"name": "ok", "type": "boolean"},
    {"name": "score", "type": "double"},
]}


def messages(values):
    n = len(values)
    return pa.Table.from_arrays([
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()), pa.array(["t"] * n),
        pa.array([0] * n, pa.int32()), pa.array(range(100, 100 + n), pa.int64()),
        pa.array([1_700_000_000_000] * n, pa.timestamp("ms", tz="UTC")),
    ], schema=MESSAGE_SCHEMA)


def test_raw_keeps_bytes_and_lineage():
    rows, bad = convert(pipeline({"type": "raw"}), messages([b"\xff\x00", None]))
    assert rows.schema == table_schema(pipeline({"type": "raw"}))
    assert rows.column("value").to_pylist() == [b"\xff\x00", None]
    assert rows.column("kafka_offset").to_pylist() == [100, 101]
    assert bad.num_rows == 0


def test_json_parses_by_schema_and_quarantines_the_rest():
    values = [
        json.dumps({"id": 1, "name": "a", "at": "2026-01-02T03:04:05.123Z", "ok": True, "score": 2, "extra": 1}).encode(),
        b"{not json",
        json.dumps({"id": "7"}).encode(),
        json.dumps({"name": "no id"}).encode(),
        b"\xff\xfe",
        None,
        json.dumps([1, 2]).encode(),
        json.dumps({"id": 2, "at": 1_700_000_000_000}).encode(),
    ]
    rows, bad = convert(pipeline(JSON), messages(values))
    assert rows.column("id").to_pylist() == [1, 2]
    assert rows.column("kafka_offset").to_pylist() == [100, 107]
    assert rows.column("at").to_pylist()[0] == dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=dt.timezone.utc)
    assert rows.column("score").to_pylist()[0] == 2.0
    assert bad.schema == QUARANTINE_SCHEMA
    assert bad.column("kafka_offset").to_pylist() == [101, 102, 103, 104, 105, 106]
    errors = bad.column("error").to_pylist()
    assert "not JSON" in errors[0]
    assert "field 'id': expected an integer, got str" in errors[1]
    assert "required field 'id' is missing" in errors[2]
    assert "not UTF-8" in errors[3] or "not JSON" in errors[3]
    assert "tombstone" in errors[4]
    assert "expected an object" in errors[5]
    assert bad.column("value").to_pylist()[0] == b"{not json"  # raw bytes kept


def test_stats_hold_bounds_and_null_counts():
    table = pa.table({
        "n": pa.array([3, None, 1], pa.int64()),
        "s": pa.array(["b", "a", None]),
        "long": pa.array(["x" * 40, "y", "z"]),
        "ts": pa.array([dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.timezone.utc)] * 3, pa.timestamp("us", tz="UTC")),
        "b": pa.array([b"1", b"2", None], pa.binary()),
    })
    stats = json.loads(delta_stats(table))
    assert stats["numRecords"] == 3
    assert stats["minValues"]["n"] == 1 and stats["maxValues"]["n"] == 3
    assert stats["minValues"]["s"] == "a" and stats["nullCount"]["s"] == 1
    assert "long" not in stats["minValues"]  # too long to truncate safely
    assert stats["minValues"]["ts"] == "2026-01-01T00:00:00.001Z"  # rounded down
    assert stats["maxValues"]["ts"] == "2026-01-01T00:00:00.002Z"  # rounded up
    assert "b" not in stats["minValues"] and stats["nullCount"]["b"] == 1


def test_partitioned_files_go_to_hive_directories(tmp_path):
    table = pa.table({"day": ["2026-01-01", "2026-01-02", "2026-01-01", None], "v": [1, 2, 3, 4]})
    files = write_files(str(tmp_path), table, ["day"], lambda n: f"part-{n}.parquet")
    by_value = {f.partition_values["day"]: f for f in files}
    assert set(by_value) == {"2026-01-01", "2026-01-02", None}
    assert by_value["2026-01-01"].num_records == 2
    assert by_value[None].path.startswith("day=__HIVE_DEFAULT_PARTITION__/")
    assert all((tmp_path / f.path).is_file() for f in files)
