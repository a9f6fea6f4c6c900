"""Kafka Connect JSON payloads of one schema decoded a batch at a time, by a JSON reader in C.

The record path (`connect_json.ConnectDecoder.decode`) makes a Python object of every field of every event and
converts it; a Debezium envelope has some thirty fields, so that is most of a CDC task's time. Here the
payloads of one schema are read at once with an Arrow type per field (`arrow_json.read_objects`: offsetlake's
parser in C, or Arrow's JSON reader), then the logical types are finished column by column. The batch is
handed back (None) to the record path whenever it might decide a value differently, so this path never
quarantines and never reads a value differently; `tests/unit/test_connect_batches.py` checks it against the
record path value for value. It answers only when:

- the schema is a struct of structs, arrays, integers, float, double, boolean, string, Decimal, Date,
  Timestamp (Connect's, Debezium's micro and nano), Time (Connect's, Debezium's) and ZonedTimestamp; any
  other type (bytes, map, Interval, VariableScaleDecimal) leaves the schema to the record path;
- every payload is a JSON object (`{`...`}`): each then is exactly one row of the document;
- Arrow parses the document with those types: it is as strict as the record path about JSON types (no
  number for a string, no float for an integer, no boolean for a number) and refuses a key given twice;
- every integer is in its type's range, every date and timestamp within years 1 to 9999, every decimal
  within its precision, and every ZonedTimestamp is strict RFC 3339 text (others go through the record
  path's own conversion, column by column).

Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.formats import arrow_json, native_json
from offsetlake.formats.arrays import one_array

# Microseconds since the epoch of 0001-01-01 and of 9999-12-31 23:59:59.999999, what Python's datetime holds.
FIRST_MICROS = -62_135_596_800_000_000
LAST_MICROS = 253_402_300_799_999_999
FIRST_DAY, LAST_DAY = -719_162, 2_932_896  # 0001-01-01 and 9999-12-31 in days since 1970-01-01


class _Refused(Exception):
    """A value the record path might decide differently: the batch goes record by record."""


@dataclass(frozen=True)
class Node:
    """One Connect schema node as this path reads it: `kind` (a Connect primitive, struct, array, decimal,
    date, epoch, time, zoned), what Arrow parses it as, its final Arrow type, and its children."""

    kind: str
    parsed_as: pa.DataType
    arrow_type: pa.DataType
    per_second: int = 0  # epoch and time: units a second
    children: tuple[tuple[str, Node], ...] = ()


INTEGER_BOUNDS = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**63}


class FastConnect:
    """The payloads of one Connect schema, a batch at a time."""

    MIN_RECORDS = 64  # below this the record path is as quick

    def __init__(self, root: Node, zoned: Callable[[object], dt.datetime]):
        """`root`: the schema's plan (a struct node: connect_json.fast_plan); `zoned`: the record path's
        reading of a ZonedTimestamp, for the texts that are not strict RFC 3339."""
        assert root.kind == "struct"
        self.root, self._zoned = root, zoned
        self._parsed_as = pa.schema(list(root.parsed_as))
        self._natively_as = pa.schema(list(_natively_as(root)))

    def decode(self, payloads: list[bytes] | pa.Array) -> pa.Array | None:
        """Every payload (the JSON text of a Connect payload) as one StructArray, or None: one by one."""
        if isinstance(payloads, list):
            payloads = pa.array(payloads, pa.binary())
        if payloads.null_count or not arrow_json.objects(payloads):
            return None  # a null or non-object payload
        table = arrow_json.read_objects(payloads, self._parsed_as, self._natively_as)
        if table is None:
            return None
        parsed = pa.StructArray.from_arrays(
            [one_array(table.column(i)) for i in range(table.num_columns)], fields=list(table.schema)
        )
        try:
            return self._finish(self.root, parsed)
        except _Refused:
            return None

    def _finish(self, node: Node, column: pa.Array) -> pa.Array:
        """`column` as parsed to `node.arrow_type`; _Refused where the record path decides."""
        if node.kind == "struct":
            assert isinstance(column, pa.StructArray)
            fields = [column.field(i) for i in range(column.type.num_fields)]
            children = [self._finish(child, f) for (_, child), f in zip(node.children, fields)]
            mask = column.is_null() if column.null_count else None
            return pa.StructArray.from_arrays(children, fields=list(node.arrow_type), mask=mask)
        if node.kind == "array":
            assert isinstance(column, pa.ListArray)
            items = self._finish(node.children[0][1], column.values)
            mask = column.is_null() if column.null_count else None
            return pa.ListArray.from_arrays(column.offsets, items, type=node.arrow_type, mask=mask)
        if node.kind in INTEGER_BOUNDS:
            bound = INTEGER_BOUNDS[node.kind]
            return _within(column, -bound, bound - 1).cast(node.arrow_type)
        if node.kind in ("float", "double", "boolean", "string"):
            return column.cast(node.arrow_type)
        if node.kind == "date":
            return _within(column, FIRST_DAY, LAST_DAY).cast(pa.int32()).cast(node.arrow_type)
        if node.kind == "epoch":
            micros = _micros(column, node.per_second)
            return _within(micros, FIRST_MICROS, LAST_MICROS).cast(node.arrow_type)
        if node.kind == "time":
            return _micros(column, node.per_second)
        if node.kind == "zoned":
            zoned = arrow_json._timestamps(column, node.arrow_type, lambda value, _: self._zoned(value))
            if zoned is None:
                raise _Refused
            return zoned
        return _decimals(column, node.arrow_type)


def _natively_as(node: Node) -> pa.DataType:
    """`node.parsed_as`, but a ZonedTimestamp's text read by the native parser as a timestamp (as Arrow's cast
    reads it: `_finish` then casts it as it casts a text that Arrow's reader left a string)."""
    if node.kind == "zoned":
        return native_json.TIMESTAMP
    if node.kind == "struct":
        fields = [f.with_type(_natively_as(child)) for f, (_, child) in zip(node.parsed_as, node.children)]
        return pa.struct(fields)
    if node.kind == "array":
        item = node.parsed_as.value_field
        return pa.list_(item.with_type(_natively_as(node.children[0][1])))
    return node.parsed_as


def _within(column: pa.Array, first: int, last: int) -> pa.Array:
    if len(column) - column.null_count:
        low, high = pc.min_max(column).values()
        if low.as_py() < first or high.as_py() > last:
            raise _Refused
    return column


def _micros(column: pa.Array, per_second: int) -> pa.Array:
    """Units of 1/per_second to microseconds, rounded down as the record path's `//` does."""
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if per_second < 1_000_000:
        factor = 1_000_000 // per_second
        if len(values) and np.abs(values).max() > (2**63 - 1) // factor:
            raise _Refused  # the record path's Python integers would not overflow here
        micros = values * factor
    else:
        micros = np.floor_divide(values, per_second // 1_000_000)
    mask = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    return pa.array(micros, pa.int64(), mask=mask)


def _decimals(column: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Connect Decimals (base64 big-endian two's complement of the unscaled value) as `arrow_type`, decoded
    in bulk: the texts of one length at a time. _Refused for whatever the record path might read otherwise
    (not strict base64, empty, more than 16 bytes, past the precision): it decides and words it."""
    is_valid = column.is_valid()
    valid = is_valid.to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
    unscaled = np.zeros((len(column), 16), np.uint8)  # little-endian, as Arrow's decimal128
    for length in np.unique(lengths[valid]).tolist():
        rows = np.nonzero(valid & (lengths == length))[0]
        unscaled[rows] = _unscaled(column.take(pa.array(rows, pa.int64())), length)
    _check_precision(unscaled, arrow_type.precision)
    validity = is_valid.buffers()[1] if column.null_count else None  # a bitmap from offset 0
    return pa.Array.from_buffers(arrow_type, len(column), [validity, pa.py_buffer(unscaled)])


_BASE64 = np.full(256, 255, np.uint8)  # each base64 character's six bits; 255: not one
_BASE64[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)] = np.arange(64)
_PAD = ord("=")


def _unscaled(texts: pa.Array, length: int) -> np.ndarray:
    """Base64 `texts` of `length` characters each as 16-byte little-endian two's complement integers, read
    as `binascii.a2b_base64(strict_mode=True)` and `int.from_bytes(signed=True)` read them, or _Refused."""
    if length == 0 or length % 4:
        raise _Refused
    start = int(np.frombuffer(texts.buffers()[1], np.int32, count=1, offset=4 * texts.offset)[0])
    chars = np.frombuffer(texts.buffers()[2], np.uint8, count=len(texts) * length, offset=start).reshape(-1, length)
    pad = np.where(chars[:, -1] == _PAD, np.where(chars[:, -2] == _PAD, 2, 1), 0)
    padded = np.arange(length) >= length - pad[:, None]
    sixes = _BASE64[chars]
    if np.any((sixes == 255) & ~padded):  # any other character, or `=` anywhere else
        raise _Refused
    sixes[padded] = 0
    quads = sixes.reshape(len(texts), -1, 4).astype(np.uint32)
    triples = (quads[..., 0] << 18) | (quads[..., 1] << 12) | (quads[..., 2] << 6) | quads[..., 3]
    big_endian = np.stack([triples >> 16, triples >> 8, triples], axis=-1).astype(np.uint8).reshape(len(texts), -1)
    out = np.zeros((len(texts), 16), np.uint8)
    for p in np.unique(pad).tolist():
        rows = np.nonzero(pad == p)[0]
        size = big_endian.shape[1] - p
        if size > 16:
            raise _Refused
        value = big_endian[rows, :size]
        widened = np.where((value[:, :1] >= 0x80), np.uint8(0xFF), np.uint8(0))  # the sign, extended
        out[rows] = np.concatenate([np.repeat(widened, 16 - size, axis=1), value], axis=1)[:, ::-1]
    return out


def _check_precision(unscaled: np.ndarray, precision: int) -> None:
    """_Refused unless every value is within `precision` digits (`-10**precision < value < 10**precision`)."""
    words = unscaled.view(np.uint64)  # (low, high) of each value
    low, high = words[:, 0].view(np.int64), words[:, 1].view(np.int64)
    fits = high == (low >> 63)  # the value is an int64
    limit = 10**precision
    if precision <= 18:  # the limit is an int64 too
        if not np.all(fits & (low > -limit) & (low < limit)):
            raise _Refused
        return
    for row in np.nonzero(~fits)[0].tolist():  # an int64 is within 19 or more digits
        if not -limit < int.from_bytes(unscaled[row].tobytes(), "little", signed=True) < limit:
            raise _Refused


def envelopes_opening_with(values: pa.Array, prefix: bytes, left: np.ndarray) -> tuple[np.ndarray, pa.Array]:
    """(positions, payload texts) of the Connect JSON values in `left` that are `prefix` (a value's opening
    `{"schema":<S>,"payload":`) + one JSON value + `}`; they leave `left`."""
    # Compared and cut where the values lie: an opening is most of a value (its schema), not to be copied.
    opens = pc.starts_with(values, prefix.decode())  # a schema msgspec has read is UTF-8
    candidates = np.nonzero(opens.fill_null(False).to_numpy(zero_copy_only=False) & left)[0]
    texts = pc.binary_slice(values, len(prefix), -1).take(pa.array(candidates, pa.int64()))
    one_each = _one_json_value_each(texts)
    positions = candidates[one_each]
    left[positions] = False
    return positions, texts if one_each.all() else texts.filter(pa.array(one_each))


def _one_json_value_each(texts: pa.Array) -> np.ndarray:
    """Per text: whether it is exactly one JSON value, as msgspec reads one (strict JSON, UTF-8). All texts
    are read as one JSON array; only if that does not split them where they meet is each read alone."""
    if len(texts) == 0:
        return np.zeros(0, bool)
    lengths = pc.binary_length(texts).to_numpy(zero_copy_only=False)
    joined = arrow_json.lines(texts, separator=b",")
    try:
        items = msgspec.json.decode(b"".join([b"[", memoryview(joined)[:-1], b"]"]), type=list[msgspec.Raw])
        if len(items) == len(texts) and np.array_equal(np.fromiter(map(len, items), np.int64, len(items)), lengths):
            return np.ones(len(texts), bool)  # each item is its text, whole: they tile the array
    except msgspec.DecodeError:
        pass
    each = np.zeros(len(texts), bool)
    for i, text in enumerate(texts.to_pylist()):
        try:
            msgspec.json.decode(text, type=msgspec.Raw)
        except msgspec.DecodeError:
            continue
        each[i] = True
    return each
