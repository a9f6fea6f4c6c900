"""Kafka Connect's JSON (`format.type: connect_json`): values written by Connect's JsonConverter with
`schemas.enable=true`, each `{"schema": <Connect schema>, "payload": <value>}`. The columns come from each
value's own schema, as a registry format's come from the registry: a value whose schema adds a field adds
a column (evolution.merge_type), so a Debezium connector's events land typed without a declared schema, and
a column added at the source lands in the MERGE of its first event.

A Connect schema is `{"type": int8|int16|int32|int64|float|double|boolean|string|bytes|array|map|struct,
"optional", "name", "parameters", "fields"|"items"|"keys"+"values"}`; its `name` may give the value a
logical type. Each maps to one Arrow type, and the payload's JSON value to a Python value of it:

| Connect (name)                                         | JSON payload            | Arrow                        |
|--------------------------------------------------------|-------------------------|------------------------------|
| Decimal (Connect's), `scale`, precision                | base64 two's complement | decimal128(p, s)             |
| Date (Connect's, Debezium's)                           | days since 1970-01-01   | date32                       |
| Timestamp (Connect's, Debezium's)                      | epoch milliseconds      | timestamp(us, UTC)           |
| Debezium's MicroTimestamp / NanoTimestamp              | epoch micro/nanoseconds | timestamp(us, UTC)           |
| Debezium's ZonedTimestamp                              | ISO 8601 text           | timestamp(us, UTC)           |
| Time (Connect's), Debezium's Time/MicroTime/NanoTime   | milli/micro/nanoseconds | int64 microseconds of the day|
| Debezium's VariableScaleDecimal (numeric, no scale)    | {scale, value}          | string (exact, plain digits) |
| Debezium's Interval (`interval.handling.mode=string`)  | ISO 8601 text           | string, seconds to the µs    |
| Debezium's Json / Uuid / Enum, ZonedTime, other string | text                    | string                       |
| bytes                                                  | base64                  | binary                       |
| array / map / struct                                   | list / object / object  | list / map / struct          |

Debezium writes an interval's seconds from a floating-point number (2.887567 s arrives as `2.887566999S`);
PostgreSQL's intervals hold microseconds, so they are rounded to the microsecond, which gives the value back
exactly. Delta has no time-of-day type, hence microseconds of the day; a timestamp without time zone (Timestamp,
MicroTimestamp) is its wall-clock reading taken as UTC, as offsetlake reads naive timestamps everywhere. The
payload of a Debezium event is its envelope (`before`, `after`, `source`, `op`...): `envelope: debezium`
unwraps it as for a registry format. The payloads of one schema are decoded together where
`connect_batches` can (the same values, or the batch goes value by value here).

Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import re
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.formats.connect_batches import INTEGER_BOUNDS, FastConnect, Node, envelopes_opening_with
from offsetlake.formats.schema_decoder import TIMESTAMP, SchemaDecoder
from offsetlake.formats.values import check_unicode, from_unscaled

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DAY = dt.date(1970, 1, 1)
MAX_DECIMAL_PRECISION = 38
CACHED_SCHEMAS = 256
CACHED_PREFIXES = 8


class UnusableConnectSchema(ValueError):
    """A Connect schema offsetlake cannot give a column type (the message names the field)."""


_PRIMITIVES = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float": pa.float32(),  # Connect's FLOAT32, as the JsonConverter names it
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}

_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_DATES = ("org.apache.kafka.connect.data.Date", "io.debezium.time.Date")
_TIMESTAMPS = {  # name: units per second of the epoch number
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1_000_000,
    "io.debezium.time.NanoTimestamp": 1_000_000_000,
}
_TIMES = {  # name: units per second of the time of day
    "org.apache.kafka.connect.data.Time": 1_000,
    "io.debezium.time.Time": 1_000,
    "io.debezium.time.MicroTime": 1_000_000,
    "io.debezium.time.NanoTime": 1_000_000_000,
}
_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_INTERVAL = "io.debezium.time.Interval"
# Debezium's Interval text: every part, each signed on its own; the seconds as Java prints a double.
_INTERVAL_TEXT = re.compile(r"P(-?\d+)Y(-?\d+)M(-?\d+)DT(-?\d+)H(-?\d+)M(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)S")
MICROSECOND = decimal.Decimal("0.000001")

Convert = Callable[[Any], Any]


def compile_schema(schema: Any, path: str = "value") -> tuple[pa.DataType, Convert]:
    """(the Arrow type, the conversion of a payload value to a Python value of it) of a Connect schema."""
    if not isinstance(schema, dict) or not isinstance(schema.get("type"), str):
        raise UnusableConnectSchema(f"{path}: not a Connect schema (an object with a 'type')")
    kind, name = schema["type"], schema.get("name")
    if name == _DECIMAL and kind == "bytes":
        return _decimal(schema, path)
    if name in _DATES and kind == "int32":
        return pa.date32(), _nullable(_days)
    if name in _TIMESTAMPS and kind == "int64":
        return TIMESTAMP, _nullable(functools.partial(_epoch, per_second=_TIMESTAMPS[name]))
    if name in _TIMES and kind in ("int32", "int64"):
        return pa.int64(), _nullable(functools.partial(_time_of_day, per_second=_TIMES[name]))
    if name == _ZONED_TIMESTAMP and kind == "string":
        return TIMESTAMP, _nullable(_zoned)
    if name == _VARIABLE_SCALE_DECIMAL and kind == "struct":
        return pa.string(), _nullable(_variable_scale_decimal)
    if name == _INTERVAL and kind == "string":
        return pa.string(), _nullable(_interval)
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind], _nullable(_primitive(kind))
    if kind == "array":
        item_type, item = compile_schema(schema.get("items"), f"{path}[]")
        return pa.list_(item_type), _nullable(lambda v: [item(x) for x in _of(v, list, "an array")])
    if kind == "map":
        key_type, key = compile_schema(schema.get("keys"), f"{path}{{key}}")
        value_type, value = compile_schema(schema.get("values"), f"{path}{{value}}")
        return pa.map_(key_type, value_type), _nullable(functools.partial(_map, key=key, value_of=value))
    if kind == "struct":
        return _struct(schema, path)
    raise UnusableConnectSchema(
        f"{path}: Connect type {kind!r} is not one of {', '.join([*_PRIMITIVES, 'array', 'map', 'struct'])}"
    )


def fast_plan(schema: dict, arrow_type: pa.DataType) -> Node | None:
    """How `connect_batches` reads `schema` (whose Arrow type is `arrow_type`) a batch at a time, or None:
    a type it leaves to the record path (bytes, map, Interval, VariableScaleDecimal)."""
    kind, name = schema.get("type"), schema.get("name")
    if name == _DECIMAL and kind == "bytes":
        return Node("decimal", pa.string(), arrow_type)
    if name in _DATES and kind == "int32":
        return Node("date", pa.int64(), arrow_type)
    if name in _TIMESTAMPS and kind == "int64":
        return Node("epoch", pa.int64(), arrow_type, per_second=_TIMESTAMPS[name])
    if name in _TIMES and kind in ("int32", "int64"):
        return Node("time", pa.int64(), arrow_type, per_second=_TIMES[name])
    if name == _ZONED_TIMESTAMP and kind == "string":
        return Node("zoned", pa.string(), arrow_type)
    if name in (_VARIABLE_SCALE_DECIMAL, _INTERVAL):
        return None
    if kind in INTEGER_BOUNDS:
        return Node(kind, pa.int64(), arrow_type)
    if kind in ("float", "double"):
        return Node(kind, pa.float64(), arrow_type)
    if kind in ("boolean", "string"):
        return Node(kind, arrow_type, arrow_type)
    if kind == "array":
        item = fast_plan(schema["items"], arrow_type.value_type)
        return None if item is None else Node("array", pa.list_(item.parsed_as), arrow_type, children=(("", item),))
    if kind == "struct":
        children = []
        for spec, field in zip(schema.get("fields") or [], arrow_type):
            child = fast_plan(spec, field.type)
            if child is None:
                return None
            children.append((field.name, child))
        parsed_as = pa.struct([pa.field(n, c.parsed_as) for n, c in children])
        return Node("struct", parsed_as, arrow_type, children=tuple(children))
    return None


def _struct(schema: dict, path: str) -> tuple[pa.DataType, Convert]:
    fields, converts, names = [], [], []
    for spec in schema.get("fields") or []:
        name = spec.get("field") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            raise UnusableConnectSchema(f"{path}: a struct field without a 'field' name")
        arrow_type, field_convert = compile_schema(spec, f"{path}.{name}")
        fields.append(pa.field(name, arrow_type))
        converts.append(field_convert)
        names.append(name)

    def record(value):
        given = _of(value, dict, "an object")
        return {name: each(given.get(name)) for name, each in zip(names, converts)}

    return pa.struct(fields), _nullable(record)


def _nullable(convert: Convert) -> Convert:
    return lambda value: None if value is None else convert(value)


def _of(value, kind: type, what: str):
    if not isinstance(value, kind):
        raise TypeError(f"expected {what}, got {type(value).__name__}")
    return value


def _primitive(kind: str) -> Convert:
    if kind in INTEGER_BOUNDS:
        bound = INTEGER_BOUNDS[kind]

        def integer(value):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"expected an integer ({kind}), got {type(value).__name__}")
            if not -bound <= value < bound:
                raise OverflowError(f"integer {value} out of range for {kind}")
            return value

        return integer
    if kind in ("float", "double"):
        return lambda v: float(v) if not isinstance(v, bool) and isinstance(v, (int, float)) else _wrong(v, "a number")
    if kind == "boolean":
        return lambda v: v if isinstance(v, bool) else _wrong(v, "true or false")
    if kind == "string":

        def text(value):
            check_unicode(_of(value, str, "a string"))
            return value

        return text
    return lambda v: base64.b64decode(_of(v, str, "base64 text"), validate=True)


def _wrong(value, what: str):
    raise TypeError(f"expected {what}, got {type(value).__name__}")


def _decimal(schema: dict, path: str) -> tuple[pa.DataType, Convert]:
    parameters = schema.get("parameters") or {}
    try:
        scale = int(parameters["scale"])
        precision = int(parameters.get("connect.decimal.precision", MAX_DECIMAL_PRECISION))
    except (KeyError, TypeError, ValueError) as err:
        raise UnusableConnectSchema(f"{path}: a Decimal without an integer 'scale' parameter") from err
    if not 0 < precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise UnusableConnectSchema(
            f"{path}: Decimal({precision}, {scale}) does not fit Delta's decimal (precision at most 38): set the "
            f"connector's decimal.handling.mode to string"
        )

    def convert(value):
        return from_unscaled(_unscaled(value), scale)

    return pa.decimal128(precision, scale), _nullable(convert)


def _unscaled(value) -> int:
    """A Connect Decimal's unscaled value: big-endian two's complement, in base64."""
    return int.from_bytes(base64.b64decode(_of(value, str, "base64 text"), validate=True), "big", signed=True)


def _map(value, key: Convert, value_of: Convert) -> list[tuple]:
    """A Connect map: a JSON object when its keys are strings, else an array of [key, value] pairs."""
    if isinstance(value, dict):
        return [(key(k), value_of(v)) for k, v in value.items()]
    return [(key(k), value_of(v)) for k, v in _of(value, list, "an object or an array of pairs")]


def _days(value) -> dt.date:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected days since 1970-01-01, got {type(value).__name__}")
    try:
        return EPOCH_DAY + dt.timedelta(days=value)
    except OverflowError as err:
        raise OverflowError(f"{value} days from 1970-01-01 is out of range for a date") from err


def _epoch(value, per_second: int) -> dt.datetime:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an epoch number, got {type(value).__name__}")
    try:
        return EPOCH + dt.timedelta(microseconds=value * 1_000_000 // per_second)
    except OverflowError as err:
        raise OverflowError(f"epoch {value} (1/{per_second} s) is out of range for a timestamp") from err


def _time_of_day(value, per_second: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a time of day, got {type(value).__name__}")
    return value * 1_000_000 // per_second


def _zoned(value) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(_of(value, str, "ISO 8601 text"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _interval(value) -> str:
    """Debezium's interval text with its seconds rounded to the microsecond (see the module's docstring)."""
    text = _of(value, str, "interval text")
    match = _INTERVAL_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(f"expected Debezium's interval text P<y>Y<m>M<d>DT<h>H<m>M<s>S, got {text[:60]!r}")
    *parts, seconds = match.groups()
    rounded = decimal.Decimal(seconds).quantize(MICROSECOND, rounding=decimal.ROUND_HALF_EVEN)
    shown = format(rounded.normalize(), "f") if rounded else "0"
    return "P{}Y{}M{}DT{}H{}M{}S".format(*parts, shown)


def _variable_scale_decimal(value) -> str:
    record = _of(value, dict, "an object {scale, value}")
    unscaled = int.from_bytes(
        base64.b64decode(_of(record.get("value"), str, "base64 text"), validate=True), "big", signed=True
    )
    scale = record.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, int):
        raise TypeError("expected an integer scale")
    return format(from_unscaled(unscaled, scale), "f")  # plain digits, never an exponent


def _as_record(convert: Convert, value: Any) -> dict:
    return {"value": convert(value)}


class ConnectDecoder(SchemaDecoder):
    """The payloads of one Connect schema, each the JSON text of a value's `payload`."""

    kind_name = "Kafka Connect JSON value"

    def __init__(self, schema: dict, record: bool = True):
        arrow_type, convert = compile_schema(schema)
        plan = fast_plan(schema, arrow_type) if record and pa.types.is_struct(arrow_type) else None
        if record and not pa.types.is_struct(arrow_type):  # as registry formats: a scalar is one column `value`
            arrow_type, convert = pa.struct([pa.field("value", arrow_type)]), functools.partial(_as_record, convert)
        self.arrow_type, self._convert = arrow_type, convert
        self.batches = FastConnect(plan, _zoned) if plan is not None else None
        self.label = f"Connect schema {schema.get('name') or schema.get('type')!r}"

    def decode(self, payload: bytes) -> Any:
        return self._convert(msgspec.json.decode(payload))


class ConnectDecoders:
    """What records.py asks of a registry format's decoders, for values that carry their schema: each
    value read once (`split`), its schema's decoder built once per process and schema text."""

    def __init__(self, key: bool = False):
        self.key = key
        self._cache: dict[bytes, ConnectDecoder | UnusableConnectSchema] = {}
        self._prefixes: dict[bytes, ConnectDecoder] = {}  # openings `split` has met (see bulk_groups)

    @staticmethod
    @functools.lru_cache(maxsize=2)
    def shared(key: bool = False) -> ConnectDecoders:
        return ConnectDecoders(key)

    def bulk_groups(self, values: pa.Array) -> tuple[list[tuple[ConnectDecoder, np.ndarray, pa.Array]], np.ndarray]:
        """Values written as an earlier one was, `{"schema":<S>,"payload":<one JSON value>}` (see `split`), read
        for all values at once: [(S's decoder, positions, payload texts)], and the positions of the others,
        which `split` reads one by one. A value no known opening matches is read first, to learn its own."""
        closes = pc.ends_with(values, "}")
        left = closes.fill_null(False).to_numpy(zero_copy_only=False).copy()  # not null, not grouped yet
        groups: list[tuple[ConnectDecoder, np.ndarray, pa.Array]] = []
        matched: set[bytes] = set()
        learned = 0
        while True:
            for prefix, decoder in list(self._prefixes.items()):
                if prefix not in matched:
                    matched.add(prefix)
                    positions, payloads = envelopes_opening_with(values, prefix, left)
                    if len(positions):
                        groups.append((decoder, positions, payloads))
            if not left.any() or learned == CACHED_PREFIXES:
                break
            first = int(np.argmax(left))
            learned += 1
            try:
                self.split(values[first].as_py())  # learns its opening (see _remember_prefix)
            except ValueError:
                pass  # its error is worded when it is read with the others
            if not self._prefixes.keys() - matched:  # it taught no new opening: read with the others
                left[first] = False
        grouped = np.zeros(len(values), dtype=bool)
        for _, held, _ in groups:
            grouped[held] = True
        return groups, np.nonzero(~grouped)[0]

    def split(self, data: bytes | None) -> tuple[ConnectDecoder, bytes]:
        """(the decoder of the value's schema, its payload's JSON text); ValueError naming what is wrong
        with the value."""
        if data is None:
            raise ValueError("value is null (tombstone)")
        try:
            envelope = msgspec.json.decode(data, type=_Wrapped)
        except msgspec.ValidationError as err:
            raise ValueError(
                "value is not Kafka Connect JSON with its schema (an object of 'schema' and 'payload': "
                "the JsonConverter's schemas.enable=true)"
            ) from err
        except msgspec.DecodeError as err:
            raise ValueError(f"value is not valid JSON ({err})") from err
        decoder = self._decoder(envelope.schema)
        self._remember_prefix(data, bytes(envelope.schema), decoder)
        return decoder, bytes(envelope.payload)

    def _remember_prefix(self, data: bytes, schema: bytes, decoder: ConnectDecoder) -> None:
        """The value's opening `{"schema":<schema>,"payload":`, when it is written so (the JsonConverter's
        compact form): whatever one JSON value follows it up to a closing brace, the value is an envelope of
        this schema."""
        prefix = b'{"schema":' + schema + b',"payload":'
        if data.startswith(prefix) and prefix not in self._prefixes:
            if len(self._prefixes) >= CACHED_PREFIXES:
                self._prefixes.clear()
            self._prefixes[prefix] = decoder

    def _decoder(self, schema_text: msgspec.Raw) -> ConnectDecoder:
        text = bytes(schema_text)
        found = self._cache.get(text)
        if found is None:
            try:
                found = ConnectDecoder(msgspec.json.decode(text), record=not self.key)
            except UnusableConnectSchema as err:
                found = err
            if len(self._cache) >= CACHED_SCHEMAS:
                self._cache.clear()
            self._cache[text] = found
        if isinstance(found, UnusableConnectSchema):
            raise found
        return found


class _Wrapped(msgspec.Struct, forbid_unknown_fields=True):
    schema: msgspec.Raw
    payload: msgspec.Raw
