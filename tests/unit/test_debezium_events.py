"""Debezium change events as rows (`formats/debezium.py`): the pure logic, for JSON and for any registry
format's decoded events (Avro, Protobuf and JSON Schema all decode to the same struct columns)."""

import base64
import decimal
import json

import pyarrow as pa
import pytest

from offsetlake.config import HEADERS_COLUMN, NEW_KEY_COLUMN, OLD_KEY_COLUMN, parse_pipeline
from offsetlake.formats import debezium
from offsetlake.formats.columns import quarantine_schema
from offsetlake.formats.records import convert, reads_headers
from offsetlake.read.reader import HEADERS_FIELD, MESSAGE_SCHEMA, message_schema

ROW = pa.struct([("id", pa.int64()), ("name", pa.string())])
SOURCE = pa.struct([("lsn", pa.int64()), ("db", pa.string())])


def events(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [("before", ROW), ("after", ROW), ("source", SOURCE), ("op", pa.string()), ("ts_ms", pa.int64())]
        ),
    )


def test_registry_events_become_rows_from_after_and_deletes_from_before_with_op_and_position():
    table = events(
        [
            {"before": None, "after": {"id": 1, "name": "a"}, "source": {"lsn": 10}, "op": "r"},
            {"before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}, "source": {"lsn": 11}, "op": "u"},
            {"before": {"id": 1, "name": None}, "after": None, "source": {"lsn": 12}, "op": "d"},
            {"before": None, "after": None, "source": {"lsn": 13}, "op": "t"},
            {"before": None, "after": None, "source": {"lsn": 14}, "op": "c"},
        ]
    )
    rows, not_rows, ending = debezium.unwrap(table, "lsn")
    assert ending == []  # a source without `snapshot` ends no snapshot
    assert rows.column_names == ["id", "name", "_debezium_op", "_debezium_position"]
    assert rows.slice(0, 3).to_pylist() == [
        {"id": 1, "name": "a", "_debezium_op": "r", "_debezium_position": 10},
        {"id": 1, "name": "b", "_debezium_op": "u", "_debezium_position": 11},
        {"id": 1, "name": None, "_debezium_op": "d", "_debezium_position": 12},
    ]
    assert debezium.deletes(rows).to_pylist() == [False, False, True, False, False]
    assert not_rows == {3: not_rows[3], 4: "debezium: op 'c' without a row in 'after'"}
    assert not_rows[3].startswith("debezium: op 't' (a truncate) changes no row")


def test_a_schema_that_is_not_an_envelope_or_lacks_the_position_is_named():
    with pytest.raises(debezium.NotAChangeEvent, match="not a change event \\(no 'before'\\)"):
        debezium.unwrap(pa.table({"id": [1]}), "lsn")
    with pytest.raises(debezium.NotAChangeEvent, match="source has no field 'scn'"):
        debezium.unwrap(events([]), "scn")


def test_the_table_reads_events_with_its_row_in_before_and_after_and_its_position_type():
    current = [
        pa.field("id", pa.int64()),
        pa.field("_debezium_op", pa.string()),
        pa.field("_debezium_position", pa.int64()),
    ]
    assert debezium.envelope_type(current, "lsn") == pa.struct(
        [
            ("before", pa.struct([("id", pa.int64())])),
            ("after", pa.struct([("id", pa.int64())])),
            ("source", pa.struct([("lsn", pa.int64())])),
        ]
    )


@pytest.mark.parametrize(
    "event, reason",
    [
        (b"not json", "value is not valid JSON"),
        (json.dumps({"after": {"id": 1}}).encode(), "not a change event"),
        (json.dumps({"op": "m", "source": {"lsn": 1}}).encode(), "op 'm' (a logical decoding message)"),
        (
            json.dumps({"op": "d", "before": None, "source": {"lsn": 1}}).encode(),
            "op 'd' without an object in 'before'",
        ),
        (
            json.dumps({"op": "c", "after": {"id": 1}, "source": {"lsn": "x"}}).encode(),
            "source.lsn: expected an integer",
        ),
    ],
)
def test_json_events_that_change_no_row_say_why(event, reason):
    with pytest.raises(debezium.NotAChangeEvent, match=reason.replace("(", "\\(").replace(")", "\\)")):
        debezium.json_event(event, "lsn", "long")


def test_a_json_event_wrapped_by_the_converter_gives_its_row():
    event = {"schema": {"type": "struct"}, "payload": {"op": "u", "after": {"id": 7}, "source": {"lsn": 99}}}
    assert debezium.json_event(json.dumps(event).encode(), "lsn", "long") == ("u", b'{"id":7}', 99, False)


@pytest.mark.parametrize(
    "op, snapshot, ends",
    [
        ("r", "last_in_data_collection", True),
        ("r", "last", True),
        ("r", "true", False),
        ("r", "first_in_data_collection", False),
        ("r", "incremental", False),
        ("u", "last", False),  # only a snapshot read ends a snapshot
        ("r", None, False),
    ],
)
def test_the_last_read_of_a_tables_snapshot_ends_it_in_json_and_registry_events(op, snapshot, ends):
    source = {"lsn": 5, **({"snapshot": snapshot} if snapshot else {})}
    event = {"op": op, "after": {"id": 1, "name": "n"}, "source": source}
    assert debezium.json_event(json.dumps(event).encode(), "lsn", "long")[3] is ends

    with_snapshot = pa.struct([("lsn", pa.int64()), ("snapshot", pa.string())])
    table = pa.Table.from_pylist(
        [{**event, "before": None}],
        schema=pa.schema([("before", ROW), ("after", ROW), ("source", with_snapshot), ("op", pa.string())]),
    )
    assert debezium.unwrap(table, "lsn")[2] == ([0] if ends else [])


def _price_pipeline(mode: str, price: str = "decimal(10,2)", **debezium_settings):
    row = [{"name": "id", "type": "long", "required": True}, {"name": "price", "type": price}]
    return parse_pipeline(
        {
            "name": "p",
            "topics": ["t"],
            "kafka": {"bootstrap_servers": "x:1"},
            "table": {"path": "/tmp/x"},
            "write": {"mode": "upsert", "key": ["id"]},
            "format": {
                "type": "json",
                "envelope": "debezium",
                "debezium": {"decimal_handling_mode": mode, **debezium_settings},
                "schema": row,
            },
        },
        "p.yaml",
    )


def _price_events(prices: list) -> pa.Table:
    events = [{"op": "c", "after": {"id": i, "price": p}, "source": {"lsn": i}} for i, p in enumerate(prices)]
    values = [json.dumps(e) for e in events]
    n = len(values)
    return pa.Table.from_arrays(
        [
            pa.array([None] * n, pa.binary()),
            pa.array([v.encode() for v in values], pa.binary()),
            pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(n), pa.int64()),
            pa.array([0] * n, pa.timestamp("ms")),
        ],
        schema=MESSAGE_SCHEMA,
    )


def _unscaled_base64(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True)).decode()


@pytest.mark.parametrize(
    "mode, sent",
    [
        ("precise", [_unscaled_base64(12345), _unscaled_base64(-1), _unscaled_base64(0), None]),
        ("string", ["123.45", "-0.01", "0", None]),
        ("double", [123.45, -0.01, 0.0, None]),
    ],
)
def test_each_decimal_handling_mode_lands_as_the_declared_decimal(mode, sent):
    """What Debezium's decimal.handling.mode sends without schemas (base64 of the unscaled bytes, text, a
    double) becomes the declared decimal(10,2), value for value."""
    cfg = _price_pipeline(mode)
    rows, bad = convert(cfg, _price_events(sent))
    assert bad.num_rows == 0, bad.column("error").to_pylist()
    assert rows.schema.field("price").type == pa.decimal128(10, 2)
    want = [decimal.Decimal("123.45"), decimal.Decimal("-0.01"), decimal.Decimal("0.00"), None]
    assert rows.column("price").to_pylist() == want


def test_a_precise_decimal_of_38_digits_lands_exact():
    """Beyond Decimal's 28-digit context: the unscaled bytes of a decimal(38,2) give every digit back."""
    cfg = _price_pipeline("precise", price="decimal(38,2)")
    rows, bad = convert(cfg, _price_events([_unscaled_base64(-12345678901234567890123456789012345678)]))
    assert bad.num_rows == 0, bad.column("error").to_pylist()
    assert rows.column("price").to_pylist() == [decimal.Decimal("-123456789012345678901234567890123456.78")]


NOT_BASE64 = (
    "debezium: field 'price' is not base64 of a decimal's unscaled bytes "
    "(format.debezium.decimal_handling_mode: precise)"
)


@pytest.mark.parametrize(
    "mode, sent, reason",
    [
        ("precise", 123.45, NOT_BASE64),
        ("precise", "not base64!", NOT_BASE64),
        ("string", "123.456", "field 'price': 123.456 has more than 2 decimal places, the scale of decimal(10,2)"),
        ("string", "123456789.00", "field 'price': 123456789.00 out of range for decimal(10,2)"),
        ("double", True, "field 'price': expected a decimal as text or a number, got bool"),
    ],
)
def test_a_decimal_that_does_not_fit_its_mode_or_type_is_quarantined_saying_why(mode, sent, reason):
    cfg = _price_pipeline(mode)
    rows, bad = convert(cfg, _price_events([sent]))
    assert rows.num_rows == 0 and bad.column("error").to_pylist() == [reason]


def test_a_json_snapshots_end_is_a_marker_row_beside_its_read_unless_snapshots_keep_rows():
    events = [
        {"op": "r", "after": {"id": 1, "price": "1.00"}, "source": {"lsn": 7, "snapshot": "true"}},
        {"op": "r", "after": {"id": 2, "price": "2.00"}, "source": {"lsn": 7, "snapshot": "last_in_data_collection"}},
    ]
    messages = _price_events([0, 0]).set_column(
        1, "value", pa.array([json.dumps(e).encode() for e in events], pa.binary())
    )
    rows, quarantined = convert(_price_pipeline("string"), messages)
    assert quarantined.num_rows == 0
    assert rows.select(["id", "_debezium_op", "_debezium_position", "kafka_offset"]).to_pylist() == [
        {"id": 1, "_debezium_op": "r", "_debezium_position": 7, "kafka_offset": 0},
        {"id": 2, "_debezium_op": "r", "_debezium_position": 7, "kafka_offset": 1},
        {"id": None, "_debezium_op": "snapshot_end", "_debezium_position": 7, "kafka_offset": 1},
    ]
    keep = _price_pipeline("string", snapshot="keep")
    assert convert(keep, messages)[0].column("_debezium_op").to_pylist() == ["r", "r"]


def test_a_key_changes_headers_ride_in_the_staging_rows_and_headers_stay_out_unless_kept():
    """The old key a primary-key change's create names (its `__debezium.oldkey` header) and the new key its
    delete names (`__debezium.newkey`) are staging columns of the rows, null on other events; the quarantine
    keeps the pipeline's own schema."""
    values = [
        json.dumps({"op": "c", "after": {"id": 7, "price": "1.00"}, "source": {"lsn": 1}}).encode(),
        json.dumps({"op": "d", "before": {"id": 8}, "source": {"lsn": 2}}).encode(),
        b"not json",
    ]
    headers = [[("__debezium.oldkey", b'{"id":3}'), ("other", b"x")], [("__debezium.newkey", b'{"id":9}')], []]
    messages = pa.Table.from_arrays(
        [
            pa.array([None] * 3, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(["t"] * 3),
            pa.array([0] * 3, pa.int32()),
            pa.array(range(3), pa.int64()),
            pa.array([0] * 3, pa.timestamp("ms")),
            pa.array(headers, HEADERS_FIELD.type),
        ],
        schema=message_schema(True),
    )
    cfg = _price_pipeline("string")
    assert reads_headers(cfg)
    rows, bad = convert(cfg, messages)
    assert rows.column(OLD_KEY_COLUMN).to_pylist() == [b'{"id":3}', None]
    assert rows.column(NEW_KEY_COLUMN).to_pylist() == [None, b'{"id":9}']
    assert HEADERS_COLUMN not in rows.column_names and bad.schema == quarantine_schema(cfg)
    assert bad.column("kafka_offset").to_pylist() == [2]
