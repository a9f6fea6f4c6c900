"""Protobuf messages decoded together (ptars, `FastProtobuf`) equal the same messages decoded one by one,
value for value and type for type; a batch holding anything the one-by-one path refuses is not decoded
together at all (None: the caller goes record by record and quarantines with the reason)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from offsetlake.formats import wire_values
from offsetlake.formats.protobuf import ProtobufDecoder
from offsetlake.formats.protobuf_batches import FastProtobuf
from proto_messages import message_class

EVENT = """
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/type/date.proto";
enum Color { RED = 0; GREEN = 1; BLUE = 2; }
message Inner { string a = 1; int32 b = 2; google.protobuf.Timestamp at = 3; }
message Event {
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10; float fl = 11; double db = 12;
  bool bo = 13; string st = 14; bytes by = 15; Color co = 16; optional int32 opt = 17; Inner inner = 18;
  repeated int32 ri = 19; repeated Inner rm = 20; google.protobuf.Timestamp ts = 22;
  google.protobuf.Int64Value w64 = 23; google.protobuf.StringValue wst = 24; optional string ost = 25;
  repeated Color rc = 27; google.protobuf.UInt64Value wu64 = 28; google.type.Date day = 29;
  repeated google.protobuf.Timestamp rts = 30;
  oneof choice { string one_s = 31; Inner one_m = 32; }
}
"""

LEGACY = """
syntax = "proto2";
package l;
message Legacy { optional int32 n = 1 [default = 7]; required string s = 2; optional string d = 3 [default = "x"];
  repeated int64 r = 4 [packed = true]; }
"""


def one_by_one(decoder: ProtobufDecoder, payloads: list[bytes]) -> list:
    return pa.array([decoder.decode(p) for p in payloads], decoder.arrow_type).to_pylist()


def random_event(cls, rng: random.Random):
    m = cls()
    for name, bits, signed in (("i32", 32, 1), ("i64", 64, 1), ("u32", 32, 0), ("u64", 64, 0), ("s32", 32, 1)):
        if rng.random() < 0.7:
            setattr(m, name, rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else rng.randrange(2**bits))
    m.s64, m.f32, m.f64 = rng.randrange(-(2**63), 2**63), rng.randrange(2**32), rng.randrange(2**64)
    m.sf32, m.sf64 = rng.randrange(-(2**31), 2**31), rng.randrange(-(2**63), 2**63)
    m.fl, m.db, m.bo = rng.choice([0.0, 1.5, -2.25, float("inf")]), rng.uniform(-1e300, 1e300), rng.random() < 0.5
    m.st = rng.choice(["", "héllo", "x" * rng.randrange(300), "\u20ac\U0001f600"])
    m.by = rng.randbytes(rng.randrange(5))
    m.co = rng.choice([0, 1, 2])
    if rng.random() < 0.5:
        m.opt = rng.choice([0, -1, 5])
    if rng.random() < 0.5:
        m.ost = rng.choice(["", "set"])
    if rng.random() < 0.6:
        m.inner.a, m.inner.b = f"a{rng.randrange(9)}", rng.randrange(-5, 5)
        if rng.random() < 0.5:
            m.inner.at.seconds, m.inner.at.nanos = rng.randrange(-(10**10), 10**10), rng.randrange(10**9)
    m.ri.extend(rng.randrange(-(2**31), 2**31) for _ in range(rng.randrange(4)))
    for _ in range(rng.randrange(3)):
        m.rm.add(a=rng.choice(["", "r"]), b=rng.randrange(3))
    if rng.random() < 0.7:
        m.ts.seconds, m.ts.nanos = rng.randrange(-62_135_596_800, 253_402_300_800), rng.randrange(10**9)
    if rng.random() < 0.5:
        m.w64.value = rng.choice([0, -(2**63), 42])
    if rng.random() < 0.5:
        m.wst.value = rng.choice(["", "w"])
    if rng.random() < 0.5:
        m.wu64.value = rng.choice([0, 2**64 - 1])
    m.rc.extend(rng.choice([0, 1, 2]) for _ in range(rng.randrange(3)))
    if rng.random() < 0.6:
        m.day.year, m.day.month, m.day.day = rng.choice([(2024, 2, 29), (1, 1, 1), (9999, 12, 31), (0, 5, 5)])
    for _ in range(rng.randrange(3)):
        m.rts.add(seconds=rng.randrange(-(10**9), 10**9), nanos=rng.randrange(10**9))
    choice = rng.randrange(3)
    if choice == 1:
        m.one_s = rng.choice(["", "o"])
    elif choice == 2:
        m.one_m.a = "m"
    return m


def test_random_messages_decode_together_exactly_as_one_by_one():
    cls = message_class(EVENT, "t.Event")
    decoder = ProtobufDecoder(cls.DESCRIPTOR)
    rng = random.Random(20261129)
    payloads = [random_event(cls, rng).SerializeToString() for _ in range(3000)]
    payloads += [b"", bytes([0x80, 0x01, 0x07]), bytes([0x08, 1, 0x08, 2]), bytes([0x09] + [0] * 8)]  # empty,
    # an enum number newer than the schema, a scalar given twice, a field in another wire type than the schema's
    payloads += [bytes([0x92, 1, 3, 0x0A, 1, 0x41]) + bytes([0x92, 1, 2, 0x10, 5])]  # a message field given twice
    negative_nanos = cls()
    negative_nanos.ts.seconds, negative_nanos.ts.nanos = -1, -1  # outside the spec, rounded down by both
    payloads.append(negative_nanos.SerializeToString())
    together = decoder.decode_many(payloads)
    assert together is not None and together.type == decoder.arrow_type
    assert together.to_pylist() == one_by_one(decoder, payloads)
    as_arrow = decoder.decode_many(pa.array(payloads, pa.binary()))  # the reader hands an Arrow array
    assert as_arrow is not None and as_arrow.equals(together)


@pytest.mark.parametrize(
    "damage",
    ["bad utf-8", "truncated", "timestamp after 9999", "timestamp before year 1", "february 30th", "month 13"],
)
def test_a_value_the_one_by_one_path_refuses_sends_the_batch_record_by_record(damage):
    cls = message_class(EVENT, "t.Event")
    decoder = ProtobufDecoder(cls.DESCRIPTOR)
    rng = random.Random(7)
    payloads = [random_event(cls, rng).SerializeToString() for _ in range(200)]
    bad = cls()
    if damage == "timestamp after 9999":
        bad.ts.seconds = 253_402_300_800
    elif damage == "timestamp before year 1":
        bad.inner.at.seconds = -62_135_596_801
    elif damage == "february 30th":
        bad.day.year, bad.day.month, bad.day.day = 2023, 2, 30
    elif damage == "month 13":
        bad.day.year, bad.day.month, bad.day.day = 2023, 13, 1
    wire = {"bad utf-8": bytes([0x72, 2, 0xFF, 0xFE]), "truncated": bytes([0x72, 5, 0x41])}
    payloads.insert(100, wire.get(damage, bad.SerializeToString()))
    # The record-by-record path refuses it: quarantined with the reason.
    with pytest.raises((ValueError, OverflowError, OSError)):
        decoder.decode(payloads[100])
    assert decoder.decode_many(payloads) is None
    del payloads[100]
    assert decoder.decode_many(payloads).to_pylist() == one_by_one(decoder, payloads)


def test_proto2_defaults_presence_and_packed_fields_decode_together_as_one_by_one():
    cls = message_class(LEGACY, "l.Legacy")
    decoder = ProtobufDecoder(cls.DESCRIPTOR)
    payloads = [cls(s=f"s{i}", r=list(range(i % 4)), **({"n": i} if i % 2 else {})) for i in range(100)]
    payloads = [m.SerializeToString() for m in payloads]
    payloads += [cls(s="", d="").SerializeToString()]
    assert decoder.decode_many(payloads).to_pylist() == one_by_one(decoder, payloads)


def test_schemas_whose_readers_differ_take_the_record_by_record_path():
    maps = message_class('syntax = "proto3"; message M { map<string, int64> counts = 1; }', "M")
    aliased = message_class(
        'syntax = "proto3"; enum E { option allow_alias = true; A = 0; B = 0; } message M { E e = 1; }', "M"
    )
    nested_map = message_class('syntax = "proto3"; message I { map<int32, int32> m = 1; } message M { I i = 1; }', "M")
    for cls in (maps, aliased, nested_map):
        assert FastProtobuf.of(cls.DESCRIPTOR, ProtobufDecoder(cls.DESCRIPTOR).arrow_type) is None
        assert ProtobufDecoder(cls.DESCRIPTOR).decode_many([cls().SerializeToString()] * 100) is None


def test_one_corrupt_payload_in_a_large_group_sends_only_its_part_record_by_record():
    cls = message_class(EVENT, "t.Event")
    decoder = ProtobufDecoder(cls.DESCRIPTOR)
    rng = random.Random(11)
    payloads = [random_event(cls, rng).SerializeToString() for _ in range(3 * wire_values.SPLIT_AT)]
    corrupt = 5000
    payloads[corrupt] = bytes([0x72, 5, 0x41])  # a string field cut short
    one_by_one_calls = []
    decode = decoder.decode
    decoder.decode = lambda payload: one_by_one_calls.append(payload) or decode(payload)  # type: ignore[method-assign]
    errors: dict[int, str] = {}
    positions = list(range(10, 10 + len(payloads)))
    array, kept = wire_values.decode_group(decoder, positions, pa.array(payloads, pa.binary()), errors, "value")
    assert list(errors) == [10 + corrupt] and errors[10 + corrupt].startswith("value: not a valid Protobuf record")
    assert kept == [p for p in positions if p != 10 + corrupt]
    good = payloads[:corrupt] + payloads[corrupt + 1 :]
    assert array.to_pylist() == pa.array([decode(p) for p in good], decoder.arrow_type).to_pylist()
    assert len(one_by_one_calls) < wire_values.SPLIT_AT  # the rest decoded together
