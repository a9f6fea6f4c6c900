"""The source database of the change-data-capture tests, and the oracle they check Delta against.

`Shop` (offsetlake.local.shop, the demo's too) is a PostgreSQL schema of two tables with a column of each
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
import json
import uuid

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake.local import shop

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
# What Shop.add_column adds to customers, and its Delta type.
ADDED_COLUMN = (shop.ADDED_COLUMN[0], pa.string())


class Shop(shop.Shop):
    def types(self, table: str) -> dict[str, pa.DataType]:
        """The Delta type each column of `table` must land as (the oracle's own table, above)."""
        types = dict(CUSTOMER_TYPES if table == "customers" else ORDER_TYPES)
        if table == "customers" and self.added_column:
            types[ADDED_COLUMN[0]] = ADDED_COLUMN[1]
        return types


# ---- the oracle ---------------------------------------------------------------------------------------


# The one thing a table cannot know. PostgreSQL sends an update's new row without its TOASTed values that
# the update left unchanged (REPLICA IDENTITY DEFAULT), and Debezium turns a primary-key change into a
# delete of the old key (its key columns only) and a create of the new one holding the placeholder for
# those values: no event carries them. Such a value of a moved row may be null in the table, until an
# update sets it; it is counted, and never another value. The workload's TOASTable values are a few
# bytes or several KB, so "large" is unambiguous at this size.
TOASTABLE = ("note", "photo", "tags", "codes")
LARGE = 1000


def assert_table_is_source(
    table_path: str, source: dict[int, dict], types: dict[str, pa.DataType], moved: set[int] = frozenset()
) -> int:
    """The Delta table holds exactly the source's rows (by id), each column of its expected type and each
    value equal to PostgreSQL's, but a large value of a `moved` row (see above), which may be null. Returns
    how many values were null for that reason."""
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
    wrong, left_out = [], 0
    for key, expected in source.items():
        for name in types:
            want, got = _as_delta(expected[name]), rows[key][name]
            if want != got and got is None and key in moved and name in TOASTABLE and _size(want) > LARGE:
                left_out += 1
            elif want != got:
                wrong.append(f"id {key} {name}: source {_shown(want)}, table {_shown(got)}")
    assert not wrong, f"{len(wrong)} values differ:\n" + "\n".join(wrong[:10])
    return left_out


def _size(value) -> int:
    if isinstance(value, list):
        return sum(len(str(v)) for v in value)
    return len(value) if isinstance(value, str | bytes) else 0


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({_size(value)} bytes)"


def _as_delta(value):
    """A PostgreSQL value as the Delta table must hold it: naive timestamps are UTC wall-clock readings,
    jsonb is its text (compared parsed), uuid is text, bytea bytes."""
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
