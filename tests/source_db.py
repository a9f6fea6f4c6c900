"""The source database of the change-data-capture tests, and the oracle they check Delta against.

`Shop` (offsetlake_local.shop, the demo's too) is a PostgreSQL schema of two tables with a column of each
type users capture, changed by a seeded random workload of multi-row transactions: inserts, updates of some
columns, deletes, primary-key updates, and an `ALTER TABLE ... ADD COLUMN` mid-stream. The oracle is the
database itself: once Debezium's slot has confirmed the workload's last LSN and the pipelines have
ingested, each Delta table must equal `SELECT *` of its source table row by row and value by value, with
the Delta type each column should have.
Nothing here reads offsetlake's code or verdicts: PostgreSQL's values (psycopg2) against the Delta table's
(deltalake).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import struct
import uuid

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake_local import shop

UTC = dt.UTC
TIMESTAMP = pa.timestamp("us", tz="UTC")

# The Delta (Arrow) type each source column must land as, by Debezium's default mappings
# (decimal.handling.mode=precise, time.precision.mode=adaptive).
CUSTOMER_TYPES = {
    "id": pa.int64(),
    "name": pa.string(),
    "balance": pa.decimal128(12, 2),
    "born": pa.date32(),
    "created": TIMESTAMP,
    "seen": TIMESTAMP,
    "prefs": pa.string(),
    "token": pa.string(),
    "tags": pa.list_(pa.string()),
    "photo": pa.binary(),
    "tier": pa.string(),
    "visits": pa.int32(),
    "score": pa.float64(),
    "active": pa.bool_(),
    "note": pa.string(),
    "codes": pa.list_(pa.int32()),
}
ORDER_TYPES = {
    "id": pa.int64(),
    "customer_id": pa.int64(),
    "amount": pa.decimal128(10, 3),
    "placed": TIMESTAMP,
    "status": pa.string(),
}
PARCEL_TYPES = {
    "id": pa.int64(),
    "region": pa.string(),
    "weight": pa.decimal128(18, 6),
    "label": pa.string(),
    "memo": pa.string(),
    "sent": TIMESTAMP,
    "due": pa.date32(),
    "pieces": pa.int16(),
    "ratio": pa.float32(),
    "fragile": pa.bool_(),
    "meta": pa.string(),
    "tracking": pa.string(),
    "scan": pa.binary(),
    "transit": pa.string(),  # interval.handling.mode=string: ISO-8601 text
    "fee": pa.string(),  # numeric without a scale: its exact text (Debezium's VariableScaleDecimal)
    "loaded": TIMESTAMP,
    "cutoff": pa.int64(),  # time: microseconds of the day (Delta has no time type)
    "grade": pa.string(),
    "labels": pa.list_(pa.string()),
    "bins": pa.list_(pa.int32()),
}
# What Shop.add_column adds to customers, and its Delta type.
ADDED_COLUMN = (shop.ADDED_COLUMN[0], pa.string())
INTERVAL_OID = 1186  # PostgreSQL's type oid of `interval`
INTERVALS = {"transit"}  # the shop's interval columns: compared as (months, days, microseconds)


class Shop(shop.Shop):
    def types(self, table: str) -> dict[str, pa.DataType]:
        """The Delta type each column of `table` must land as (the oracle's own table, above)."""
        types = dict({"customers": CUSTOMER_TYPES, "parcels": PARCEL_TYPES}.get(table, ORDER_TYPES))
        if table == "customers" and self.added_column:
            types[ADDED_COLUMN[0]] = ADDED_COLUMN[1]
        return types

    def rows(self, table: str) -> dict[int, dict]:
        """`SELECT *` of the table, {id: row}, an interval as PostgreSQL's own ISO-8601 text (psycopg2 would
        make it a timedelta of 30-day months)."""
        import psycopg2.extensions

        conn = self.server.connect()
        try:
            as_text = psycopg2.extensions.new_type((INTERVAL_OID,), "INTERVAL_AS_TEXT", lambda value, _: value)
            psycopg2.extensions.register_type(as_text, conn)
            with conn.cursor() as cur:
                cur.execute("SET intervalstyle = 'iso_8601'")
                cur.execute(f'SELECT * FROM "{self.schema}".{table}')
                names = [d.name for d in cur.description]
                return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}
        finally:
            conn.close()


# ---- the oracle ---------------------------------------------------------------------------------------


# Values PostgreSQL may store out of line (TOASTed) and then leave out of an update that does not change them
# (REPLICA IDENTITY DEFAULT): Debezium sends its placeholder instead, and on a primary-key change the new key's
# create event holds nothing else for them. The table must hold them all the same.
TOASTABLE = ("note", "photo", "tags", "codes")


def assert_table_is_source(table_path: str, source: dict[int, dict], types: dict[str, pa.DataType]) -> int:
    """The Delta table holds exactly the source's rows (by id), each column of its expected type and each
    value equal to PostgreSQL's, every cell. Returns how many cells were compared."""
    data = DeltaTable(table_path).to_pyarrow_table()
    for name, expected in types.items():
        assert name in data.column_names, f"column {name!r} missing from {table_path}: {data.column_names}"
        assert data.schema.field(name).type == expected, f"{name}: {data.schema.field(name).type} != {expected}"
    rows = {row["id"]: row for row in data.select(list(types)).to_pylist()}
    assert len(rows) == data.num_rows, "a key twice in the table"
    missing, unexpected = sorted(source.keys() - rows.keys()), sorted(rows.keys() - source.keys())
    if unexpected:
        lineage = ["_debezium_op", "_debezium_position", "kafka_partition", "kafka_offset"]
        found = data.filter(pa.compute.is_in(data.column("id"), pa.array(unexpected[:5], pa.int64())))
        where = found.select([c for c in ["id", *lineage] if c in data.column_names]).to_pylist()
    assert not missing and not unexpected, (
        f"{table_path}: {len(missing)} rows missing {missing[:5]}, {len(unexpected)} unexpected "
        f"{where if unexpected else ''}"
    )
    wrong = [
        f"id {key} {name}: source {_shown(_as_delta(expected[name], kind, name in INTERVALS))}, "
        f"table {_shown(rows[key][name])}"
        for key, expected in source.items()
        for name, kind in types.items()
        if _as_delta(expected[name], kind, name in INTERVALS) != rows[key][name]
    ]
    assert not wrong, f"{len(wrong)} values differ:\n" + "\n".join(wrong[:10])
    return len(source) * len(types)


def _size(value) -> int:
    if isinstance(value, list):
        return sum(len(str(v)) for v in value)
    return len(value) if isinstance(value, str | bytes) else 0


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({_size(value)} bytes)"


def _as_delta(value, kind: pa.DataType, interval: bool = False):
    """A PostgreSQL value as the Delta table of type `kind` must hold it: naive timestamps are UTC wall-clock
    readings, jsonb is its text (compared parsed), uuid is text, bytea bytes, real a float32, an interval its
    (months, days, microseconds) in ISO-8601 text."""
    if value is None:
        return None
    if pa.types.is_float32(kind):
        return struct.unpack("f", struct.pack("f", value))[0]
    if interval:
        return _Interval(value)
    if isinstance(value, dt.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**6 + value.microsecond
    if isinstance(value, decimal.Decimal) and kind == pa.string():
        return _ExactDecimal(value)
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return _Json(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


class _Json:
    """Equal to JSON text that parses to the same value (PostgreSQL's jsonb normalises whitespace and order)."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, str) and json.loads(other) == self.value

    def __repr__(self):
        return f"json {self.value!r}"


_ISO_INTERVAL = re.compile(
    r"P(?:(?P<Y>[-+]?\d+)Y)?(?:(?P<Mo>[-+]?\d+)M)?(?:(?P<D>[-+]?\d+)D)?"
    r"(?:T(?:(?P<H>[-+]?\d+)H)?(?:(?P<Mi>[-+]?\d+)M)?(?:(?P<S>[-+]?\d+(?:\.\d+)?)S)?)?"
)


def interval_parts(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of ISO-8601 interval text, each part signed on its own (PostgreSQL's
    `intervalstyle iso_8601` and Debezium's `interval.handling.mode=string` both write that form)."""
    match = _ISO_INTERVAL.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO-8601 interval: {text!r}")
    part = {name: match.group(name) or "0" for name in ("Y", "Mo", "D", "H", "Mi", "S")}
    seconds = decimal.Decimal(part["S"])
    micros = (int(part["H"]) * 3600 + int(part["Mi"]) * 60) * 10**6 + int(seconds.scaleb(6))
    if seconds.scaleb(6) != int(seconds.scaleb(6)):
        raise ValueError(f"an interval finer than a microsecond: {text!r}")
    return int(part["Y"]) * 12 + int(part["Mo"]), int(part["D"]), micros


class _ExactDecimal:
    """Equal to decimal text in plain digits (no exponent) of the same value, every digit. PostgreSQL keeps an
    unconstrained numeric's display scale (`1.50`), but Debezium's VariableScaleDecimal arrives with trailing
    zeros stripped, so no event carries it: the value is compared, not its trailing zeros."""

    def __init__(self, value: decimal.Decimal):
        self.value = value

    def __eq__(self, other):
        if not isinstance(other, str) or not re.fullmatch(r"-?\d+(\.\d+)?", other):
            return False
        return decimal.Decimal(other) == self.value

    def __repr__(self):
        return f"numeric {self.value}"


class _Interval:
    """Equal to interval text of the same months, days and microseconds."""

    def __init__(self, text: str):
        self.parts = interval_parts(text)

    def __eq__(self, other):
        return (
            isinstance(other, str)
            and _ISO_INTERVAL.fullmatch(other) is not None
            and (interval_parts(other) == self.parts)
        )

    def __repr__(self):
        return f"interval {self.parts}"
