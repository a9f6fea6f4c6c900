"""`format.type: json`: values parsed against the declared schema (`format.schema`).

A chunk of values goes through Arrow's JSON reader (`arrow_json`) when all its records are good; otherwise
record by record through msgspec (`FastDecoder`), and what msgspec refuses through the reference parser
(`parse_record`), which accepts a little more (NaN in an undeclared field, UTF-16, epoch-millisecond
timestamps) and words the errors. The three must agree on every value: `tests/unit/test_formats.py`
checks them side by side. What is refused becomes quarantine rows in `records.convert`.
Runs in executors.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import operator
import sys
from typing import Annotated, Any, NamedTuple, Optional

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.config import UNKNOWN_FIELDS_COLUMN, PipelineConfig, SchemaField
from offsetlake.config.columns import decimal_type
from offsetlake.formats import arrow_json
from offsetlake.formats.arrays import one_array
from offsetlake.formats.halving import spans_together
from offsetlake.formats.values import INT32, INT64, check_unicode, coerce

ARROW_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "binary": pa.binary(),
}


def arrow_type(type_: str) -> pa.DataType:
    """The column type of a declared field type (config.SchemaField.type)."""
    declared = decimal_type(type_)
    return pa.decimal128(*declared) if declared is not None else ARROW_TYPES[type_]


def int64_scalar(value: int) -> pa.Scalar:
    """A number for a compute function, typed: given a bare Python int, pyarrow infers its type, which
    imports dateutil (13 ms in every Python worker's first task) and looks for pandas on every call."""
    return pa.scalar(value, pa.int64())


class BadRecord(ValueError):
    pass


# Records handed to Arrow's JSON reader at once; a chunk it refuses is halved while both halves keep
# ARROW_JSON_CHUNK_LEAST records, and the part left goes record by record.
ARROW_JSON_CHUNK = 65_536
ARROW_JSON_CHUNK_LEAST = 4096


class Parsed(NamedTuple):
    """The declared columns of the good values, and which values were good or refused, and why."""

    payload: pa.Table
    good: pa.Array | None  # positions of the good values (int64), None when every value is good
    bad: list[int]  # positions of the refused values, ascending
    errors: list[str]  # why, one per refused value


def parse_values(cfg: PipelineConfig, messages: pa.Table) -> Parsed:
    """The values of `messages` against the declared schema. Chunks whose records are all good go through
    Arrow's JSON reader (`arrow_json`), the rest record by record; `keep` (undeclared fields kept as text)
    goes record by record."""
    if cfg.format.unknown_fields == "keep":
        return _parse_one_by_one(cfg, messages.column("value"))
    fields = cfg.format.schema_
    schema = pa.schema([pa.field(f.name, arrow_type(f.type)) for f in fields])
    values = messages.column("value")
    payloads: list[pa.Table] = []
    kept: list[tuple[int, int, pa.Array | None]] = []
    bad: list[int] = []
    errors: list[str] = []

    def together(start: int, length: int) -> pa.Table | None:
        columns = arrow_json.read_columns(fields, one_array(values.slice(start, length)), schema, coerce)
        return None if columns is None else pa.Table.from_arrays(columns, schema=schema)

    for chunk_start in range(0, messages.num_rows, ARROW_JSON_CHUNK):
        length = min(ARROW_JSON_CHUNK, messages.num_rows - chunk_start)
        for start, n, payload in spans_together(chunk_start, length, together, ARROW_JSON_CHUNK_LEAST):
            if payload is not None:
                payloads.append(payload)
                kept.append((start, n, None))
                continue
            parsed = _parse_one_by_one(cfg, values.slice(start, n))
            payloads.append(parsed.payload)
            kept.append((start, n, parsed.good))
            bad.extend(start + i for i in parsed.bad)
            errors.extend(parsed.errors)
    good_rows = None  # every record good, the usual case: no positions built
    if any(good is not None for _, _, good in kept):
        good_rows = pa.concat_arrays(
            [
                pa.array(np.arange(start, start + n), pa.int64()) if good is None else pc.add(good, int64_scalar(start))
                for start, n, good in kept
            ]
        )
    return Parsed(pa.concat_tables(payloads or [schema.empty_table()]), good_rows, bad, errors)


def _parse_one_by_one(cfg: PipelineConfig, values: pa.ChunkedArray) -> Parsed:
    """`parse_values` one record at a time: msgspec's decoder, the reference parser for what it refuses."""
    fields = cfg.format.schema_
    keep_unknown = cfg.format.unknown_fields == "keep"
    # The fast decoder drops undeclared fields, so `keep` goes through the reference parser only.
    fast = None if keep_unknown else FastDecoder.for_fields(fields)
    records = fast.decode_all(values) if fast else [None] * len(values)
    unknown: list[str | None] = []
    bad_rows: list[int] = []
    errors: list[str] = []
    refused = [i for i, r in enumerate(records) if r is None]
    for i, raw in zip(refused, values.take(pa.array(refused, pa.int64())).to_pylist()):
        # What the fast decoder refused, the reference parser decides: it accepts some of it
        # (NaN in an undeclared field, UTF-16, epoch-millisecond timestamps) and words the errors.
        try:
            record, extra = parse_record(raw, fields)
            extra_json = _unknown_json(extra) if keep_unknown else None
        except BadRecord as err:
            bad_rows.append(i)
            errors.append(str(err))
            continue
        records[i] = fast.from_dict(record) if fast else record
        if keep_unknown:
            unknown.append(extra_json)
    good, good_rows = records, None
    if bad_rows:
        good_rows = pa.array([i for i, r in enumerate(records) if r is not None], pa.int64())
        good = [records[i] for i in good_rows.to_pylist()]
    get = fast.getter if fast else operator.itemgetter
    columns = [pa.array(list(map(get(f.name), good)), arrow_type(f.type)) for f in fields]
    schema = [pa.field(f.name, arrow_type(f.type)) for f in fields]
    if keep_unknown:
        columns.append(pa.array(unknown, pa.string()))
        schema.append(pa.field(UNKNOWN_FIELDS_COLUMN, pa.string()))
    return Parsed(pa.Table.from_arrays(columns, schema=pa.schema(schema)), good_rows, bad_rows, errors)


class FastDecoder:
    """msgspec decodes a record straight into the declared fields, ~5x faster than json.loads and
    coercing field by field. It must never accept what `parse_record` (the reference) refuses or
    read a value differently; `tests/unit/test_formats.py` checks the two side by side. So it is
    strict where the reference is (no string-to-number, bounded integers, finite numbers), it takes
    timestamps, dates and binary as raw JSON and coerces them with the reference's `values.coerce`, and a
    value that is not UTF-8 anywhere (msgspec only checks the strings it keeps) is refused.
    """

    def __init__(self, schema: tuple[tuple[str, str, bool], ...]):
        self._names = {name: f"f{i}" for i, (name, _, _) in enumerate(schema)}  # any JSON key, even `class`
        spec: list[Any] = []  # msgspec.defstruct's (name, type[, default]) entries
        self._coerced = []  # (attribute, type, required) decoded as raw JSON, coerced afterwards
        for name, type_, required in schema:
            attr = self._names[name]
            decoded = _STRICT_TYPES.get(type_, Any)
            if decoded is Any:
                self._coerced.append((attr, type_, required))
            if required:
                spec.append((attr, decoded))
            else:
                spec.append((attr, decoded if decoded is Any else Optional[decoded], None))  # noqa: UP045 - a runtime type
        self._struct = msgspec.defstruct("Record", spec, kw_only=True, rename={a: n for n, a in self._names.items()})
        self._decode = msgspec.json.Decoder(self._struct).decode

    @staticmethod
    def for_fields(fields: list[SchemaField]) -> FastDecoder:
        """One decoder per schema, built once per worker process (a struct type and its decoder)."""
        return _decoder_for(tuple((f.name, f.type, f.required) for f in fields))

    def decode_all(self, values: pa.ChunkedArray) -> list:
        """One decoded record per value, None where the reference parser has to decide."""
        decode = self._decode
        raws = values.to_pylist()
        out: list[Any]
        try:
            out = [decode(raw) for raw in raws]  # the usual case: every value decodes
        except (msgspec.DecodeError, TypeError):  # TypeError: a null value (tombstone)
            out = []
            for raw in raws:
                try:
                    out.append(decode(raw))
                except (msgspec.DecodeError, TypeError):
                    out.append(None)
        for i in _invalid_utf8(values):
            out[i] = None
        for attr, type_, required in self._coerced:
            _coerce_attribute(out, attr, type_, required)
        return out

    def from_dict(self, record: dict):
        return self._struct(**{self._names[name]: value for name, value in record.items()})

    def getter(self, name: str):
        return operator.attrgetter(self._names[name])


# ISO text, the usual form, parsed without _coerce's dispatch. A naive timestamp stays naive: Arrow stores
# it as UTC, which is what the reference's explicit UTC means.
_ISO_PARSERS = {"timestamp": dt.datetime.fromisoformat, "date": dt.date.fromisoformat}


def _coerce_attribute(records: list, attr: str, type_: str, required: bool) -> None:
    """Coerce one raw-JSON attribute of every decoded record in place; None out the records it refuses."""
    parse = _ISO_PARSERS.get(type_)
    for i, record in enumerate(records):
        if record is None:
            continue
        value = getattr(record, attr)
        if value is None:
            if required:
                records[i] = None
            continue
        try:
            setattr(
                record, attr, parse(value) if parse is not None and value.__class__ is str else coerce(value, type_)
            )
        except (TypeError, ValueError, OverflowError):
            records[i] = None


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
        check_unicode(text)
    except ValueError as err:
        raise BadRecord(f"undeclared fields: {err}") from err
    return text


def parse_record(raw: bytes | None, fields: list[SchemaField]) -> tuple[dict, dict]:
    """(declared fields coerced to their types, the fields the schema does not declare)."""
    if raw is None:
        raise BadRecord("value is null (tombstone)")
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as err:
        raise BadRecord("value is not UTF-8") from err
    except ValueError as err:
        raise BadRecord(f"value is not JSON: {err}") from err
    if not isinstance(record, dict):
        raise BadRecord(f"value is a JSON {type(record).__name__}, expected an object")
    out: dict[str, Any] = {}
    for f in fields:
        value = record.get(f.name)
        if value is None:
            if f.required:
                raise BadRecord(f"required field {f.name!r} is missing or null")
            out[f.name] = None
            continue
        try:
            out[f.name] = coerce(value, f.type)
        except (TypeError, ValueError, OverflowError) as err:
            raise BadRecord(f"field {f.name!r}: {err}") from err
    return out, {k: v for k, v in record.items() if k not in out}
