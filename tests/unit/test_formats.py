"""Record formats and file statistics: pure Arrow logic."""

import datetime as dt
import json

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import example, given, settings
from hypothesis import strategies as st

from offsetlake.config import parse_pipeline
from offsetlake.formats import arrow_json, declared_json
from offsetlake.formats.columns import QUARANTINE_SCHEMA, table_schema
from offsetlake.formats.declared_json import BadRecord, FastDecoder, arrow_type, parse_record
from offsetlake.formats.records import convert
from offsetlake.formats.values import coerce
from offsetlake.read.reader import MESSAGE_SCHEMA
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import write_files
from offsetlake.storage.statistics import delta_stats


def pipeline(fmt):
    return parse_pipeline(
        {
            "name": "p",
            "topics": ["t"],
            "kafka": {"bootstrap_servers": "x:1"},
            "table": {"path": "/tmp/x"},
            "format": fmt,
        },
        "p.yaml",
    )


JSON = {
    "type": "json",
    "schema": [
        {"name": "id", "type": "long", "required": True},
        {"name": "name", "type": "string"},
        {"name": "at", "type": "timestamp"},
        {"name": "ok", "type": "boolean"},
        {"name": "score", "type": "double"},
    ],
}


def messages(values):
    n = len(values)
    return pa.Table.from_arrays(
        [
            pa.array([None] * n, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(100, 100 + n), pa.int64()),
            pa.array([1_700_000_000_000] * n, pa.timestamp("ms", tz="UTC")),
        ],
        schema=MESSAGE_SCHEMA,
    )


def test_raw_keeps_bytes_and_lineage():
    rows, bad = convert(pipeline({"type": "raw"}), messages([b"\xff\x00", None]))
    assert rows.schema == table_schema(pipeline({"type": "raw"}))
    assert rows.column("value").to_pylist() == [b"\xff\x00", None]
    assert rows.column("kafka_offset").to_pylist() == [100, 101]
    assert bad.num_rows == 0


def test_json_parses_by_schema_and_quarantines_the_rest():
    values = [
        json.dumps(
            {"id": 1, "name": "a", "at": "2026-01-02T03:04:05.123Z", "ok": True, "score": 2, "extra": 1}
        ).encode(),
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
    assert rows.column("at").to_pylist()[0] == dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=dt.UTC)
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
    table = pa.table(
        {
            "n": pa.array([3, None, 1], pa.int64()),
            "s": pa.array(["b", "a", None]),
            "long": pa.array(["x" * 40, "y", "z"]),
            "ts": pa.array([dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.UTC)] * 3, pa.timestamp("us", tz="UTC")),
            "b": pa.array([b"1", b"2", None], pa.binary()),
        }
    )
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
    files = write_files(Location.of(str(tmp_path)), table, ["day"], lambda n: f"part-{n}.parquet")
    by_value = {f.partition_values["day"]: f for f in files}
    assert set(by_value) == {"2026-01-01", "2026-01-02", None}
    assert by_value["2026-01-01"].num_records == 2
    assert by_value[None].path.startswith("day=__HIVE_DEFAULT_PARTITION__/")
    assert all((tmp_path / f.path).is_file() for f in files)


def test_schema_drift_new_fields_dropped_by_default_kept_as_json_text_when_asked():
    values = [
        json.dumps({"id": 1, "name": "a", "coupon": "X1", "tags": ["a", "é"]}).encode(),
        json.dumps({"id": 2}).encode(),
    ]
    dropped, _ = convert(pipeline(JSON), messages(values))
    assert "_unknown_fields" not in dropped.column_names
    kept, bad = convert(pipeline({**JSON, "unknown_fields": "keep"}), messages(values))
    assert kept.schema == table_schema(pipeline({**JSON, "unknown_fields": "keep"}))
    extra = kept.column("_unknown_fields").to_pylist()
    assert json.loads(extra[0]) == {"coupon": "X1", "tags": ["a", "é"]}
    assert extra[1] is None and bad.num_rows == 0


def test_schema_drift_type_change_goes_to_quarantine_even_when_keeping_unknown_fields():
    values = [json.dumps({"id": 1, "ok": "yes"}).encode(), json.dumps({"id": 2.5}).encode()]
    rows, bad = convert(pipeline({**JSON, "unknown_fields": "keep"}), messages(values))
    assert rows.num_rows == 0
    assert bad.column("error").to_pylist() == [
        "field 'ok': expected true or false, got str",
        "field 'id': expected an integer, got float",
    ]


def test_values_above_the_size_limit_are_quarantined_whole_in_both_formats():
    big = json.dumps({"id": 3, "name": "x" * 5000}).encode()
    values = [json.dumps({"id": 1}).encode(), big, None]
    for fmt in ({**JSON, "max_value_bytes": 4096}, {"type": "raw", "max_value_bytes": 4096}):
        rows, bad = convert(pipeline(fmt), messages(values))
        row = bad.filter(pc.equal(bad.column("kafka_offset"), 101))
        assert row.column("value").to_pylist() == [big]
        assert row.column("error").to_pylist() == [f"value is {len(big)} bytes, above format.max_value_bytes (4096)"]
        assert 101 not in rows.column("kafka_offset").to_pylist()
        assert 100 in rows.column("kafka_offset").to_pylist()


def test_null_keys_are_kept_and_null_values_are_tombstones():
    msgs = messages([b"v", None]).set_column(0, "key", pa.array([None, b"k"], pa.binary()))
    rows, bad = convert(pipeline({"type": "raw"}), msgs)
    assert rows.column("key").to_pylist() == [None, b"k"] and rows.column("value").to_pylist() == [b"v", None]
    rows, bad = convert(pipeline(JSON), messages([json.dumps({"id": 1}).encode(), None]))
    assert rows.column("id").to_pylist() == [1]
    assert bad.column("error").to_pylist() == ["value is null (tombstone)"]


# The fast JSON paths (Arrow's reader for chunks of good records, msgspec record by record) must agree
# with the reference parser on every value: same verdict, same row. Values are built from fragments
# chosen to sit on the edges where JSON parsers differ. A chunk with one bad record goes record by
# record, so each value is also converted alone: that is where Arrow's reader decides it.
EVERY_TYPE = {
    "type": "json",
    "schema": [
        {"name": "s", "type": "string", "required": True},
        {"name": "l", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "d", "type": "double"},
        {"name": "f", "type": "float"},
        {"name": "b", "type": "boolean"},
        {"name": "t", "type": "timestamp"},
        {"name": "dt", "type": "date", "required": True},
        {"name": "bin", "type": "binary"},
        {"name": "class", "type": "string"},
        {"name": "dec", "type": "decimal(12,3)"},
    ],
}
EDGE_VALUES = [
    '"12.5"',
    '"-0.001"',
    '"1.2345"',
    '"123456789.123"',
    '"1234567890.1"',
    '"1_0"',
    '" 1.5"',
    '"1e2"',
    '"1E-3"',
    '"NaN"',
    '".5"',
    '"5."',
    "12.345",
    "0.1",
    "123456789012.5",
    '"a"',
    '"\\u00e9"',
    '"\\ud800"',
    '"\\udc00x"',
    '"\\ud83d\\ude00"',
    '""',
    "5",
    "-0",
    "5.0",
    "1e3",
    "1E+2",
    "-1.5e-7",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "2147483647",
    "2147483648",
    "-2147483649",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "123456789012345678901234567890",
    "true",
    "false",
    "null",
    "[1]",
    '{"a":1}',
    '"2026-01-02T03:04:05Z"',
    '"2026-01-02 03:04:05.123456"',
    '"2026-01-02T03:04:05.123+02:00"',
    '"2026-01-02T03:04:05.1234567Z"',
    '"2026-02-30T00:00:00Z"',
    '"2026-01-02t03:04:05z"',
    '"20260102T030405"',
    '"2026-01-02T24:00:00"',
    "1700000000000",
    "1.7e12",
    '"2026-01-02"',
    '"20260102"',
    '"2026-W01-1"',
    '"aGVsbG8="',
    '"aGVsbG8"',
    '"not base64!"',
    '"0000-01-01T00:00:00Z"',
    '"0001-01-01T00:00:00Z"',
    '"2026-00-10T00:00:00Z"',
    '"2026-01-02T03:04:05+25:00"',
    '"2026-01-02T03:04:05+23:59"',
    '"2026-01-02T03:04"',
    '"2026-01-02T03:04:05+0200"',
    '"2026-01-02T03:04:05.5-00:30"',
    '" 2026-01-02T03:04:05Z"',
    "3.4028235e38",
    "1e39",
    '"2026-01-02T03:04:05Z", "l": 1',
]
VALID = {
    "s": '"a"',
    "l": "1",
    "i": "2",
    "d": "2.5",
    "f": "0.1",
    "b": "true",
    "t": '"2026-01-02T03:04:05Z"',
    "dt": '"2026-01-02"',
    "bin": '"aGk="',
    "class": '"c"',
    "dec": '"12.5"',
}
KEYS = ["s", "l", "i", "d", "f", "b", "t", "dt", "bin", "class", "dec", "x", "\\u0073", "S"]


@st.composite
def json_values(draw):
    # A valid record, then a few members changed or added (a repeated key: the last one counts).
    members = [(k, v) for k, v in VALID.items() if draw(st.booleans()) or k in ("s", "dt")]
    edge = st.sampled_from(EDGE_VALUES)
    value = st.one_of(edge, edge, edge, st.floats(allow_nan=False).map(repr), st.integers().map(str))
    members += draw(st.lists(st.tuples(st.sampled_from(KEYS), value), min_size=1, max_size=3))
    text = "{" + ",".join(f'"{k}":{v}' for k, v in members) + "}"
    wrap = draw(
        st.sampled_from(["plain"] * 6 + ["space", "trailing", "two", "bom", "utf16", "latin1", "array", "null"])
    )
    if wrap == "null":
        return None
    data = text.encode()
    return {
        "plain": data,
        "space": b" \n" + data + b"\t",
        "trailing": data + b"x",
        "two": data + data,
        "bom": b"\xef\xbb\xbf" + data,
        "utf16": text.encode("utf-16"),
        "array": b"[" + data + b"]",
        "latin1": data[:-1] + b',"x":"\xe9"}' if len(data) > 2 else b'{"x":"\xe9"}',
    }[wrap]


def assert_fast_path_agrees_with_reference(values):
    for value in values:
        assert_chunk_agrees_with_reference([value])
    return assert_chunk_agrees_with_reference(values)


def assert_chunk_agrees_with_reference(values):
    cfg = pipeline(EVERY_TYPE)
    rows, bad = convert(cfg, messages(values))
    fields = cfg.format.schema_
    expected, expected_bad = [], []
    for offset, raw in enumerate(values, start=100):
        try:
            expected.append((offset, parse_record(raw, fields)[0]))
        except BadRecord as err:
            expected_bad.append((offset, str(err)))
    assert rows.column("kafka_offset").to_pylist() == [o for o, _ in expected]
    for f in fields:
        want = pa.array([r[f.name] for _, r in expected], arrow_type(f.type))
        assert rows.column(f.name).combine_chunks().equals(want), (f.name, values)
    assert list(zip(bad.column("kafka_offset").to_pylist(), bad.column("error").to_pylist())) == expected_bad
    return rows.num_rows


def test_fast_json_decoder_agrees_with_the_reference_on_every_edge_value_of_every_field():
    values = []
    for key in KEYS:
        for value in EDGE_VALUES:
            members = {**VALID, key: value}
            values.append(("{" + ",".join(f'"{k}":{v}' for k, v in members.items()) + "}").encode())
            values.append(("{" + ",".join(f'"{k}":{v}' for k, v in VALID.items()) + f',"{key}":{value}}}').encode())
            values.append(("{" + ",".join(f'"{k}":{v}' for k, v in VALID.items() if k != key) + "}").encode())
    accepted = assert_fast_path_agrees_with_reference(values)
    assert 0 < accepted < len(values)


@given(st.lists(json_values(), min_size=1, max_size=20))
@example([b'{"s":"a","dt":"2026-01-02","t":6.77680361916768e+19}'])  # epoch ms past year 9999: OSError once
@settings(max_examples=300, deadline=None)
def test_fast_json_decoder_agrees_with_the_reference_parser(values):
    assert_fast_path_agrees_with_reference(values)


def test_fast_json_decoder_takes_ordinary_records_itself():
    """Guards the test above: the fast path must really be the one deciding ordinary records."""
    cfg = pipeline(EVERY_TYPE)
    decoder = FastDecoder.for_fields(cfg.format.schema_)
    ordinary = b'{"s":"a","l":1,"d":2.5,"t":"2026-01-02T03:04:05Z","dt":"2026-01-02","bin":"aGk=","class":"c"}'
    decoded = decoder.decode_all(pa.chunked_array([pa.array([ordinary, b'{"s":1,"dt":"2026-01-02"}'])]))
    assert decoded[0] is not None and decoded[1] is None


def test_arrow_json_reader_takes_chunks_of_ordinary_records_itself():
    """Guards the tests above: Arrow's reader really decides chunks of good records, in every form of
    timestamp it reads itself, and hands a chunk with one bad record back."""
    fields = pipeline(EVERY_TYPE).format.schema_
    schema = pa.schema([(f.name, arrow_type(f.type)) for f in fields])
    ordinary = [
        b'{"s":"a","l":1,"d":2.5,"t":"2026-01-02T03:04:05Z","dt":"2026-01-02","bin":"aGk=","class":"c","dec":"-1.5"}',
        b' {"s":"b","f":0.1,"b":false,"t":"2026-01-02T03:04:05.123+02:00","dt":"2026-01-03"}\t',
    ]
    naive = [b'{"s":"a","t":"2026-01-02 03:04:05.5","dt":"2026-01-02"}']
    for values in (ordinary, naive):
        assert arrow_json.read_columns(fields, pa.array(values, pa.binary()), schema, coerce) is not None
    columns = arrow_json.read_columns(fields, pa.array(ordinary + naive, pa.binary()), schema, coerce)
    assert columns is not None and columns[6].to_pylist()[2] == dt.datetime(2026, 1, 2, 3, 4, 5, 500000, dt.UTC)
    assert columns[10].type == pa.decimal128(12, 3) and str(columns[10][0].as_py()) == "-1.500"
    for bad in (
        b'{"s":1,"dt":"2026-01-02"}',
        b'{"s":"a"}',
        b'{"s":"a","dt":"2026-01-02","d":NaN}',
        b'{"s":"a","dt":"2026-01-02","dec":1.5}',  # a decimal as a JSON number: the record path reads it
        b'{"s":"a","dt":"2026-01-02"}{"s":"a","dt":"2026-01-02"}',
        b" ",
        None,
    ):
        assert arrow_json.read_columns(fields, pa.array(ordinary + [bad], pa.binary()), schema, coerce) is None, bad


def test_a_bad_record_sends_only_its_chunk_record_by_record(monkeypatch):
    monkeypatch.setattr(declared_json, "ARROW_JSON_CHUNK", 3)
    monkeypatch.setattr(declared_json, "ARROW_JSON_CHUNK_LEAST", 3)
    good = b'{"s":"a","dt":"2026-01-02","l":%d}'
    values = [good % i for i in range(4)] + [b'{"s":"a","dt":"2026-01-02","l":"x"}'] + [good % i for i in range(5, 9)]
    decided = []
    real = declared_json._parse_one_by_one
    monkeypatch.setattr(
        declared_json, "_parse_one_by_one", lambda cfg, values: decided.append(len(values)) or real(cfg, values)
    )
    assert assert_chunk_agrees_with_reference(values) == 8
    assert decided == [3]  # rows 3 to 5, the chunk holding the bad record


def test_a_refused_chunk_is_halved_until_the_part_around_the_bad_record_goes_record_by_record(monkeypatch):
    monkeypatch.setattr(declared_json, "ARROW_JSON_CHUNK", 16)
    monkeypatch.setattr(declared_json, "ARROW_JSON_CHUNK_LEAST", 2)
    good = b'{"s":"a","dt":"2026-01-02","l":%d}'
    values = [good % i for i in range(20)]
    values[9] = b'{"s":"a","dt":"2026-01-02","l":"x"}'
    decided = []
    real = declared_json._parse_one_by_one
    monkeypatch.setattr(
        declared_json, "_parse_one_by_one", lambda cfg, values: decided.append(len(values)) or real(cfg, values)
    )
    assert assert_chunk_agrees_with_reference(values) == 19
    assert decided == [2]  # 16 -> 8 (rows 8-15) -> 4 (8-11) -> 2 (8-9): rows 8 and 9 one by one
