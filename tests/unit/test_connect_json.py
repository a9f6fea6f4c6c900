"""Kafka Connect JSON (`format.type: connect_json`): each Connect schema's Arrow type, and each logical
type's payload read to the value PostgreSQL held (expected values written out here, not derived from the
code under test)."""

import base64
import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from offsetlake.formats.connect_json import ConnectDecoders, UnusableConnectSchema, compile_schema

UTC = dt.UTC


def field(name: str, kind: str, logical: str | None = None, **parameters) -> dict:
    spec = {"field": name, "type": kind, "optional": True}
    if logical:
        spec["name"] = logical
    if parameters:
        spec["parameters"] = {k: str(v) for k, v in parameters.items()}
    return spec


def two_complement(unscaled: int) -> str:
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


CASES = [
    # (schema field, payload value, Arrow type, expected)
    (
        field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale=2, **{"connect.decimal.precision": 12}),
        two_complement(-123456),
        pa.decimal128(12, 2),
        decimal.Decimal("-1234.56"),
    ),
    (field("day", "int32", "io.debezium.time.Date"), 20455, pa.date32(), dt.date(2026, 1, 2)),
    (field("day", "int32", "org.apache.kafka.connect.data.Date"), -1, pa.date32(), dt.date(1969, 12, 31)),
    (
        field("at", "int64", "io.debezium.time.MicroTimestamp"),
        1767323045123456,
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    ),
    (
        field("at", "int64", "io.debezium.time.Timestamp"),
        1767323045123,
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC),
    ),
    (
        field("at", "int64", "io.debezium.time.NanoTimestamp"),
        1767323045123456789,
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
    ),
    (
        field("at", "string", "io.debezium.time.ZonedTimestamp"),
        "2026-01-02T01:04:05.123456Z",
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2026, 1, 2, 1, 4, 5, 123456, tzinfo=UTC),
    ),
    (field("t", "int64", "io.debezium.time.MicroTime"), 3_723_000_001, pa.int64(), 3_723_000_001),
    (field("t", "int32", "org.apache.kafka.connect.data.Time"), 3_723_000, pa.int64(), 3_723_000_000),
    (
        {
            "field": "n",
            "type": "struct",
            "optional": True,
            "name": "io.debezium.data.VariableScaleDecimal",
            "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
        },
        {"scale": 3, "value": two_complement(-5)},
        pa.string(),
        "-0.005",
    ),
    # Beyond Decimal's 28-digit context: exact, at the scale sent, and the variable scale's text in plain digits.
    (
        field("big", "bytes", "org.apache.kafka.connect.data.Decimal", scale=2, **{"connect.decimal.precision": 38}),
        two_complement(12345678901234567890123456789012345678),
        pa.decimal128(38, 2),
        decimal.Decimal("123456789012345678901234567890123456.78"),
    ),
    (
        {
            "field": "n",
            "type": "struct",
            "name": "io.debezium.data.VariableScaleDecimal",
            "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
        },
        {"scale": 3, "value": two_complement(1234567890123456789012345678901)},
        pa.string(),
        "1234567890123456789012345678.901",
    ),
    (
        {
            "field": "n",
            "type": "struct",
            "name": "io.debezium.data.VariableScaleDecimal",
            "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
        },
        {"scale": -2, "value": two_complement(-1118006368237552701691592607)},
        pa.string(),
        "-111800636823755270169159260700",
    ),
    (field("doc", "string", "io.debezium.data.Json"), '{"a": 1}', pa.string(), '{"a": 1}'),
    # Debezium prints an interval's seconds from a double: rounded to PostgreSQL's microsecond they are exact.
    (
        field("i", "string", "io.debezium.time.Interval"),
        "P0Y11M16DT72H57M2.887566999S",
        pa.string(),
        "P0Y11M16DT72H57M2.887567S",
    ),
    (field("i", "string", "io.debezium.time.Interval"), "P-1Y0M-3DT-4H-5M-6.5S", pa.string(), "P-1Y0M-3DT-4H-5M-6.5S"),
    (field("i", "string", "io.debezium.time.Interval"), "P0Y0M0DT0H0M1.0E-6S", pa.string(), "P0Y0M0DT0H0M0.000001S"),
    (field("i", "string", "io.debezium.time.Interval"), "P0Y0M0DT0H0M0.0S", pa.string(), "P0Y0M0DT0H0M0S"),
    (field("b", "bytes"), "3q2+7w==", pa.binary(), b"\xde\xad\xbe\xef"),
    (field("f", "float"), 1.5, pa.float32(), 1.5),
    (field("d", "double"), -2.25, pa.float64(), -2.25),
    (field("s", "int16"), -300, pa.int16(), -300),
    (
        {"field": "tags", "type": "array", "optional": True, "items": {"type": "string", "optional": True}},
        ["x", None],
        pa.list_(pa.string()),
        ["x", None],
    ),
    (
        {"field": "m", "type": "map", "optional": True, "keys": {"type": "string"}, "values": {"type": "int32"}},
        {"a": 1},
        pa.map_(pa.string(), pa.int32()),
        [("a", 1)],
    ),
]


@pytest.mark.parametrize("spec, payload, arrow_type, expected", CASES, ids=lambda c: None)
def test_each_connect_type_reads_to_its_value(spec, payload, arrow_type, expected):
    value = {"type": "struct", "name": "row", "fields": [spec]}
    record = json.dumps({"schema": value, "payload": {spec["field"]: payload}}).encode()
    decoder, body = ConnectDecoders().split(record)
    assert decoder.arrow_type == pa.struct([pa.field(spec["field"], arrow_type)])
    decoded = decoder.decode(body)
    assert decoded == {spec["field"]: expected}
    assert pa.array([decoded], decoder.arrow_type).to_pylist() == [{spec["field"]: expected}]


def test_a_null_value_of_any_type_is_null():
    for spec, _, _, _ in CASES:
        assert compile_schema(spec)[1](None) is None


def test_values_that_carry_no_connect_schema_are_refused_saying_what_is_needed():
    with pytest.raises(ValueError, match="schemas.enable=true"):
        ConnectDecoders().split(b'{"id": 1}')
    with pytest.raises(ValueError, match="not valid JSON"):
        ConnectDecoders().split(b'{"schema": ')


def test_a_decimal_wider_than_delta_allows_names_the_field_and_the_setting():
    spec = field("big", "bytes", "org.apache.kafka.connect.data.Decimal", scale=2, **{"connect.decimal.precision": 50})
    with pytest.raises(UnusableConnectSchema, match=r"value.big: Decimal\(50, 2\).*decimal.handling.mode"):
        compile_schema({"type": "struct", "fields": [spec]})


def test_interval_text_that_is_not_debeziums_is_refused_saying_so():
    spec = field("i", "string", "io.debezium.time.Interval")
    value = {"type": "struct", "name": "row", "fields": [spec]}
    record = json.dumps({"schema": value, "payload": {"i": "1 day 02:00:00"}}).encode()
    decoder, body = ConnectDecoders().split(record)
    with pytest.raises(ValueError, match="expected Debezium's interval text"):
        decoder.decode(body)


def test_a_wrong_payload_type_is_an_error_naming_what_was_expected():
    _, convert = compile_schema(field("n", "int32"))
    with pytest.raises(TypeError, match="expected an integer"):
        convert("1")
    with pytest.raises(OverflowError, match="out of range for int32"):
        convert(2**31)
