"""formats/native_json.py and json_columns.c: the C parser reads what Arrow's JSON reader reads, column for
column, or gives up (None) and leaves the chunk to Arrow's reader."""

from __future__ import annotations

import json
import random
import struct

import pyarrow as pa
import pytest

from offsetlake.formats import arrow_json, native, native_json

NESTED = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("score", pa.float64()),
        ("ok", pa.bool_()),
        ("n", pa.int32()),
        (
            "s",
            pa.struct(
                [("a", pa.int64()), ("b", pa.list_(pa.string())), ("c", pa.list_(pa.struct([("d", pa.float64())])))]
            ),
        ),
    ]
)


def by_arrow(values: pa.Array, parsed_as: pa.Schema) -> pa.Table | None:
    return arrow_json.read_document(arrow_json.lines(values), parsed_as, len(values))


def natively(values: list[bytes], parsed_as: pa.Schema = NESTED) -> pa.Table | None:
    table = native_json.read_objects(pa.array(values, pa.binary()), parsed_as)
    if table is not None:
        for column in table.columns:
            column.validate(full=True)
    return table


def test_the_parser_is_built_on_this_machine():
    assert native.library() is not None  # CI installs a C compiler (.ci/system-packages.sh)


def test_ordinary_records_are_read_natively_as_arrow_reads_them():
    values = [
        b'{"id": 1, "name": "a\\u00e9\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\n", "score": 1.5, "ok": true, "n": -5,'
        b' "s": {"a": 3, "b": ["x", null], "c": [{"d": 2}, null, {}]}, "undeclared": [1, {"q": null}]}',
        b'{"id": -9223372036854775808, "name": null, "score": 12345678901234567890, "ok": false}',
        b' {"s": null, "id": 0, "n": 2147483647}\t',
        '{"name": "ünïcödé \u2603", "score": -0.0, "s": {"b": [], "c": []}}'.encode(),
        b"{}",
    ]
    table = natively(values)
    assert table is not None
    assert table.equals(by_arrow(pa.array(values, pa.binary()), NESTED))
    assert table.column("name").to_pylist()[0] == 'a\u00e9\U0001f600 "q" \\ / \n'


def test_a_slice_is_read_from_where_it_starts():
    values = pa.array([f'{{"id": {i}, "name": "n{i}"}}'.encode() for i in range(10)], pa.binary()).slice(3, 4)
    table = native_json.read_objects(values, NESTED)
    assert table is not None and table.column("id").to_pylist() == [3, 4, 5, 6]
    assert table.equals(by_arrow(values, NESTED))


@pytest.mark.parametrize(
    "value",
    [
        b'{"id": 1.0}',  # a float for an integer
        b'{"id": 1e2}',
        b'{"id": 9223372036854775808}',  # out of range
        b'{"n": 2147483648}',
        b'{"n": -2147483649}',
        b'{"name": 5}',  # a number for a string
        b'{"ok": 1}',
        b'{"s": []}',
        b'{"s": {"b": "x"}}',
        b'{"id": 1, "id": 1}',  # a field twice
        b'{"s": {"a": 1, "a": 2}}',
        b'{"\\u0069d": 1}',  # an escaped key
        b'{"score": NaN}',
        b'{"score": 1e400}',  # not finite as a double
        b'{"x": NaN}',
        b'{"name": "\\ud800"}',  # a lone surrogate
        b'{"name": "\\udc00x"}',
        b'{"name": "\xed\xa0\x80"}',  # a surrogate in UTF-8
        b'{"name": "\xc0\xaf"}',  # an overlong form
        b'{"name": "\xff"}',
        b'{"name": "a\x01b"}',  # a raw control character
        b'{"name": "\\x"}',
        b'{"id": 01}',
        b'{"id": -}',
        b'{"score": 1.}',
        b'{"score": .5}',
        b'{"a": 1,}',
        b'{"a" 1}',
        b'{"a": 1} x',
        b"[1]",
        b"",
        b'{"id": 1',
        b'{"x": ' + b"[" * 70 + b"]" * 70 + b"}",  # deeper than the parser goes
        b'{"id": 1}\x0c',  # not JSON whitespace
    ],
)
def test_it_gives_up_where_arrow_or_the_reference_might_decide(value):
    assert natively([b'{"id": 7}', value]) is None


def test_types_it_has_no_reader_for_go_to_arrow():
    for type_ in (pa.float32(), pa.timestamp("us"), pa.large_string(), pa.map_(pa.string(), pa.int64())):
        assert native_json.read_objects(pa.array([b'{"x": 1}'], pa.binary()), pa.schema([("x", type_)])) is None


def test_numbers_read_as_python_reads_them():
    rng = random.Random(7)
    texts = []
    for _ in range(20_000):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20))).lstrip("0") or "0"
        text = ("-" if rng.random() < 0.3 else "") + digits
        if rng.random() < 0.6:
            text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        if rng.random() < 0.3:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 320))
        texts.append(text)
    schema = pa.schema([("x", pa.float64())])
    read = []
    for text in texts:  # one a chunk: a number that is not finite gives up its own chunk only
        table = natively([f'{{"x": {text}}}'.encode()], schema)
        read.append(None if table is None else table.column("x")[0].as_py())
    bits = lambda v: struct.pack("<d", v)  # noqa: E731 - -0.0 and 0.0 apart
    for text, value in zip(texts, read):
        expected = float(text)
        if expected in (float("inf"), float("-inf")):
            assert value is None, text
        else:
            assert value is not None and bits(value) == bits(expected), text
    integers = [str(rng.randint(-(2**63), 2**63 - 1)) for _ in range(5000)] + ["0", "-0", str(2**63 - 1), str(-(2**63))]
    table = natively([f'{{"id": {t}}}'.encode() for t in integers])
    assert table is not None and table.column("id").to_pylist() == [int(t) for t in integers]


PIECES = [
    "1", "-0", "0", "1.5", "-1e5", "1E+2", "123456789012345678901234567890", "9223372036854775807", "2147483647",
    "-2147483649", '"x"', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\ud800"', '"é"', '"\\n\\t\\"\\\\\\/"', '"\\u0000"',
    "true", "false", "null", "[]", '["a",null]', "[1]", "{}", '{"a":1}', '{"d":2.5}', '[{"d":1},{"d":null},null]',
    '{"a":1,"a":2}', "1.7976931348623157e308", "2e308", "5e-324", "0.1", "NaN", "01", '{"b":["q"],"c":[{"d":3}]}',
    '{"c":[{"d":1,"e":[1,2,{"f":null}]}]}',
]  # fmt: skip
KEYS = ["id", "name", "score", "ok", "n", "s", "extra", "a", "é"]


def test_random_objects_are_never_read_otherwise_than_by_arrow():
    rng = random.Random(11)

    def one_object() -> bytes:
        members = [
            f"{json.dumps(rng.choice(KEYS), ensure_ascii=False)}{rng.choice([':', ' : '])}{rng.choice(PIECES)}"
            for _ in range(rng.randint(0, 3))
        ]
        return ("{" + rng.choice([",", ", "]).join(members) + "}").encode()

    answered = 0
    for _ in range(6000):
        values = [one_object() for _ in range(rng.randint(1, 3))]
        table = natively(values)
        if table is not None:
            answered += 1
            assert table.equals(by_arrow(pa.array(values, pa.binary()), NESTED)), values
    assert answered > 600  # it reads: most of these chunks hold a value that only Arrow, or nothing, reads


def test_timestamps_are_read_as_arrows_cast_reads_them():
    rng = random.Random(5)

    def two(low: int, high: int) -> str:
        return f"{rng.randint(low, high):02d}"

    texts = []
    for _ in range(5000):
        text = f"{rng.choice(['0001', '1969', '1970', '2000', '2024', '2026', '2100', '9999', '0000', '0400'])}"
        text += f"-{two(0, 13)}-{two(0, 32)}{rng.choice('T T')}{two(0, 24)}:{two(0, 60)}"
        if rng.random() < 0.8:
            text += f":{two(0, 60)}"
            if rng.random() < 0.6:
                text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 7)))
        text += rng.choice(["", "Z", "z", f"+{two(0, 24)}:{two(0, 60)}", f"-{two(0, 23)}:{two(0, 59)}", "+0100", " "])
        texts.append(text)
    target, schema = native_json.TIMESTAMP, pa.schema([("t", native_json.TIMESTAMP)])

    def refused(value, type_):
        raise ValueError("left to the reference")

    answered = 0
    for text in texts:
        table = natively([json.dumps({"t": text}).encode()], schema)
        by_cast = arrow_json._timestamps(pa.array([text]), target, refused)
        if table is not None:
            answered += 1
            assert by_cast is not None and table.column("t").equals(pa.chunked_array([by_cast])), text
    assert answered > 500
    aware_and_naive = [b'{"t": "2026-01-01T00:00:00Z"}', b'{"t": "2026-01-01T00:00:00"}']
    assert natively(aware_and_naive, schema) is None  # Arrow's path reads such a chunk record by record


def mutated(rng: random.Random, value: bytes) -> bytes:
    """`value` with a byte changed, dropped or added, or cut short."""
    at = rng.randrange(len(value))
    kind = rng.randrange(4)
    if kind == 0:
        return value[:at] + bytes([rng.randrange(256)]) + value[at + 1 :]
    if kind == 1:
        return value[:at] + value[at + 1 :]
    if kind == 2:
        return value[:at] + rng.choice([b"\\", b'"', b"{", b"[", b",", b":", b"\x00", b"\xc3", b"\xff"]) + value[at:]
    return value[:at]


def test_mutated_values_never_read_otherwise_than_by_arrow():
    rng = random.Random(17)
    good = [
        b'{"id": 1, "name": "a\\u00e9\\ud83d\\ude00", "score": 1.5, "ok": true, "n": -5,'
        b' "s": {"a": 3, "b": ["x", null], "c": [{"d": 2}]}, "undeclared": [1, {"q": null}]}',
        '{"name": "ünï \\"q\\"", "score": -0.0, "s": {"b": [], "c": []}, "x": 1e5}'.encode(),
    ]
    answered = 0
    for _ in range(5000):
        values = [mutated(rng, rng.choice(good)) for _ in range(rng.randint(1, 2))]
        table = natively(values)
        if table is not None:
            answered += 1
            assert table.equals(by_arrow(pa.array(values, pa.binary()), NESTED)), values
    assert answered > 100
