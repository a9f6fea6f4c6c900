"""JSON records to columns in one call to a reader in C, for chunks where every record is good.

The record-by-record path (`declared_json.FastDecoder`, then the reference parser
`declared_json.parse_record`) makes Python objects for every field of every record; for ordinary topics that
is most of a JSON task's time. Here a chunk's values are read at once with the declared schema, by
offsetlake's own parser in C (`native_json`) where it is sure to read them as Arrow's JSON reader would, else
by Arrow's reader (C++) as one newline-delimited document; the chunk is handed back (None) to the record-by-
record path whenever Arrow might decide a record differently from the reference parser. So this path never
quarantines and never reads a value differently; `tests/unit/test_formats.py` checks it against the reference
record by record. It answers only when all of these hold:

- every value is UTF-8, not null, and its text (without surrounding whitespace) starts with `{` and ends
  with `}`: each value then is exactly one row of the document (a JSON string cannot hold a raw
  newline, so no object runs on into the next value) and Arrow must return one row per value;
- Arrow parses the document with the declared types: it is as strict as the reference about types
  (no string-to-number, no float-to-integer, integers in range, a key given twice is an error);
- required fields are present and not null, and numbers are finite (Arrow accepts NaN and Infinity);
- timestamps are strict RFC 3339 text (read by Arrow's cast; year 0 excluded, which Python refuses),
  other timestamp, date, binary and decimal values go through the reference's own coercion, column by
  column (a decimal sent as a JSON number sends its chunk record by record: Arrow reads it as a double).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from offsetlake.config import SchemaField
from offsetlake.formats import native_json
from offsetlake.formats.arrays import one_array

# What Arrow parses each declared type as; the text types are converted afterwards (`_finish`).
_PARSED_AS = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float64(),  # then cast, as the reference does from a Python float (no double rounding)
    "boolean": pa.bool_(),
    "timestamp": pa.string(),
    "date": pa.string(),
    "binary": pa.string(),
}
_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"
_CLOCK = _YEAR + r"-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?"
_AWARE = "^" + _CLOCK + r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)$"
_NAIVE = "^" + _CLOCK + "$"  # naive means UTC, as in the reference


def read_columns(fields: list[SchemaField], values: pa.Array, schema: pa.Schema, coerce) -> list[pa.Array] | None:
    """The declared columns of `values` (binary JSON texts) as `schema` types them, or None: decide these
    record by record. `coerce(value, type)` is the reference's conversion of one JSON value."""
    if len(values) == 0 or values.null_count:
        return None
    try:
        text = values.cast(pa.string())  # checks UTF-8 (Arrow's reader would skip undeclared fields)
    except pa.ArrowInvalid:
        return None
    if not (objects(text) or objects(pc.utf8_trim_whitespace(text))):  # trimmed (a copy) only if needed
        return None
    parsed_as = pa.schema([(f.name, _PARSED_AS.get(f.type, pa.string())) for f in fields])  # decimal(p,s): text
    # The native parser reads the timestamps too, where they are text Arrow's cast reads.
    natively_as = pa.schema(
        [(f.name, native_json.TIMESTAMP) if f.type == "timestamp" else parsed for f, parsed in zip(fields, parsed_as)]
    )
    table = read_objects(values, parsed_as, natively_as)
    if table is None:
        return None
    columns = []
    for f in fields:
        column = _finish(one_array(table.column(f.name)), f.type, schema.field(f.name).type, coerce)
        if column is None or (f.required and column.null_count):
            return None
        columns.append(column)
    return columns


def objects(text: pa.Array) -> bool:
    """Whether every text starts with `{` and ends with `}`."""
    return bool(pc.all(pc.starts_with(text, "{")).as_py() and pc.all(pc.ends_with(text, "}")).as_py())


def read_objects(values: pa.Array, parsed_as: pa.Schema, natively_as: pa.Schema | None = None) -> pa.Table | None:
    """`values` (JSON texts, each one object: see `read_document`) read with `parsed_as`'s types: by the
    native parser where it is sure (`native_json`; with `natively_as`'s types if given), else by Arrow's
    reader; None if Arrow refuses them."""
    table = native_json.read_objects(values, natively_as or parsed_as)
    return table if table is not None else read_document(lines(values), parsed_as, len(values))


def read_document(document: pa.Buffer | bytes, parsed_as: pa.Schema, rows: int) -> pa.Table | None:
    """`document` (one JSON object a row, every row an object: Arrow's reader must never see a bare `null`,
    it crashes on one) read with `parsed_as`'s types, undeclared fields skipped; None if Arrow refuses it or
    finds other than `rows` rows."""
    try:
        table = pj.read_json(
            pa.BufferReader(document),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(len(document), 1 << 16)),
            parse_options=pj.ParseOptions(explicit_schema=parsed_as, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    return table if table.num_rows == rows else None


def lines(values: pa.Array, separator: bytes = b"\n") -> pa.Buffer:
    """The values one per line (each followed by `separator`), as one buffer (Arrow joins them; no Python
    object per value)."""
    joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), pa.scalar(separator, pa.binary()))
    _, offsets, data = joined.buffers()
    bounds = np.frombuffer(offsets, np.int32, count=len(joined) + 1, offset=4 * joined.offset)
    return data[int(bounds[0]) : int(bounds[-1])]


def _finish(column: pa.Array, type_: str, target: pa.DataType, coerce) -> pa.Array | None:
    """`column` as parsed (`_PARSED_AS`) to `target`, the declared type's Arrow type; None: not here."""
    if type_ in ("double", "float"):
        if pc.any(pc.invert(pc.is_finite(column))).as_py():  # NaN or Infinity: the reference refuses them
            return None
        return column.cast(target)
    if type_ == "timestamp":
        return _timestamps(column, target, coerce)
    if type_ in ("date", "binary") or type_ not in _PARSED_AS:  # decimal text: the reference reads it exactly
        return _by_reference(column, type_, target, coerce)
    return column


def _timestamps(column: pa.Array, target: pa.DataType, coerce) -> pa.Array | None:
    if column.type == native_json.TIMESTAMP:  # read so by the native parser
        return column.cast(target)
    try:
        if pc.all(pc.match_substring_regex(column, _AWARE)).as_py() is not False:
            return column.cast(target)
        if pc.all(pc.match_substring_regex(column, _NAIVE)).as_py() is not False:
            return column.cast(pa.timestamp(target.unit)).cast(target)
    except pa.ArrowInvalid:  # matched the pattern but is no date (February 30th): the reference words it
        return None
    return _by_reference(column, "timestamp", target, coerce)


def _by_reference(column: pa.Array, type_: str, target: pa.DataType, coerce) -> pa.Array | None:
    try:
        return pa.array([None if v is None else coerce(v, type_) for v in column.to_pylist()], target)
    except (TypeError, ValueError, OverflowError):
        return None
