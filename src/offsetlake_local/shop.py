"""A small shop database changing at random: the source that `make demo` captures with Debezium, and the
workload of the change-data-capture tests (tests/source_db.py holds their oracle).

`Shop` is a PostgreSQL schema of two tables with a column of each type users capture (numeric, date,
timestamp with and without zone, jsonb, uuid, text[], bytea, an enum, integer[]; the text, arrays and
bytea sometimes large enough for PostgreSQL to store them out of line, TOASTed), changed by a seeded
random workload of multi-row transactions: inserts, updates of some columns, deletes, primary-key updates,
an `ALTER TABLE ... ADD COLUMN` and a TRUNCATE when asked. `python -m offsetlake_local.shop` keeps one
changing (the demo's, started and stopped by PID).
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import random
import time
import uuid

from offsetlake_local.postgres import Postgres

UTC = dt.UTC
ADDED_COLUMN = ("country", "text")  # what add_column adds to customers
# A large value's size: random (incompressible) and above PostgreSQL's ~2 kB row threshold, so it is stored
# out of line (TOASTed), small enough to keep the change events light.
LARGE_BYTES = 2800

# Keyed on two columns, one of them text, with a column of every type the shop captures, those the other
# tables lack included: varchar(n), smallint, real, interval (Debezium sends it as ISO-8601 text:
# connect.debezium_postgres), time, numeric with and without a scale.
PARCELS_SQL = """
CREATE TABLE IF NOT EXISTS {s}.parcels (
    id bigint, region varchar(12), weight numeric(18, 6), fee numeric, label varchar(40), memo text,
    sent timestamptz, loaded timestamp(6), due date, cutoff time(6), pieces smallint, ratio real,
    fragile boolean, meta jsonb, tracking uuid, scan bytea, transit interval, grade {s}.tier,
    labels text[], bins integer[], PRIMARY KEY (region, id)
);
"""
KEYS = {"parcels": ["region", "id"]}  # each table's primary key, where it is not `id`
REGIONS = ("north", "south", "east", "west ü")

SCHEMA_SQL = """
CREATE TYPE {s}.tier AS ENUM ('bronze', 'silver', 'gold');
CREATE TABLE {s}.customers (
    id bigint PRIMARY KEY, name text NOT NULL, balance numeric(12, 2), born date, created timestamp(6),
    seen timestamptz, prefs jsonb, token uuid, tags text[], photo bytea, tier {s}.tier, visits integer,
    score double precision, active boolean, note text, codes integer[]
);
CREATE TABLE {s}.heartbeat (id integer PRIMARY KEY, at timestamptz);
"""
# Orders, and each table shaped as it (Shop.add_table makes them later).
ORDERS_SQL = """
CREATE TABLE {s}.{t} (
    id bigint PRIMARY KEY, customer_id bigint, amount numeric(10, 3), placed timestamptz, status text
);
"""


class Shop:
    """One schema of a PostgreSQL database and the seeded workload that changes it."""

    def __init__(self, server: Postgres, schema: str, seed: int):
        self.server, self.schema = server, schema
        self.rng = random.Random(seed)
        self.next_id = {"customers": 1, "orders": 1, "parcels": 1}
        self.later_tables: list[str] = []  # made by add_table, shaped as orders
        self.added_column = False
        self.counts = {"insert": 0, "update": 0, "delete": 0, "key change": 0, "transactions": 0}

    def create(self, customers: int = 20, orders: int = 20, parcels: int = 20) -> None:
        schema = f'"{self.schema}"'
        self.server.execute(
            f"CREATE SCHEMA {schema}",
            SCHEMA_SQL.format(s=schema),
            ORDERS_SQL.format(s=schema, t="orders"),
            PARCELS_SQL.format(s=schema),
        )
        for table, rows in (("customers", customers), ("orders", orders), ("parcels", parcels)):
            self.transaction([self._insert(table) for _ in range(rows)])

    def tables(self) -> list[str]:
        return ["customers", "orders", "parcels", *self.later_tables]

    def add_table(self, name: str, rows: int = 10) -> None:
        """`CREATE TABLE <name>` (orders' columns) with `rows` rows: later transactions change it too."""
        self.server.execute(ORDERS_SQL.format(s=f'"{self.schema}"', t=name))
        self.later_tables.append(name)
        self.next_id[name] = 1
        self.transaction([self._insert(name) for _ in range(rows)])

    def resume(self) -> None:
        """Continue a shop made earlier (by another process): new ids follow the tables' highest; a column
        added to the shop since it was made is added to it."""
        conn = self.server.connect()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(f'ALTER TABLE "{self.schema}".customers ADD COLUMN IF NOT EXISTS codes integer[]')
                cur.execute(PARCELS_SQL.format(s=f'"{self.schema}"'))
                for table in self.tables():
                    cur.execute(f'SELECT coalesce(max(id), 0) FROM "{self.schema}".{table}')
                    self.next_id[table] = int(cur.fetchone()[0]) + 1
                cur.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = 'customers' "
                    "AND column_name = %s",
                    (self.schema, ADDED_COLUMN[0]),
                )
                self.added_column = cur.fetchone() is not None
        finally:
            conn.close()

    # ---- the workload ---------------------------------------------------------------------------------

    def run(self, transactions: int) -> None:
        """`transactions` random transactions of 1-6 statements each."""
        for _ in range(transactions):
            self.transaction([self._statement() for _ in range(self.rng.randint(1, 6))])

    def add_column(self) -> None:
        """`ALTER TABLE customers ADD COLUMN country text`: later inserts and updates set it."""
        name, sql_type = ADDED_COLUMN
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
            if table == "parcels" and self.rng.random() < 0.5:  # the key's other column
                return f"UPDATE {where} SET region = %s WHERE id = %s", (self.rng.choice(REGIONS), target)
            return f"UPDATE {where} SET id = %s WHERE id = %s", (self._new_id(table), target)
        values = self._values(table)
        key = KEYS.get(table, ["id"])
        columns = self.rng.sample(sorted(c for c in values if c not in key), self.rng.randint(1, 3))
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
        if table == "parcels":
            return self._parcel(rng)
        if table != "customers":  # orders, and the tables shaped as it
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
            "tags": _maybe(rng, _tags(rng)),
            "photo": _maybe(rng, rng.randbytes(rng.choice([rng.randrange(0, 40), LARGE_BYTES]))),
            "tier": _maybe(rng, rng.choice(["bronze", "silver", "gold"])),
            "visits": _maybe(rng, rng.randrange(-(2**31), 2**31)),
            "score": _maybe(rng, rng.uniform(-1e6, 1e6)),
            "active": _maybe(rng, rng.random() < 0.5),
            # Large and random: PostgreSQL stores it out of line (TOAST), and an update that leaves it alone
            # does not send it (Debezium's placeholder stands in for it).
            "note": _maybe(rng, rng.randbytes(rng.choice([8, LARGE_BYTES // 2])).hex()),
            "codes": _maybe(rng, [rng.randrange(-(2**31), 2**31) for _ in range(rng.choice([3, LARGE_BYTES // 4]))]),
        }
        if self.added_column:
            values[ADDED_COLUMN[0]] = _maybe(rng, rng.choice(["DE", "IN", "BR"]))
        return values

    def _parcel(self, rng: random.Random) -> dict:
        """A parcel's values; its region (part of its key) is set at insert and by key changes only."""
        hours = rng.randint(-100, 100)
        return {
            "region": rng.choice(REGIONS),
            "weight": _maybe(rng, decimal.Decimal(rng.randrange(-(10**18) + 1, 10**18)).scaleb(-6)),
            "label": _maybe(rng, "".join(rng.choice("abcxyzé€ 0123") for _ in range(rng.randrange(41)))),
            "memo": _maybe(rng, rng.randbytes(rng.choice([6, LARGE_BYTES // 2])).hex()),  # large: TOASTed
            "sent": _maybe(rng, _moment(rng).astimezone(dt.timezone(dt.timedelta(minutes=rng.randint(-690, 720))))),
            "due": _maybe(rng, dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(80_000))),
            "pieces": _maybe(rng, rng.randint(-(2**15), 2**15 - 1)),
            "ratio": _maybe(rng, rng.choice([rng.uniform(-1e6, 1e6), rng.uniform(-1, 1), 0.1, float(2**24 + 1)])),
            "fragile": _maybe(rng, rng.random() < 0.5),
            "meta": _maybe(rng, json.dumps({"n": rng.randrange(10**9), "tags": ["x", "ü"][: rng.randrange(3)]})),
            "tracking": _maybe(rng, str(uuid.UUID(int=rng.getrandbits(128)))),
            "scan": _maybe(rng, rng.randbytes(rng.choice([rng.randrange(0, 30), LARGE_BYTES]))),  # large: TOASTed
            # Up to 31 digits: more than Decimal's arithmetic keeps (28), so built from text.
            "fee": _maybe(rng, decimal.Decimal(f"{rng.randrange(-(10**30), 10**30)}E-{rng.randrange(0, 20)}")),
            "loaded": _maybe(rng, _moment(rng).replace(tzinfo=None)),
            "cutoff": _maybe(rng, (dt.datetime.min + dt.timedelta(microseconds=rng.randrange(86_400 * 10**6))).time()),
            "grade": _maybe(rng, rng.choice(["bronze", "silver", "gold"])),
            "labels": _maybe(rng, _tags(rng)),
            "bins": _maybe(rng, [rng.randrange(-(2**31), 2**31) for _ in range(rng.randrange(5))]),
            "transit": _maybe(
                rng,
                f"{rng.randint(-3, 30)} years {rng.randint(-11, 11)} mons {rng.randint(-40, 40)} days "
                f"{hours}:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(10**6):06d}",
            ),
        }

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

    def wait_captured(self, slot: str, timeout: float = 90) -> None:
        """Until the connector's replication slot has confirmed every change made so far."""
        self.server.wait_confirmed(slot, timeout)


def _tags(rng: random.Random) -> list[str]:
    """A few short tags, or (a third of the time) hundreds of random ones: large enough to be TOASTed."""
    if rng.random() < 1 / 3:
        return [rng.randbytes(4).hex() for _ in range(LARGE_BYTES // 8)]
    return [rng.choice(["a", "b", "vip", "é"]) for _ in range(rng.randrange(4))]


def _maybe(rng: random.Random, value, null_share: float = 0.1):
    return None if rng.random() < null_share else value


def _moment(rng: random.Random) -> dt.datetime:
    seconds = rng.randrange(-2 * 10**9, 3 * 10**9)
    return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds, microseconds=rng.randrange(10**6))


def main(argv: list[str] | None = None) -> int:
    """Keep a shop made earlier changing: a few transactions every `--every` seconds, until stopped."""
    parser = argparse.ArgumentParser(prog="python -m offsetlake_local.shop", description=main.__doc__)
    parser.add_argument("--port", type=int, required=True, help="the PostgreSQL server's port on 127.0.0.1")
    parser.add_argument("--user", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--schema", required=True, help="the shop's schema (made by Shop.create)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between rounds of transactions")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shop = Shop(Postgres.at(args.port, args.user, args.database), args.schema, seed=args.seed)
    shop.resume()
    while True:
        shop.run(shop.rng.randint(1, 4))
        print(f"{time.strftime('%H:%M:%S')} {shop.counts}", flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    raise SystemExit(main())
