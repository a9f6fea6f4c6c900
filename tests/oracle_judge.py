"""Why a record cannot be a row, by the oracle's own reading of the docs (docs/reference/pipeline.md,
docs/usage/registry-formats.md, docs/usage/upsert.md): each quarantined record is judged here, whatever the
product or the test's journal says. A record judged good is a finding; one judged bad must be quarantined
with a reason that holds the fragment returned here (the kind of defect, and what it concerns)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import re
import struct

import pyarrow as pa

from oracle_types import DECIMAL, same_type, struct_columns

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
UNFRAMED = "not in the Schema Registry wire format"  # any non-framed value read by a registry format
# What the docs say a registry payload that its schema cannot decode is quarantined as.
UNDECODABLE = {"avro": "not a valid Avro record", "protobuf": "not a valid Protobuf message", "json_schema": ""}


def quarantine_defect(cfg, decoder, record, schema: pa.Schema):
    """The fragment a quarantined record's reason must hold; None if the oracle finds the record good."""
    fmt, write = cfg.format, cfg.write
    if write.upsert and record.value is None:
        return None  # a tombstone deletes its key (or, `deletes: ignore`, is skipped): never bad
    if fmt.envelope == "debezium":
        defect = debezium_defect(cfg, decoder, record, schema)
    elif fmt.type == "json":
        defect = json_defect(cfg, record)
    elif fmt.type == "raw":
        defect = None
    else:
        defect = registry_defect(decoder, record, schema)
    if defect is None and fmt.key is not None:
        try:
            decoder.key_of(record.key, schema)
        except Exception:  # noqa: BLE001 - the oracle's own decoders refuse it: the key is bad
            defect = "key"
    if defect is None and write.upsert:
        row = decoder.row(record, schema)
        null = next((c for c in write.required if row.get(c) is None), None)
        defect = None if null is None else f"column {null!r} is null"
    return defect


DEBEZIUM_OPS = ("c", "r", "u", "d")  # create, snapshot read, update, delete: the ops that change a row


def debezium_defect(cfg, decoder, record, schema: pa.Schema) -> str | None:
    """A Debezium change event, as Debezium documents its envelope: an object with `op` one of c, r, u, d,
    the row in `after` (`before` for d), the position in `source`; the row's fields the declared ones
    (json) or its schema's. The tombstone after a delete is skipped, never bad."""
    if record.value is None:
        return None
    if cfg.format.type == "json":
        try:
            event = json.loads(record.value)
        except ValueError:
            return "not valid JSON"
        if isinstance(event, dict) and set(event) == {"schema", "payload"}:
            event = event["payload"]
    else:
        framing = registry_defect(decoder, record, schema, envelope=True)
        if framing is not None:
            return framing
        event = decoder.payload(record.value)
    if not isinstance(event, dict) or "op" not in event:
        return "not a change event"
    op = event["op"]
    if op not in DEBEZIUM_OPS:
        return f"op {op!r}"
    side = "before" if op == "d" else "after"
    if not isinstance(event.get(side), dict):
        return f"'{side}'"
    position = cfg.format.debezium.position
    if not isinstance(event.get("source"), dict) or position not in event["source"]:
        return f"{position!r}"
    if cfg.format.type == "json":
        return declared_defect(cfg.format, event[side])
    return None


def registry_defect(decoder, record, schema: pa.Schema, envelope: bool = False) -> str | None:
    """A registry format's value: framed, its schema known to the registry, decodable, and of the table's
    types (Delta cannot change a column's type: the field that would must be named)."""
    value, kind = record.value, decoder.fmt.type
    if value is None:
        return "tombstone"
    if decoder.fmt.schema_file:  # plain Avro, no framing: one schema, the table's
        try:
            decoder.payload(value)
        except Exception:  # noqa: BLE001 - the oracle's decoder refuses the payload
            return UNDECODABLE["avro"]
        return None
    if len(value) < 5 or value[:1] != b"\x00":
        return UNFRAMED
    schema_id = struct.unpack(">I", value[1:5])[0]
    if kind != "protobuf" and not decoder.known_schema(schema_id):
        return f"schema id {schema_id}"
    try:
        fields = decoder.payload(value)
    except Exception:  # noqa: BLE001 - the oracle's decoder refuses the payload
        return UNDECODABLE[kind]
    writer = decoder.writer_type("value", value)
    have = {f.name: f.type for f in schema}
    for name, want in struct_columns(writer).items():
        if name in have and not _widens(have[name], want):
            return f"'{name}"  # the field whose type would change (a nested one: its path starts so)
    if kind == "json_schema" and not envelope:
        for name, t in struct_columns(writer).items():
            if not _fits(fields.get(name), t):
                return ""  # wrong type: the reason's wording is the validator's
    return None


def _widens(have: pa.DataType, want: pa.DataType) -> bool:
    """A writer's type `want` can be a column of type `have`, as docs/usage/registry-formats.md has it: a field
    added (at the top or inside a record) widens the table, a field dropped stays a column, and only a field
    whose type changes cannot be: records field by field (either side may lack some), lists and maps item by
    item, anything else the same type."""
    if pa.types.is_struct(have) and pa.types.is_struct(want):
        mine = {have.field(i).name: have.field(i).type for i in range(have.num_fields)}
        return all(_widens(mine[f.name], f.type) for f in want if f.name in mine)
    if pa.types.is_map(have) and pa.types.is_map(want):
        return _widens(have.key_type, want.key_type) and _widens(have.item_type, want.item_type)
    if pa.types.is_list(have) and pa.types.is_list(want):
        return _widens(have.value_type, want.value_type)
    return same_type(have, want)


def _fits(value, t: pa.DataType) -> bool:
    """A decoded JSON value can be a column of type `t` (null always can)."""
    if value is None:
        return True
    if pa.types.is_struct(t):
        return isinstance(value, dict) and all(_fits(value.get(f.name), f.type) for f in t)
    if pa.types.is_map(t):
        return isinstance(value, dict) and all(_fits(v, t.item_type) for v in value.values())
    if pa.types.is_list(t):
        return isinstance(value, list) and all(_fits(v, t.value_type) for v in value)
    if pa.types.is_boolean(t):
        return isinstance(value, bool)
    if pa.types.is_integer(t):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(t):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if pa.types.is_timestamp(t):
        return _field_defect(value, "timestamp") is None
    if pa.types.is_date(t):
        return _field_defect(value, "date") is None
    if pa.types.is_binary(t):
        return _field_defect(value, "binary") is None
    return isinstance(value, str)


INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
# Decimal text as the docs have it: digits, a point, an exponent; no spaces, NaN or Infinity.
DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def json_defect(cfg, record) -> str | None:
    """Why a `json` record's value cannot be a row (a fragment its quarantine reason must hold), or None
    when the oracle finds it good: the plain declared-fields contract."""
    fmt = cfg.format
    if record.value is None:
        return "value is null"
    if len(record.value) > fmt.max_value_bytes:
        return "above format.max_value_bytes"
    try:
        text = record.value.decode("utf-8")
    except UnicodeDecodeError:
        return "value is not"  # UTF-8 (or JSON, whichever the reader meets first)
    try:
        value = json.loads(text)
    except ValueError:
        return "value is not JSON"
    if not isinstance(value, dict):
        return "expected an object"
    return declared_defect(fmt, value)


def declared_defect(fmt, value: dict) -> str | None:
    """Why an object does not fit the pipeline's declared fields; None when it does."""
    for declared in fmt.schema_:
        field_value = value.get(declared.name)
        if field_value is None:
            if declared.required:
                return f"required field {declared.name!r}"
            continue
        wrong = _field_defect(field_value, declared.type)
        if wrong:
            return f"field {declared.name!r}: {wrong}"
    if fmt.unknown_fields == "keep":
        extra = {k: v for k, v in value.items() if k not in {f.name for f in fmt.schema_}}
        try:
            json.dumps(extra, allow_nan=False)
        except ValueError:
            return "undeclared fields"
    return None


def _decimal_defect(value, precision: int, scale: int) -> str | None:
    """docs/reference/pipeline.md's `decimal(p,s)`: decimal text (exact) or a JSON number, never rounded: more
    places than the scale, or more digits before the point than the precision leaves, are refused."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return "expected a decimal"
    if isinstance(value, str) and not DECIMAL_TEXT.fullmatch(value):
        return f"{value[:40]!r} is not a decimal number"
    if isinstance(value, float) and not math.isfinite(value):
        return "number is not finite"
    exact = decimal.Decimal(value if isinstance(value, str) else repr(value))
    wide = decimal.Context(prec=100)
    if exact != exact.quantize(decimal.Decimal(1).scaleb(-scale), context=wide):
        return f"{value} has more than {scale} decimal places"
    return f"{value} out of range" if exact and exact.adjusted() >= precision - scale else None


def _field_defect(value, declared: str) -> str | None:
    """The start of what a declared field's wrong value is quarantined with; None when it fits."""
    kind = DECIMAL.fullmatch(declared.replace(" ", ""))
    if kind:
        return _decimal_defect(value, int(kind[1]), int(kind[2]))
    if declared == "string":
        if not isinstance(value, str):
            return "expected a string"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "text holds a lone surrogate"
        return None
    if declared in INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer"
        low, high = INT_RANGES[declared]
        return None if low <= value <= high else "out of range"
    if declared in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a number"
        return None if value == value and abs(value) != float("inf") else "not finite"
    if declared == "boolean":
        return None if isinstance(value, bool) else "expected true or false"
    if declared == "timestamp":
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return "expected a timestamp"
        try:
            if isinstance(value, str):
                dt.datetime.fromisoformat(value)
            else:
                EPOCH + dt.timedelta(milliseconds=value)
        except ValueError:
            return "Invalid isoformat"
        except OverflowError:
            return "out of range"
        return None
    if declared == "date":
        if not isinstance(value, str):
            return "expected a date"
        try:
            dt.date.fromisoformat(value)
        except ValueError:
            return "Invalid isoformat"
        return None
    if declared == "binary":
        if not isinstance(value, str):
            return "expected base64"
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            return "base64"
        return None
    raise AssertionError(f"the oracle knows no declared type {declared!r}")
