"""Record formats: turn Kafka messages (Arrow) into table rows, and bad records into quarantine rows.

`raw` keeps key and value as bytes. `json` parses the value by the declared
schema; a record that does not parse or does not fit the schema becomes a
quarantine row (raw bytes, offsets, error) instead of stopping the batch.
Runs in executors: no deltalake import here.
"""
from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import math
import operator
import sys
from typing import Annotated, Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.config import LINEAGE_COLUMNS, UNKNOWN_FIELDS_COLUMN, PipelineConfig, SchemaField

ARROW_TYPES = {
    "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
    "float": pa.float32(), "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(), "binary": pa.binary(),
}
LINEAGE_SCHEMA = pa.schema([
    ("kafka_topic", pa.string()),
    ("kafka_partition", pa.int32()),
    ("kafka_offset", pa.int64()),
    ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
])
QUARANTINE_SCHEMA = pa.schema([
    *LINEAGE_SCHEMA,
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("error", pa.string()),
])
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def table_schema(cfg: PipelineConfig) -> pa.Schema:
    if cfg.format.type == "raw":
        payload = [pa.field("key", pa.binary()), pa.field("value", pa.binary())]
    else:
        payload = [pa.field(f.name, ARROW_TYPES[f.type]) for f in cfg.format.schema_]
    if cfg.format.unknown_fields == "keep":
        payload.append(pa.field(UNKNOWN_FIELDS_COLUMN, pa.string()))
    return pa.schema([*payload, *LINEAGE_SCHEMA])


def _lineage(messages: pa.Table) -> list[pa.ChunkedArray]:
    return [messages.column(name).cast(LINEAGE_SCHEMA.field(name).type) for name in LINEAGE_COLUMNS]


def convert(cfg: PipelineConfig, messages: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Return (rows for the table, rows for the quarantine)."""
    messages, oversized = _split_oversized(messages, cfg.format.max_value_bytes)
    if cfg.format.type == "raw":
        columns = [messages.column("key"), messages.column("value"), *_lineage(messages)]
        table, quarantine = pa.Table.from_arrays(columns, schema=table_schema(cfg)), QUARANTINE_SCHEMA.empty_table()
    else:
        table, quarantine = _convert_json(cfg, messages)
    if oversized is not None:
        quarantine = pa.concat_tables([quarantine, oversized]).sort_by([("kafka_partition", "ascending"),
                                                                        ("kafka_offset", "ascending")])
    return table, quarantine


def _split_oversized(messages: pa.Table, limit: int) -> tuple[pa.Table, pa.Table | None]:
    """Values above `limit` bytes are quarantined whole: a table row that size hurts every reader."""
    sizes = pc.binary_length(messages.column("value")).fill_null(0)
    too_big = pc.greater(sizes, limit)
    if not pc.any(too_big).as_py():
        return messages, None
    errors = [f"value is {n} bytes, above format.max_value_bytes ({limit})" for n in sizes.filter(too_big).to_pylist()]
    return messages.filter(pc.invert(too_big)), _quarantine_rows(messages.filter(too_big), errors)


def _quarantine_rows(bad: pa.Table, errors: list[str]) -> pa.Table:
    """Quarantine rows: the records' lineage, raw key and value bytes, and why."""
    return pa.Table.from_arrays(
        [*_lineage(bad), bad.column("key"), bad.column("value"), pa.array(errors, pa.string())],
        schema=QUARANTINE_SCHEMA)


class BadRecord(ValueError):
    pass


def _convert_json(cfg: PipelineConfig, messages: pa.Table) -> tuple[pa.Table, pa.Table]:
    fields = cfg.format.schema_
    keep_unknown = cfg.format.unknown_fields == "keep"
    # The fast decoder drops undeclared fields, so `keep` goes through the reference parser only.
    fast = None if keep_unknown else FastDecoder.for_fields(fields)
    values = messages.column("value")
    records = fast.decode_all(values) if fast else [None] * len(values)
    unknown: list[str | None] = []
    bad_rows: list[int] = []
    errors: list[str] = []
    refused = [i for i, r in enumerate(records) if r is None]
    for i, raw in zip(refused, values.take(pa.array(refused, pa.int64())).to_pylist()):
        # What the fast decoder refused, the reference parser decides: it accepts some of it
        # (NaN in an undeclared field, UTF-16, epoch-millisecond timestamps) and words the errors.
        try:
            record, extra = _parse_record(raw, fields)
            extra_json = _unknown_json(extra) if keep_unknown else None
        except BadRecord as err:
            bad_rows.append(i)
            errors.append(str(err))
            continue
        records[i] = fast.from_dict(record) if fast else record
        if keep_unknown:
            unknown.append(extra_json)
    good, good_messages = records, messages
    if bad_rows:
        good_rows = [i for i, r in enumerate(records) if r is not None]
        good, good_messages = [records[i] for i in good_rows], messages.take(pa.array(good_rows, pa.int64()))
    get = fast.getter if fast else operator.itemgetter
    columns = [pa.array(list(map(get(f.name), good)), ARROW_TYPES[f.type]) for f in fields]
    if keep_unknown:
        columns.append(pa.array(unknown, pa.string()))
    table = pa.Table.from_arrays([*columns, *_lineage(good_messages)], schema=table_schema(cfg))
    return table, _quarantine_rows(messages.take(pa.array(bad_rows, pa.int64())), errors)


class FastDecoder:
    """msgspec decodes a record straight into the declared fields, ~5x faster than json.loads and
    coercing field by field. It must never accept what `_parse_record` (the reference) refuses or
    read a value differently; `tests/unit/test_formats.py` checks the two side by side. So it is
    strict where the reference is (no string-to-number, bounded integers, finite numbers), it takes
    timestamps, dates and binary as raw JSON and coerces them with the reference's `_coerce`, and a
    value that is not UTF-8 anywhere (msgspec only checks the strings it keeps) is refused.
    """

    def __init__(self, schema: tuple[tuple[str, str, bool], ...]):
        self._names = {name: f"f{i}" for i, (name, _, _) in enumerate(schema)}  # any JSON key, even `class`
        spec = []
        self._coerced = []  # (attribute, type, required) decoded as raw JSON, coerced afterwards
        for name, type_, required in schema:
            attr = self._names[name]
            decoded = _STRICT_TYPES.get(type_, Any)
            if decoded is Any:
                self._coerced.append((attr, type_, required))
            if required:
                spec.append((attr, decoded))
            else:
                spec.append((attr, decoded if decoded is Any else decoded | None, None))
        self._struct = msgspec.defstruct("Record", spec, kw_only=True, rename={a: n for n, a in self._names.items()})
        self._decode = msgspec.json.Decoder(self._struct).decode

    @staticmethod
    def for_fields(fields: list[SchemaField]) -> "FastDecoder":
        """One decoder per schema, built once per worker process (a struct type and its decoder)."""
        return _decoder_for(tuple((f.name, f.type, f.required) for f in fields))

    def decode_all(self, values: pa.ChunkedArray) -> list:
        """One decoded record per value, None where the reference parser has to decide."""
        decode = self._decode
        out = []
        for raw in values.to_pylist():
            try:
                out.append(decode(raw))
            except (msgspec.DecodeError, TypeError):  # TypeError: a null value (tombstone)
                out.append(None)
        for i in _invalid_utf8(values):
            out[i] = None
        for attr, type_, required in self._coerced:
            for i, record in enumerate(out):
                if record is None:
                    continue
                value = getattr(record, attr)
                if value is None:
                    if required:
                        out[i] = None
                    continue
                try:
                    setattr(record, attr, _coerce(value, type_))
                except (TypeError, ValueError, OverflowError):
                    out[i] = None
        return out

    def from_dict(self, record: dict):
        return self._struct(**{self._names[name]: value for name, value in record.items()})

    def getter(self, name: str):
        return operator.attrgetter(self._names[name])


@functools.lru_cache(maxsize=16)
def _decoder_for(schema: tuple[tuple[str, str, bool], ...]) -> FastDecoder:
    return FastDecoder(schema)


_MAX_DOUBLE = sys.float_info.max
_STRICT_TYPES = {
    "string": str,
    "long": Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])],
    "int": Annotated[int, msgspec.Meta(ge=INT32[0], le=INT32[1])],
    "double": Annotated[float, msgspec.Meta(ge=-_MAX_DOUBLE, le=_MAX_DOUBLE)],  # no inf, as the reference
    "float": Annotated[float, msgspec.Meta(ge=-_MAX_DOUBLE, le=_MAX_DOUBLE)],
    "boolean": bool,
}


def _invalid_utf8(values: pa.ChunkedArray) -> list[int]:
    """Positions of values that are not UTF-8 (one vectorised check when all are, the usual case)."""
    try:
        values.cast(pa.string())
        return []
    except pa.ArrowInvalid:
        pass
    bad = []
    for i, raw in enumerate(values.to_pylist()):
        try:
            if raw is not None:
                raw.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return bad


def _unknown_json(extra: dict) -> str | None:
    if not extra:
        return None
    try:
        # allow_nan=False: NaN or Infinity would make text no JSON reader (Spark, DuckDB) accepts.
        text = json.dumps(extra, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        _check_unicode(text)
    except ValueError as err:
        raise BadRecord(f"undeclared fields: {err}") from None
    return text


def _check_unicode(text: str) -> None:
    """A JSON escape like \\ud800 (a lone surrogate) makes a str that is not Unicode: Arrow cannot store it."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text holds a lone surrogate escape, which is not valid Unicode") from None


def _parse_record(raw: bytes | None, fields: list[SchemaField]) -> tuple[dict, dict]:
    """(declared fields coerced to their types, the fields the schema does not declare)."""
    if raw is None:
        raise BadRecord("value is null (tombstone)")
    try:
        record = json.loads(raw)
    except UnicodeDecodeError:
        raise BadRecord("value is not UTF-8") from None
    except ValueError as err:
        raise BadRecord(f"value is not JSON: {err}") from None
    if not isinstance(record, dict):
        raise BadRecord(f"value is a JSON {type(record).__name__}, expected an object")
    out = {}
    for f in fields:
        value = record.get(f.name)
        if value is None:
            if f.required:
                raise BadRecord(f"required field {f.name!r} is missing or null")
            out[f.name] = None
            continue
        try:
            out[f.name] = _coerce(value, f.type)
        except (TypeError, ValueError, OverflowError) as err:
            raise BadRecord(f"field {f.name!r}: {err}") from None
    return out, {k: v for k, v in record.items() if k not in out}


def _coerce(value, type_: str):
    """Strict: no silent string-to-number or number-to-string conversion."""
    if type_ == "string":
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        _check_unicode(value)
        return value
    if type_ in ("long", "int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        low, high = INT32 if type_ == "int" else INT64
        if not low <= value <= high:
            raise OverflowError(f"integer {value} out of range for {type_}")
        return value
    if type_ in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        if not math.isfinite(float(value)):
            raise ValueError("number is not finite")
        return float(value)
    if type_ == "boolean":
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {type(value).__name__}")
        return value
    if type_ == "timestamp":
        return _timestamp(value)
    if type_ == "date":
        if not isinstance(value, str):
            raise TypeError(f"expected a date string YYYY-MM-DD, got {type(value).__name__}")
        return dt.date.fromisoformat(value)
    if type_ == "binary":
        if not isinstance(value, str):
            raise TypeError(f"expected base64 text, got {type(value).__name__}")
        return base64.b64decode(value, validate=True)
    raise TypeError(f"unsupported type {type_}")


def _timestamp(value) -> dt.datetime:
    """ISO 8601 text (naive means UTC) or epoch milliseconds."""
    if isinstance(value, bool):
        raise TypeError("expected a timestamp, got bool")
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value / 1000.0, tz=dt.timezone.utc)
    if not isinstance(value, str):
        raise TypeError(f"expected a timestamp, got {type(value).__name__}")
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)
