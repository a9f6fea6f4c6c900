"""Kafka Connect JSON payloads decoded a batch at a time (connect_batches, Arrow's JSON reader) against the
record path (connect_json's converters), value for value: a batch the fast path takes must equal the record
path's values and type; a batch holding any payload the record path refuses or might read differently must
be refused (None), so that the record path words the error."""

from __future__ import annotations

import base64
import json
import random

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from offsetlake.formats import native_json
from offsetlake.formats.connect_batches import _one_json_value_each
from offsetlake.formats.connect_json import ConnectDecoder, ConnectDecoders
from offsetlake.formats.wire_values import decode_values

DECIMAL = "org.apache.kafka.connect.data.Decimal"
INT_BOUNDS = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**63}


def field(name: str, kind: str, logical: str | None = None, **extra) -> dict:
    spec = {"field": name, "type": kind, "optional": True, **extra}
    if logical:
        spec["name"] = logical
    return spec


ROW = {
    "type": "struct",
    "name": "db.s.t.Value",
    "optional": True,
    "fields": [
        *(field(k, k) for k in INT_BOUNDS),
        field("f32", "float"),
        field("f64", "double"),
        field("flag", "boolean"),
        field("text", "string"),
        field("amount", "bytes", DECIMAL, parameters={"scale": "2"}),
        field("wide", "bytes", DECIMAL, parameters={"scale": "0", "connect.decimal.precision": "5"}),
        field("day", "int32", "io.debezium.time.Date"),
        field("at_ms", "int64", "io.debezium.time.Timestamp"),
        field("at_us", "int64", "io.debezium.time.MicroTimestamp"),
        field("at_ns", "int64", "io.debezium.time.NanoTimestamp"),
        field("clock", "int64", "io.debezium.time.MicroTime"),
        field("clock_ms", "int32", "org.apache.kafka.connect.data.Time"),
        field("zoned", "string", "io.debezium.time.ZonedTimestamp"),
        field("tags", "array", items={"type": "string", "optional": True}),
        field("points", "array", items={"type": "struct", "optional": True, "fields": [field("x", "int32")]}),
    ],
}
ENVELOPE = {
    "type": "struct",
    "name": "db.s.t.Envelope",
    "optional": False,
    "fields": [
        {**ROW, "field": "before"},
        {**ROW, "field": "after"},
        {
            "type": "struct",
            "field": "source",
            "optional": False,
            "fields": [field("lsn", "int64"), field("table", "string")],
        },
        field("op", "string"),
    ],
}


def unscaled(n: int) -> str:
    return base64.b64encode(n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)).decode()


ZONED = [
    "2026-11-29T08:34:34.630878Z",
    "2026-11-29T08:34:34Z",
    "2026-11-29T08:34:34.63+05:30",
    "2026-11-29 08:34:34.1-01:00",
    "2026-11-29T08:34:34.630878",  # naive: UTC
    "2026-11-29T08:34:34.630878123Z",  # nanoseconds: the record path's own reading
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "2026-11-29",
]


def random_row(rng: random.Random) -> dict:
    row: dict = {}
    for kind, bound in INT_BOUNDS.items():
        row[kind] = rng.choice([0, -1, bound - 1, -bound, rng.randrange(-bound, bound), None])
    row["f32"] = rng.choice([0.0, -0.0, 1.5, 3.4e38, 1e-45, 0.1, 7, None])
    row["f64"] = rng.choice([0.0, 1e308, -2.5e-308, 0.1, 12, 123456789012345678901234567890, None])
    row["flag"] = rng.choice([True, False, None])
    row["text"] = rng.choice(["", "row", "é ü", "😀", "line\nbreak", '"quoted"', None])
    digits = 10 ** rng.randrange(1, 39)
    row["amount"] = rng.choice([unscaled(rng.randrange(-digits, digits)), unscaled(0), unscaled(-(10**37)), None])
    row["wide"] = rng.choice([unscaled(99_999), unscaled(-99_999), unscaled(5), None])
    row["day"] = rng.choice([0, -719_162, 2_932_896, rng.randrange(-100_000, 100_000), None])
    row["at_ms"] = rng.choice([0, -1, 253_402_300_799_999, -62_135_596_800_000, rng.randrange(-(10**13), 10**13), None])
    row["at_us"] = rng.choice([-1, 253_402_300_799_999_999, rng.randrange(-(10**16), 10**16), None])
    row["at_ns"] = rng.choice([-1, -999, 1_999, -(2**63), rng.randrange(-(2**63), 2**63), None])
    row["clock"] = rng.choice([0, 86_399_999_999, None])
    row["clock_ms"] = rng.choice([0, 86_399_999, -5, None])
    row["zoned"] = rng.choice([*ZONED, None])
    row["tags"] = rng.choice([[], ["a", None, "b"], None])
    row["points"] = rng.choice([[], [{"x": 1}, None, {"x": -(2**31)}], [{"x": None}], None])
    for name in rng.sample(sorted(row), rng.randrange(3)):
        del row[name]  # a field left out reads as null
    return row


def random_event(rng: random.Random) -> bytes:
    event = {
        "before": random_row(rng) if rng.random() < 0.4 else None,
        "after": random_row(rng) if rng.random() < 0.9 else None,
        "source": {"lsn": rng.randrange(2**40), "table": "t", "unknown": {"nested": [1, 2]}},
        "op": rng.choice(["c", "u", "d", "r"]),
    }
    if rng.random() < 0.1:
        event["ts_ms"] = 5  # a field the schema does not have
    text = json.dumps(event, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.1:
        text = json.dumps(event, indent=1)  # newlines between tokens
    return text.encode()


def one_by_one(decoder: ConnectDecoder, payloads: list[bytes]) -> pa.Array:
    return pa.array([decoder.decode(p) for p in payloads], decoder.arrow_type)


def test_random_events_decode_together_exactly_as_one_by_one():
    decoder = ConnectDecoder(ENVELOPE)
    rng = random.Random(20261129)
    payloads = [random_event(rng) for _ in range(2000)]
    together = decoder.decode_many(payloads)
    assert together is not None and together.type == decoder.arrow_type
    expected = one_by_one(decoder, payloads)
    assert together.equals(expected)
    assert together.to_pylist() == expected.to_pylist()


def test_zoned_timestamps_with_their_zone_are_read_by_the_native_parser_as_one_by_one():
    """A Debezium table's usual events (every ZonedTimestamp naming its zone): the native parser reads them,
    ZonedTimestamps included, and the batch equals the record path."""
    decoder = ConnectDecoder(ENVELOPE)
    rng = random.Random(20261130)
    aware = [ZONED[i] for i in (0, 1, 2, 3, 6, 7)]  # a zone each, to the microsecond at most

    def row() -> dict:
        return {
            "int64": rng.randrange(-(2**63), 2**63),
            "text": rng.choice(["", "row", "é ü"]),
            "amount": unscaled(rng.randrange(-(10**9), 10**9)),
            "zoned": rng.choice([*aware, None]),
        }

    events = [
        {
            "before": row() if rng.random() < 0.3 else None,
            "after": row(),
            "source": {"lsn": n, "table": "t"},
            "op": rng.choice("cud"),
        }
        for n in range(500)
    ]
    payloads = [json.dumps(event).encode() for event in events]
    fast = decoder.batches
    assert fast is not None
    natively = native_json.read_objects(pa.array(payloads, pa.binary()), fast._natively_as)
    assert natively is not None  # the native parser answered, timestamps and all
    assert natively.schema.field("after").type.field("zoned").type == native_json.TIMESTAMP
    together = decoder.decode_many(payloads)
    expected = one_by_one(decoder, payloads)
    assert together is not None and together.equals(expected)
    assert together.to_pylist() == expected.to_pylist()


BAD_VALUES = {
    "int8 out of range": ("int8", 128),
    "int16 out of range": ("int16", -(2**15) - 1),
    "int32 out of range": ("int32", 2**31),
    "int64 out of range": ("int64", 2**63),
    "float for an integer": ("int32", 1.0),
    "boolean for an integer": ("int64", True),
    "text for an integer": ("int8", "1"),
    "number for a string": ("text", 5),
    "number for a boolean": ("flag", 1),
    "boolean for a double": ("f64", False),
    "lone surrogate": ("text", "\ud800"),
    "decimal past its precision": ("wide", unscaled(100_000)),
    "decimal not base64": ("amount", "%%%"),
    "number for a decimal": ("amount", 12),
    "date after 9999": ("day", 2_932_897),
    "date before year 1": ("day", -719_163),
    "timestamp after 9999": ("at_ms", 253_402_300_800_000),
    "nanoseconds before year 1": ("at_ns", -62_135_596_800_000_000_001),
    "february 30th": ("zoned", "2026-02-30T00:00:00Z"),
    "year 0": ("zoned", "0000-01-01T00:00:00Z"),
    "not a time": ("zoned", "yesterday"),
    "number for a zoned timestamp": ("zoned", 5),
    "object for an array": ("tags", {"a": 1}),
    "integer item out of range": ("points", [{"x": 2**31}]),
    "time past int64": ("clock_ms", 2**62),
}


@pytest.mark.parametrize("damage", sorted(BAD_VALUES))
def test_a_value_the_record_path_refuses_sends_the_batch_record_by_record(damage):
    decoder = ConnectDecoder(ENVELOPE)
    rng = random.Random(7)
    payloads = [random_event(rng) for _ in range(200)]
    name, value = BAD_VALUES[damage]
    event = json.loads(payloads[100])
    event["after"] = {**(event["after"] or {}), name: value}
    payloads[100] = json.dumps(event).encode()
    with pytest.raises((TypeError, ValueError, OverflowError, pa.ArrowInvalid)):
        one_by_one(decoder, [payloads[100]])
    assert decoder.decode_many(payloads) is None
    del payloads[100]
    assert decoder.decode_many(payloads).equals(one_by_one(decoder, payloads))


def padded(n: int, size: int) -> str:
    return base64.b64encode(n.to_bytes(size, "big", signed=True)).decode()


DECIMAL_TEXTS = {
    "one byte": unscaled(-1),
    "sixteen bytes": unscaled(-(2**127)),
    "seventeen bytes, in range": padded(5, 17),
    "sign bytes before a small value": padded(-3, 9),
    "empty": "",
    "trailing bits set": "AR==",
    "padding then more": "AQ==AQ==",
    "padding short": "AQ=",
    "three pads": "A===",
    "space": " AQ==",
    "url-safe alphabet": base64.urlsafe_b64encode(b"\xfb\xff").decode(),
    "38 nines": unscaled(10**38 - 1),
    "39 digits": unscaled(10**38),
    "past int64, within 38 digits": unscaled(-(2**70)),
}


@pytest.mark.parametrize("text", sorted(DECIMAL_TEXTS))
def test_decimal_texts_decode_together_as_one_by_one_or_go_record_by_record(text):
    """A batch of decimals is read in bulk (base64 by length); any text the record path might read
    otherwise sends the batch record by record, never a different value."""
    decoder = ConnectDecoder(ENVELOPE)
    payloads = [random_event(random.Random(i)) for i in range(100)]
    event = json.loads(payloads[50])
    event["after"] = {**(event["after"] or {}), "amount": DECIMAL_TEXTS[text]}
    payloads[50] = json.dumps(event).encode()
    together = decoder.decode_many(payloads)
    try:
        expected = one_by_one(decoder, payloads)
    except (TypeError, ValueError, OverflowError, pa.ArrowInvalid):
        assert together is None
        return
    assert together is None or together.equals(expected)
    if text in ("one byte", "sixteen bytes", "sign bytes before a small value", "trailing bits set", "38 nines"):
        assert together is not None, "a plain decimal sent the batch record by record"
    if text == "past int64, within 38 digits":
        assert together is not None


@pytest.mark.parametrize(
    "payload",
    [b"null", b"[1]", b'{"op": "c", "op": "u", "source": {"lsn": 1, "table": "t"}}', b'"text"'],
    ids=["null", "array", "a key twice", "a string"],
)
def test_a_payload_that_is_no_plain_object_is_left_to_the_record_path(payload):
    decoder = ConnectDecoder(ENVELOPE)
    payloads = [random_event(random.Random(i)) for i in range(100)]
    assert decoder.decode_many([*payloads[:50], payload, *payloads[50:]]) is None


@pytest.mark.parametrize(
    "spec",
    [
        {"type": "bytes"},
        {"type": "map", "keys": {"type": "string"}, "values": {"type": "int32"}},
        {"type": "string", "name": "io.debezium.time.Interval"},
        {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
    ],
    ids=["bytes", "map", "interval", "variable scale decimal"],
)
def test_schemas_with_types_this_path_does_not_read_go_record_by_record(spec):
    schema = {"type": "struct", "fields": [field("id", "int64"), {**spec, "field": "x", "optional": True}]}
    decoder = ConnectDecoder(schema)
    assert decoder.decode_many([b'{"id": %d, "x": null}' % i for i in range(100)]) is None


def test_a_scalar_schema_and_a_key_go_record_by_record():
    assert ConnectDecoder({"type": "int64"}).decode_many([b"1"] * 100) is None
    key = ConnectDecoder({"type": "struct", "fields": [field("id", "int64")]}, record=False)
    assert key.decode_many([b'{"id": 1}'] * 100) is None


class OneByOne(ConnectDecoders):
    """The reference: every value read in full by `split`, no opening remembered."""

    def bulk_groups(self, values):
        return [], np.arange(len(values))

    def _remember_prefix(self, data, schema, decoder):
        pass


def envelope(schema: dict, payload: object) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}, separators=(",", ":")).encode()


def test_values_read_by_their_opening_decode_and_fail_exactly_as_each_read_in_full():
    rng = random.Random(11)
    evolved = {**ENVELOPE, "fields": [*ENVELOPE["fields"], field("ts_ms", "int64")]}
    values = [envelope(ENVELOPE, json.loads(random_event(rng))) for _ in range(300)]
    values += [envelope(evolved, {**json.loads(random_event(rng)), "ts_ms": i}) for i in range(200)]
    opening = envelope(ENVELOPE, None)[: -len(b"null}")]
    odd = {
        5: json.dumps({"schema": ENVELOPE, "payload": json.loads(random_event(rng))}, indent=1).encode(),
        17: opening + b'{"op": "c", "source": {"lsn": 1, "table": "t"}',  # cut short
        40: opening + b'{"op": "c", "source": {"lsn": 1, "table": "t"}},"extra":1}',  # a key after the payload
        41: opening + b'{"op": "c"},"payload":{"op": "u"}}',  # the payload given twice: the last one
        42: opening + b'{"op": "c"} {"op": "u"}}',  # two values
        43: opening + b"{nope}",  # not JSON
        44: None,  # a tombstone
        45: envelope({"type": "nonsense"}, 1),  # a schema offsetlake cannot use
        46: opening + b'{"op": "c", "source": {"lsn": "x", "table": "t"}}}',  # a payload its schema refuses
        47: opening + b'{"op": "c", "op": "d", "source": {"lsn": 1, "table": "t"}}}',  # a key twice: the last
        48: opening + b'{"op": "c", "source": {"lsn": 1, "table": "\xff"}}}',  # not UTF-8
        49: opening.replace(b'"optional"', b'"OPTIONAL"', 1) + b'{"op": "c"}}',  # an opening no schema has
        350: envelope(ENVELOPE, None),  # a null payload
    }
    for position, value in odd.items():
        values[position] = value
    raw = pa.chunked_array([pa.array(values, pa.binary())])

    fast = decode_values(ConnectDecoders(), raw, None, "value", nulls_allowed=True)
    reference = decode_values(OneByOne(), raw, None, "value", nulls_allowed=True)

    assert fast[1] == reference[1]  # the type every schema met merges to
    assert fast[2] == reference[2]  # the same records refused, with the same words
    assert fast[0].equals(reference[0])
    assert set(fast[2]) == {17, 40, 42, 43, 45, 46, 48}, {k: v for k, v in fast[2].items() if k > 47}
    again = ConnectDecoders()  # a second batch: the openings are known from the first
    decode_values(again, raw, None, "value", nulls_allowed=True)
    assert decode_values(again, raw, None, "value", nulls_allowed=True)[0].equals(reference[0])


def test_the_usual_envelopes_are_read_by_their_opening_not_one_by_one():
    decoders = ConnectDecoders()
    values = pa.array([envelope(ENVELOPE, json.loads(random_event(random.Random(i)))) for i in range(100)])
    groups, others = decoders.bulk_groups(values)
    assert [len(positions) for _, positions, _ in groups] == [100] and len(others) == 0


PAYLOAD_TEXTS = [
    b'{"a":1}',
    b'{"a":1},"x":2',  # a key after the payload
    b' {"b":2}',  # whitespace before: one value, not where the others meet
    b'{"c":"\\u00e9"}',
    b"[1",
    b"2]",  # with the one before: one array across two texts
    b"{}",
    b"1,2",
    b"3",
    b'"a',
    b'b"',
    b"null",
    b"{nope}",
    b'{"d":"\xff"}',  # not UTF-8
    b"",
]


def test_texts_read_as_one_array_are_each_one_json_value_exactly_when_read_alone():
    """The openings' payload texts are checked together (one JSON array); whatever the texts, the verdict
    per text is what reading it alone gives."""

    def alone(text: bytes) -> bool:
        try:
            msgspec.json.decode(text, type=msgspec.Raw)
        except msgspec.DecodeError:
            return False
        return True

    rng = random.Random(5)
    for _ in range(400):
        texts = [rng.choice(PAYLOAD_TEXTS) for _ in range(rng.randrange(1, 6))]
        verdicts = _one_json_value_each(pa.array(texts, pa.binary()))
        assert verdicts.tolist() == [alone(t) for t in texts], texts
