"""Upsert mode: a batch is one Delta MERGE keyed on `write.key`, committed with its offsets.

The Spark tasks write the batch's rows as staging files under the table (named by the attempt, as
every batch's files are), each row marked as an upsert or a delete (`DELETED_COLUMN`: a tombstone).
The driver reads them back, keeps one row per key and hands that to `commit()` as a `Merge`: delta-rs
writes the MERGE's files and commits them with the `txn` actions and userMetadata, without rebase,
exactly like an append. The staging files are never referenced by a commit, so the attempt's clean-up
deletes them: a retry, a duplicate run or a zombie applies a batch at most once because the ledger
decides, not because MERGE is idempotent (it is not: an old batch applied again after newer ones would
bring back the values they replaced).

Which row wins, per key:
- within one partition, the highest offset (Kafka's order);
- a key in two partitions (or topics) of one batch has no order Kafka can give: the batch fails,
  naming the key, unless `write.order_by` names a column whose greatest value wins (ties: the higher
  offset).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from offsetlake.config import DEBEZIUM_OP_COLUMN, DEBEZIUM_POSITION_COLUMN, DELETED_COLUMN
from offsetlake.errors import UpsertKeyError
from offsetlake.formats.debezium import snapshot_end_rows, truncate_rows
from offsetlake.protocol import unavailable as placeholders
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import DataFile, read_with_partitions

if TYPE_CHECKING:
    import polars as pl


@dataclass(frozen=True)
class Merge:
    """What a MERGE commit applies: one row per key, DELETED_COLUMN saying which delete their key.
    `unavailable`: the value a Debezium connector sends for one it does not have (a TOASTed column an
    update left unchanged; protocol/unavailable.py); a column holding it keeps the target's value, or null
    for a new row."""

    source: pa.Table
    key: list[str]
    order_by: str | None = None
    unavailable: str | None = None
    truncate: bool = False  # a TRUNCATE came before the source's rows: every other row of the table goes
    snapshot_ends: tuple[SnapshotEnd, ...] = ()  # snapshots that ended: their topic's older rows not read go

    @functools.cached_property
    def unavailable_columns(self) -> list[str]:
        """The source's columns where some row still holds the unavailable value."""
        if self.unavailable is None:
            return []
        return placeholders.holding_columns(self.source, self.key, self.unavailable)

    def for_target(self, target: Sequence[str]) -> Merge:
        """This merge for a target with columns `target`: the unavailable value in a column the target
        lacks becomes null in the source. There is no current value to keep, and delta-rs (1.6) writes a
        column that `merge_schema` adds straight from the source, whatever expression assigns it."""
        new = [c for c in self.unavailable_columns if c not in target]
        if not new:
            return self
        assert self.unavailable is not None  # unavailable_columns is empty without it
        source = self.source
        for column in new:
            values = source.column(column)
            blanked = pa.compute.if_else(
                placeholders.holds(values, self.unavailable), pa.nulls(len(values), values.type), values
            )
            source = source.set_column(source.schema.get_field_index(column), source.schema.field(column), blanked)
        return replace(self, source=source)

    def assignments(self, columns: Sequence[str], target: Sequence[str], keep_target: bool) -> dict[str, str]:
        """`column: expression` for every source column but DELETED_COLUMN: the source's value, and for an
        unavailable one the target's (`keep_target`, an update, when the `target` columns have it) or null."""
        unavailable = set(self.unavailable_columns)
        out = {}
        for column in columns:
            if column == DELETED_COLUMN:
                continue
            quoted = quoted_column(column)
            out[quoted] = f"s.{quoted}"
            if column in unavailable:
                assert self.unavailable is not None  # unavailable_columns is empty without it
                marker = placeholders.sql_literal(self.source.schema.field(column).type, self.unavailable)
                fallback = f"t.{quoted}" if keep_target and column in target else "NULL"
                out[quoted] = f"CASE WHEN s.{quoted} = {marker} THEN {fallback} ELSE s.{quoted} END"
        return out

    def predicate(self) -> str:
        """The join on the key, and each key column's range in this batch: delta-rs (1.6) prunes target files
        by their min/max statistics only for literal bounds in the predicate, not from the source, so without
        them every MERGE reads the whole table (docs/development/measurements.md). After a
        TRUNCATE or a snapshot's end, the join alone: every target row must be seen, to be deleted."""
        join = [f"t.{quoted_column(c)} = s.{quoted_column(c)}" for c in self.key]
        if self.truncate or self.snapshot_ends:
            return " AND ".join(join)
        bounds = [
            f"t.{quoted_column(c)} >= {low} AND t.{quoted_column(c)} <= {high}"
            for c, (low, high) in self.key_ranges().items()
        ]
        return " AND ".join([*join, *bounds])

    def key_ranges(self) -> dict[str, tuple[str, str]]:
        """Each key column's least and greatest value in the source, as SQL literals; only for integer and
        string columns, whose literals compare exactly (a float's or a timestamp's text might not)."""
        ranges = {}
        for column in self.key:
            values = self.source.column(column)
            if self.source.num_rows == 0 or not (_is_integer(values.type) or placeholders.is_text(values.type)):
                continue
            bounds = pa.compute.min_max(values)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is None or high is None:
                continue
            ranges[column] = (sql_literal(low), sql_literal(high))
        return ranges

    def updates(self) -> str:
        """When a matched row is replaced: always, or with order_by when the new value is not older (so the
        greatest wins across batches too; ties go to the later batch)."""
        return self._not_older(f"NOT s.{DELETED_COLUMN}")

    def deletions(self) -> str:
        """When a matched row is deleted: as `updates` (a Debezium delete has its position to order by)."""
        return self._not_older(f"s.{DELETED_COLUMN}")

    def _not_older(self, condition: str) -> str:
        if self.order_by is None:
            return condition
        column = quoted_column(self.order_by)
        return f"{condition} AND (t.{column} IS NULL OR s.{column} >= t.{column})"

    def stale(self) -> str:
        """Which target rows a snapshot's end deletes: its topic's rows older than it (it read every row that
        was still there)."""
        assert self.snapshot_ends, "a merge after a snapshot's end"
        position = quoted_column(DEBEZIUM_POSITION_COLUMN)
        return " OR ".join(
            f"(t.kafka_topic = {sql_literal(end.topic)} AND t.{position} < {sql_literal(end.position)})"
            for end in self.snapshot_ends
        )

    @property
    def deletes(self) -> int:
        return int(pa.compute.sum(self.source.column(DELETED_COLUMN)).as_py() or 0)


def _is_integer(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind))


def sql_literal(value: int | str) -> str:
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def quoted_column(column: str) -> str:
    """A SQL identifier for DataFusion, which would lower-case an unquoted one."""
    return '"' + column.replace('"', '""') + '"'


def read_staging(
    location: Location, files: Sequence[DataFile], partition_by: Sequence[str], types: pa.Schema
) -> pa.Table:
    """The batch's rows from its staging files, partition columns put back (a partitioned file holds
    them in its path only), in one schema (the files of tasks that saw different writer schemas differ)."""
    placed = [(f, {c: (f.partition_values or {}).get(c) for c in partition_by}) for f in files]
    tables = [read_with_partitions(location, f.path, values, types) for f, values in placed]
    if not tables:
        return pa.schema([*types, pa.field(DELETED_COLUMN, pa.bool_())]).empty_table()
    return pa.concat_tables(tables, promote_options="permissive")


LINEAGE = ("kafka_topic", "kafka_partition", "kafka_offset")  # where a record is: what orders a key's records


def after_last_truncate(rows: pa.Table, order_by: str | None, batch: int | None = None) -> tuple[pa.Table, bool]:
    """The rows after the batch's last TRUNCATE event (Debezium's op `t`), in their order, and whether it
    had one. A TRUNCATE orders against the other rows by `order_by` (the source position), then offset; without
    order_by only within its partition, so a batch of a TRUNCATE and rows of another partition is refused."""
    if rows.num_rows == 0 or DEBEZIUM_OP_COLUMN not in rows.column_names:
        return rows, False
    truncating = truncate_rows(rows)
    if not pa.compute.any(truncating).as_py():
        return rows, False
    import polars as pl

    frame = ordering_frame(rows, [], order_by).with_columns(pl.Series("_truncate", truncating))
    if order_by is None:
        places = frame.select("kafka_topic", "kafka_partition").unique(maintain_order=True)
        if places.height > 1:
            where = f"batch {batch}" if batch is not None else "the batch"
            first, other = places.row(0), places.row(1)
            raise UpsertKeyError(
                f"{where}: a TRUNCATE and records of {first[0]}[{first[1]}] and {other[0]}[{other[1]}]: Kafka orders "
                f"records within one partition only; set write.order_by to the source position (_debezium_position)"
            )
    ordered = frame.sort(winner_order(order_by), nulls_last=False, maintain_order=True)
    last = int(ordered.get_column("_truncate").arg_true()[-1])
    kept = ordered.slice(last + 1).filter(~pl.col("_truncate")).sort("_row")
    return rows.take(kept.get_column("_row").to_arrow()), True


@dataclass(frozen=True)
class SnapshotEnd:
    """The latest snapshot's end of one topic (one source table) among a batch's (or a range's) rows: its
    position, and where its marker is in Kafka."""

    position: int | str
    topic: str
    partition: int
    offset: int


def after_snapshot_end(rows: pa.Table) -> tuple[pa.Table, tuple[SnapshotEnd, ...]]:
    """The rows without the marker rows of a snapshot's end (formats/debezium.py), and per topic the latest
    such end (none: no snapshot ended in them). A topic is one source table: its snapshot says nothing of
    another topic's rows, in a table fed by several."""
    if rows.num_rows == 0 or DEBEZIUM_OP_COLUMN not in rows.column_names:
        return rows, ()
    ending = snapshot_end_rows(rows)
    if not pa.compute.any(ending).as_py():
        return rows, ()
    latest: dict[str, dict[str, Any]] = {}
    for m in rows.filter(ending).select([DEBEZIUM_POSITION_COLUMN, *LINEAGE]).to_pylist():
        now = latest.get(m["kafka_topic"])
        if now is None or (m[DEBEZIUM_POSITION_COLUMN], m["kafka_offset"]) > (
            now[DEBEZIUM_POSITION_COLUMN],
            now["kafka_offset"],
        ):
            latest[m["kafka_topic"]] = m
    ends = tuple(
        SnapshotEnd(m[DEBEZIUM_POSITION_COLUMN], m["kafka_topic"], m["kafka_partition"], m["kafka_offset"])
        for m in latest.values()
    )
    return rows.filter(pa.compute.invert(ending)), ends


def stale_as_deleted(winners: pa.Table | None, ends: tuple[SnapshotEnd, ...]) -> pa.Table | None:
    """`winners`, each one a snapshot that ended did not read (the row was gone at the source) marked as a
    delete: of the snapshot's topic, older than it, and not an event after the snapshot's end in its
    partition (a transaction that was open when the snapshot began has older positions, and comes after)."""
    if winners is None or not ends or winners.num_rows == 0:
        return winners
    compute = pa.compute
    deleted = winners.column(DELETED_COLUMN)
    for end in ends:
        topic = compute.equal(winners.column("kafka_topic"), end.topic)
        older = compute.less(winners.column(DEBEZIUM_POSITION_COLUMN), end.position)
        after_end = compute.and_(
            compute.equal(winners.column("kafka_partition"), end.partition),
            compute.greater(winners.column("kafka_offset"), end.offset),
        )
        stale = compute.and_(compute.and_(topic, older), compute.invert(after_end))
        deleted = compute.or_(deleted, compute.fill_null(stale, False))
    return winners.set_column(winners.schema.get_field_index(DELETED_COLUMN), DELETED_COLUMN, deleted)


def latest_per_key(
    rows: pa.Table, key: Sequence[str], order_by: str | None, batch: int | None = None, unavailable: str | None = None
) -> pa.Table:
    """One row per key: the winner as the module docstring says, in the rows' order; with `unavailable`,
    its unavailable text values first replaced by the latest earlier value of the key (`carry_values`)."""
    if rows.num_rows == 0:
        return rows
    frame = ordering_frame(rows, key, order_by)
    if order_by is None:
        _refuse_keys_in_two_partitions(frame, list(key), batch)
    if unavailable is not None:
        rows = carry_values(rows, frame, key, order_by, unavailable)
    return _winners(rows, frame, key, order_by)


def fold(
    rows: pa.Table | None, key: Sequence[str], order_by: str | None, unavailable: str | None = None
) -> tuple[pa.Table | None, set[str]]:
    """A whole range's fold (audit, repair): one row per key as `latest_per_key`, and the keys (as
    `key_text`) that without order_by arrive in two partitions: those have no order, and no winner."""
    if rows is None or rows.num_rows == 0:
        return rows, set()
    import polars as pl

    frame = ordering_frame(rows, key, order_by)
    if unavailable is not None:
        rows = carry_values(rows, frame, key, order_by, unavailable)
    unordered: set[str] = set()
    if order_by is None:
        places = frame.group_by(list(key)).agg(pl.struct("kafka_topic", "kafka_partition").n_unique().alias("n"))
        spread = places.filter(pl.col("n") > 1)
        unordered = {key_text(r, key) for r in spread.select(list(key)).to_dicts()}
        if spread.height:
            frame = frame.join(spread.select(list(key)), on=list(key), how="anti", nulls_equal=True)
    return _winners(rows, frame, key, order_by), unordered


def carry_values(
    rows: pa.Table, frame: pl.DataFrame, key: Sequence[str], order_by: str | None, unavailable: str
) -> pa.Table:
    """`rows`, each value that is the `unavailable` placeholder (protocol/unavailable.py) replaced by the
    same column's value in the latest earlier row of its key (in the order winners are chosen in) that has
    one; kept where none has (the MERGE then keeps the table's). A row inserted always carries every value,
    so the latest known value is the row's current one."""
    import polars as pl

    columns = placeholders.holding_columns(rows, key, unavailable)
    if not columns:
        return rows
    flags = {f"_unavailable{i}": placeholders.holds(rows.column(c), unavailable) for i, c in enumerate(columns)}
    ordered = frame.with_columns([pl.Series(name, flag) for name, flag in flags.items()]).sort(
        winner_order(order_by), nulls_last=False, maintain_order=True
    )
    sources = ordered.select(
        "_row",
        *(pl.when(~pl.col(name)).then(pl.col("_row")).forward_fill().over(list(key)).alias(name) for name in flags),
    ).sort("_row")
    for name, column in zip(flags, columns):
        source = sources.get_column(name).fill_null(sources.get_column("_row")).to_arrow()
        rows = rows.set_column(rows.schema.get_field_index(column), column, rows.column(column).take(source))
    return rows


def winner_order(order_by: str | None) -> list[str]:
    """What orders a key's rows, last wins: order_by (when set), then the offset."""
    return [*([order_by] if order_by else []), "kafka_offset"]


def ordering_frame(rows: pa.Table, key: Sequence[str], order_by: str | None) -> pl.DataFrame:
    """The columns that decide which row of a key wins, and each row's position (`_row`)."""
    import polars as pl  # here: only upsert mode needs it (grouping by any key type, structs included)

    columns = list(dict.fromkeys([*key, *LINEAGE, *([order_by] if order_by else [])]))
    frame = pl.from_arrow(rows.select(columns))
    assert isinstance(frame, pl.DataFrame)
    return frame.with_row_index("_row")


def _winners(rows: pa.Table, frame: pl.DataFrame, key: Sequence[str], order_by: str | None) -> pa.Table:
    """Per key of `frame`, the row with the greatest order_by (then offset), in the rows' order."""
    winners = frame.sort(winner_order(order_by), nulls_last=False).unique(subset=list(key), keep="last").sort("_row")
    return rows.take(winners.get_column("_row").to_arrow())


def key_text(row: dict[str, object], key: Sequence[str]) -> str:
    """A row's key as text, to compare and to show (a struct key is a dict)."""
    return json.dumps([row.get(c) for c in key], sort_keys=True, default=str)


def _refuse_keys_in_two_partitions(frame: pl.DataFrame, key: list[str], batch: int | None) -> None:
    import polars as pl

    spread = (
        frame.group_by(key, maintain_order=True)  # the first key the batch holds is the one named
        .agg(pl.struct("kafka_topic", "kafka_partition").unique().sort().alias("places"))
        .filter(pl.col("places").list.len() > 1)
    )
    if spread.height == 0:
        return
    first = spread.row(0, named=True)
    places = " and ".join(f"{p['kafka_topic']}[{p['kafka_partition']}]" for p in first["places"][:2])
    value = ", ".join(f"{c}={_shown(first[c])}" for c in key)
    where = f"batch {batch}" if batch is not None else "the batch"
    raise UpsertKeyError(
        f"{where}: key {value} arrives in {places} ({spread.height} such keys): Kafka orders a key within "
        f"one partition only; set write.order_by to a column whose greatest value wins (an event time, a "
        f"source LSN), or produce each key to one partition"
    )


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
