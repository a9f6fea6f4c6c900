"""Debezium change events as rows (`formats/debezium.py`): the pure logic, for JSON and for any registry
format's decoded events (Avro, Protobuf and JSON Schema all decode to the same struct columns)."""

import json

import pyarrow as pa
import pytest

from offsetlake.formats import debezium

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
    rows, not_rows = debezium.unwrap(table, "lsn")
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
    assert debezium.json_event(json.dumps(event).encode(), "lsn", "long") == ("u", b'{"id":7}', 99)
