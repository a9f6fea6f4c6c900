"""formats/native_avro.py and flat_avro.c: flat Avro records decoded in C equal what polars and fastavro
decode from the same payloads, or the C decoder gives up (None) and leaves them to polars."""

from __future__ import annotations

import datetime as dt
import io
import random

import fastavro
import pyarrow as pa
import pytest

from offsetlake.formats import native
from offsetlake.formats.avro import AvroDecoder

ENUM = {"type": "enum", "name": "Colour", "symbols": ["red", "green", "blue"]}
FIELD_TYPES = {
    "boolean": lambda rng: rng.random() < 0.5,
    "int": lambda rng: rng.choice([0, -1, 1, 63, -64, 64, 2**31 - 1, -(2**31), rng.randint(-(2**31), 2**31 - 1)]),
    "long": lambda rng: rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randint(-(2**63), 2**63 - 1)]),
    "float": lambda rng: rng.choice([0.0, -0.0, 1.5, float("inf"), rng.uniform(-1e30, 1e30)]),
    "double": lambda rng: rng.choice([0.0, -0.0, 5e-324, float("-inf"), rng.uniform(-1e300, 1e300)]),
    "string": lambda rng: rng.choice(["", "a", "é☃😀", "x" * rng.randint(0, 300), "\x00"]),
    "bytes": lambda rng: bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))),
    "enum": lambda rng: rng.choice(ENUM["symbols"]),
    "date": lambda rng: dt.date(1, 1, 1) + dt.timedelta(days=rng.randint(0, 3_652_058)),
    "timestamp-millis": lambda rng: (
        dt.datetime(2026, 11, 30, tzinfo=dt.UTC) + dt.timedelta(milliseconds=rng.randint(-(10**13), 10**13))
    ),
    "timestamp-micros": lambda rng: (
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=rng.randint(-(10**16), 10**16))
    ),
}


def avro_type(name: str):
    if name == "enum":
        return ENUM
    if name == "date":
        return {"type": "int", "logicalType": "date"}
    if name.startswith("timestamp"):
        return {"type": "long", "logicalType": name}
    return name


def random_schema(rng: random.Random) -> tuple[dict, list[tuple[str, str, str]]]:
    fields, plan = [], []
    for i in range(rng.randint(1, 8)):
        kind = rng.choice(sorted(FIELD_TYPES))
        nullable = rng.choice(["", "null first", "null last"])
        if kind == "enum" and any(k == "enum" for _, k, _ in plan):
            kind = "string"  # one named enum a schema
        base = avro_type(kind)
        type_ = ["null", base] if nullable == "null first" else [base, "null"] if nullable else base
        fields.append({"name": f"f{i}", "type": type_})
        plan.append((f"f{i}", kind, nullable))
    return {"type": "record", "name": "Flat", "fields": fields}, plan


def encode(schema: dict, records: list[dict]) -> list[bytes]:
    parsed, out = fastavro.parse_schema(schema), []
    for record in records:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


def test_the_decoder_is_built_on_this_machine():
    assert native.library() is not None


def test_random_flat_records_decode_as_polars_and_fastavro_decode_them():
    rng, compared_with_polars = random.Random(3), 0
    for _ in range(60):
        schema, plan = random_schema(rng)
        records = [
            {name: None if nullable and rng.random() < 0.2 else FIELD_TYPES[kind](rng) for name, kind, nullable in plan}
            for _ in range(rng.randint(1, 300))
        ]
        payloads = pa.array(encode(schema, records), pa.binary())
        decoder = AvroDecoder(schema)
        natively = decoder.batches._native.decode(payloads)
        assert natively is not None, schema
        decoded = decoder.batches.decode(payloads)
        decoded.validate(full=True)
        by_polars = decoder.batches.decode_by_polars(payloads)  # None where polars panics: a nullable enum
        assert by_polars is None or decoded.equals(by_polars), schema
        compared_with_polars += by_polars is not None
        one_by_one = pa.array([decoder.decode(p) for p in payloads.to_pylist()], decoder.arrow_type)
        assert decoded.equals(one_by_one), schema
    assert compared_with_polars > 30


def test_a_nullable_enum_that_polars_cannot_read_goes_record_by_record_without_c():
    schema = {"type": "record", "name": "R", "fields": [{"name": "c", "type": ["null", ENUM]}]}
    payloads = pa.array(encode(schema, [{"c": "blue"}, {"c": None}]), pa.binary())
    assert AvroDecoder(schema).batches.decode_by_polars(payloads) is None  # polars 2.1 panics: caught


def test_a_slice_is_decoded_from_where_it_starts():
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"}]}
    payloads = pa.array(encode(schema, [{"n": i, "s": str(i)} for i in range(10)]), pa.binary()).slice(4, 3)
    decoded = AvroDecoder(schema).batches.decode(payloads)
    assert decoded.to_pylist() == [{"n": 4, "s": "4"}, {"n": 5, "s": "5"}, {"n": 6, "s": "6"}]


SCHEMA = {
    "type": "record",
    "name": "R",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "u", "type": ["null", "string"]},
        {"name": "e", "type": ENUM},
    ],
}
GOOD = b"\x01\x02\x02\x04hi\x04"  # true, 1, branch 1 "hi", blue


@pytest.mark.parametrize(
    "payload",
    [
        GOOD[:-1],  # a field short
        GOOD + b"\x00",  # a byte too many
        b"\x02" + GOOD[1:],  # a boolean byte other than 0 or 1
        b"\x01\x82\x00" + GOOD[2:],  # a varint longer than needed
        b"\x01\xfe\xff\xff\xff\x1f" + GOOD[2:],  # an int past 32 bits
        b"\x01\x02\x04" + GOOD[3:],  # a union branch 2
        b"\x01\x02\x02\x03hi\x04",  # a negative length
        b"\x01\x02\x02\x08hi\x04",  # a length past the payload
        b"\x01\x02\x02\x04\xff\xfe\x04",  # a string that is not UTF-8
        GOOD[:-1] + b"\x06",  # an enum index past its symbols
        GOOD[:-1] + b"\x01",  # a negative enum index
    ],
)
def test_it_gives_up_where_another_reader_might_decide(payload):
    decoder = AvroDecoder(SCHEMA).batches._native
    assert decoder.decode(pa.array([GOOD], pa.binary())) is not None
    assert decoder.decode(pa.array([GOOD, payload], pa.binary())) is None


def test_mutated_payloads_are_decoded_as_fastavro_decodes_them_or_given_up():
    rng = random.Random(19)
    decoder = AvroDecoder(SCHEMA)
    answered = 0
    for _ in range(5000):
        payload = bytearray(GOOD + b"")
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(payload))
            if rng.random() < 0.5:
                payload[at] = rng.randrange(256)
            elif rng.random() < 0.5:
                del payload[at]
            else:
                payload.insert(at, rng.randrange(256))
            if not payload:
                payload = bytearray(b"\x00")
        decoded = decoder.batches._native.decode(pa.array([bytes(payload)], pa.binary()))
        if decoded is not None:
            answered += 1
            expected = pa.array([decoder.decode(bytes(payload))], decoder.arrow_type)
            assert decoder.batches._struct(decoded).equals(expected), bytes(payload)
    assert answered > 100
