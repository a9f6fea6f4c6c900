"""The source database of the change-data-capture tests, and the oracle they check Delta against.

`Shop` is a PostgreSQL schema of two tables with a column of each type users capture (numeric, date,
timestamp with and without zone, jsonb, uuid, text[], bytea, an enum, large text), changed by a seeded
random workload of multi-row transactions: inserts, updates of some columns, deletes, primary-key updates,
and an `ALTER TABLE ... ADD COLUMN` mid-stream. The oracle is the database itself: once Debezium's slot
has confirmed the workload's last LSN and the pipelines have ingested, each Delta table must equal
`SELECT *` of its source table row by row and value by value, with the Delta type each column should have.
Nothing here reads offsetlake's code or verdicts: PostgreSQL's values (psycopg2) against the Delta table's
(deltalake).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import time
import uuid

import pyarrow as pa
from deltalake import DeltaTable

from offsetlake.local.postgres import Postgres

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
}
ORDER_TYPES = {
    "id": pa.int64(),
    "customer_id": pa.int64(),
    "amount": pa.decimal128(10, 3),
    "placed": TIMESTAMP,
    "status": pa.string(),
}
ADDED_COLUMN = ("country", "text", pa.string())

SCHEMA_SQL = """
CREATE TYPE {s}.tier AS ENUM ('bronze', 'silver', 'gold');
CREATE TABLE {s}.customers (
    id bigint PRIMARY KEY, name text NOT NULL, balance numeric(12, 2), born date, created timestamp(6),
    seen timestamptz, prefs jsonb, token uuid, tags text[], photo bytea, tier {s}.tier, visits integer,
    score double precision, active boolean, note text
);
CREATE TABLE {s}.heartbeat (id integer PRIMARY KEY, at timestamptz);
CREATE TABLE {s}.orders (
    id bigint PRIMARY KEY, customer_id bigint, amount numeric(10, 3), placed timestamptz, status text
);
"""


class Shop:
    """One schema of the source database and the workload that changes it."""

    def __init__(self, server: Postgres, schema: str, seed: int):
        self.server, self.schema = server, schema
        self.rng = random.Random(seed)
        self.next_id = {"customers": 1, "orders": 1}
        self.added_column = False
        self.counts = {"insert": 0, "update": 0, "delete": 0, "key change": 0, "transactions": 0}

    def create(self, customers: int = 20, orders: int = 20) -> None:
        self.server.execute(f'CREATE SCHEMA "{self.schema}"', SCHEMA_SQL.format(s=self.schema))
        self.transaction([self._insert("customers") for _ in range(customers)])
        self.transaction([self._insert("orders") for _ in range(orders)])

    def tables(self) -> list[str]:
        return ["customers", "orders"]

    # ---- the workload ---------------------------------------------------------------------------------

    def run(self, transactions: int) -> None:
        """`transactions` random transactions of 1-6 statements each."""
        for _ in range(transactions):
            self.transaction([self._statement() for _ in range(self.rng.randint(1, 6))])

    def add_column(self) -> None:
        """`ALTER TABLE customers ADD COLUMN country text`: later inserts and updates set it."""
        name, sql_type, _ = ADDED_COLUMN
        self.server.execute(f'ALTER TABLE "{self.schema}".customers ADD COLUMN {name} {sql_type}')
        self.added_column = True

    def truncate(self, table: str) -> None:
        self.transaction([(f'TRUNCATE "{self.schema}".{table}', ())])
        self.counts["truncate"] = self.counts.get("truncate", 0) + 1

    def transaction(self, statements: list[tuple[str, tuple]]) -> None:
        conn = self.server.connect()
        try:
            with conn, conn.cursor() as cur:
                for sql, args in statements:
                    cur.execute(sql, args)
        finally:
            conn.close()
        self.counts["transactions"] += 1

    def _statement(self) -> tuple[str, tuple]:
        table = self.rng.choice(self.tables())
        kind = self.rng.choices(["insert", "update", "delete", "key change", "many"], [4, 6, 2, 1, 1])[0]
        if kind == "insert" or self.next_id[table] < 5:
            return self._insert(table)
        target = self.rng.randrange(1, self.next_id[table])  # may be gone: the statement then changes nothing
        where = f'"{self.schema}".{table}'
        if kind == "delete":
            self.counts["delete"] += 1
            return f"DELETE FROM {where} WHERE id = %s", (target,)
        if kind == "key change":
            self.counts["key change"] += 1
            new = self._new_id(table)
            return f"UPDATE {where} SET id = %s WHERE id = %s", (new, target)
        values = self._values(table)
        columns = self.rng.sample(sorted(c for c in values if c != "id"), self.rng.randint(1, 3))
        assignments = ", ".join(f"{c} = %s" for c in columns)
        self.counts["update"] += 1
        if kind == "many":  # one statement, many rows
            return f"UPDATE {where} SET {assignments} WHERE id %% 5 = %s", (
                *(values[c] for c in columns),
                self.rng.randrange(5),
            )
        return f"UPDATE {where} SET {assignments} WHERE id = %s", (*(values[c] for c in columns), target)

    def _insert(self, table: str) -> tuple[str, tuple]:
        values = self._values(table)
        values["id"] = self._new_id(table)
        self.counts["insert"] += 1
        columns = ", ".join(values)
        marks = ", ".join(["%s"] * len(values))
        return f'INSERT INTO "{self.schema}".{table} ({columns}) VALUES ({marks})', tuple(values.values())

    def _new_id(self, table: str) -> int:
        self.next_id[table] += 1
        return self.next_id[table] - 1

    def _values(self, table: str) -> dict:
        rng = self.rng
        if table == "orders":
            return {
                "customer_id": rng.randrange(1, 1000),
                "amount": _maybe(rng, decimal.Decimal(rng.randrange(-(10**9), 10**9)).scaleb(-3)),
                "placed": _maybe(rng, _moment(rng).astimezone(dt.timezone(dt.timedelta(hours=rng.randint(-11, 12))))),
                "status": rng.choice(["new", "paid", "shipped", None]),
            }
        values = {
            "name": f"customer {rng.randrange(10**6)} ü",
            "balance": _maybe(rng, decimal.Decimal(rng.randrange(-(10**11), 10**11)).scaleb(-2)),
            "born": _maybe(rng, dt.date(1930, 1, 1) + dt.timedelta(days=rng.randrange(40_000))),
            "created": _maybe(rng, _moment(rng).replace(tzinfo=None)),
            "seen": _maybe(rng, _moment(rng)),
            "prefs": _maybe(rng, json.dumps({"news": rng.random() < 0.5, "n": rng.randrange(100)})),
            "token": _maybe(rng, str(uuid.UUID(int=rng.getrandbits(128)))),
            "tags": _maybe(rng, [rng.choice(["a", "b", "vip", "é"]) for _ in range(rng.randrange(4))]),
            "photo": _maybe(rng, rng.randbytes(rng.randrange(0, 40))),
            "tier": _maybe(rng, rng.choice(["bronze", "silver", "gold"])),
            "visits": _maybe(rng, rng.randrange(-(2**31), 2**31)),
            "score": _maybe(rng, rng.uniform(-1e6, 1e6)),
            "active": _maybe(rng, rng.random() < 0.5),
            # Large and random: PostgreSQL stores it out of line (TOAST), and an update that leaves it alone
            # does not send it (Debezium's placeholder stands in for it).
            "note": _maybe(rng, rng.randbytes(rng.choice([8, 6000])).hex()),
        }
        if self.added_column:
            values[ADDED_COLUMN[0]] = _maybe(rng, rng.choice(["DE", "IN", "BR"]))
        return values

    # ---- reading the source back ----------------------------------------------------------------------

    def rows(self, table: str) -> dict[int, dict]:
        """`SELECT *` of the table: {id: row}."""
        conn = self.server.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f'SELECT * FROM "{self.schema}".{table}')
                names = [d.name for d in cur.description]
                return {row[0]: dict(zip(names, row)) for row in cur.fetchall()}
        finally:
            conn.close()

    def types(self, table: str) -> dict[str, pa.DataType]:
        types = dict(CUSTOMER_TYPES if table == "customers" else ORDER_TYPES)
        if table == "customers" and self.added_column:
            types[ADDED_COLUMN[0]] = ADDED_COLUMN[2]
        return types

    def current_lsn(self) -> int:
        conn = self.server.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_current_wal_lsn() - '0/0'")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    def wait_captured(self, slot: str, timeout: float = 90) -> None:
        """Until the connector's replication slot has confirmed every change made so far: Debezium confirms
        an LSN once the events up to it are in Kafka (acknowledged) and its offsets flushed."""
        target = self.current_lsn()
        deadline = time.monotonic() + timeout
        while True:
            conn = self.server.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                    )
                    found = cur.fetchone()
            finally:
                conn.close()
            if found and found[0] is not None and int(found[0]) >= target:
                return
            assert time.monotonic() < deadline, f"slot {slot} confirmed {found} < {target} after {timeout:.0f}s"
            time.sleep(0.5)


def _maybe(rng: random.Random, value, null_share: float = 0.1):
    return None if rng.random() < null_share else value


def _moment(rng: random.Random) -> dt.datetime:
    seconds = rng.randrange(-2 * 10**9, 3 * 10**9)
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds, microseconds=rng.randrange(10**6))


# ---- the oracle ---------------------------------------------------------------------------------------


def assert_table_is_source(table_path: str, source: dict[int, dict], types: dict[str, pa.DataType]) -> int:
    """The Delta table holds exactly the source's rows (by id), each column of its expected type and each
    value equal to PostgreSQL's. Returns the number of rows."""
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
    wrong = []
    for key, expected in source.items():
        for name in types:
            want, got = _as_delta(expected[name]), rows[key][name]
            if want != got:
                wrong.append(f"id {key} {name}: source {want!r}, table {got!r}")
    assert not wrong, f"{len(wrong)} values differ:\n" + "\n".join(wrong[:10])
    return len(rows)


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
