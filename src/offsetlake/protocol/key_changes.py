"""Primary-key changes in upsert mode: the values a key change's create event lacks, taken from the old
key's row.

Debezium turns `UPDATE ... SET id = ...` into a delete of the old key that names the new key (its
`__debezium.newkey` header, NEW_KEY_COLUMN in the staging rows) and a create of the new one that names the old
key (`__debezium.oldkey`, OLD_KEY_COLUMN); the create holds the placeholder for every TOASTed value the change
left alone. `carry_across_key_changes` takes those values from the old key's row: earlier in the batch, or in
the table (`keys_predicate` finds its rows). A batch may end between the two events, so the old key's delete
is applied by its create (`with_creates_deleting_old_keys`): the old row is still in the table for the create.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.config import DEBEZIUM_OP_COLUMN, DELETED_COLUMN, NEW_KEY_COLUMN, OLD_KEY_COLUMN
from offsetlake.formats.debezium import DELETE_OP
from offsetlake.protocol import unavailable as placeholders
from offsetlake.protocol.upsert import (
    LINEAGE,
    carry_values,
    ordering_frame,
    quoted_column,
    sql_literal,
    winner_order,
)


@dataclass(frozen=True)
class KeyChanges:
    """What `carry_across_key_changes` did with the values a primary-key change's create event lacked."""

    carried: int = 0  # taken from the old key's row, in the batch or in the table
    left_null: int = 0  # no row of the old key held them (it was never captured): null in the table


Key = tuple[Any, ...]  # a key's values, in write.key's order
# The table's rows of some keys: {key: row}.
OldRows = Callable[[Sequence[Key]], dict[Key, dict[str, Any]]]


def with_creates_deleting_old_keys(rows: pa.Table, key: Sequence[str], order_by: str | None, deletes: bool) -> pa.Table:
    """`rows` without NEW_KEY_COLUMN, each primary-key change's delete of the old key applied by its create, so
    that the old key's row is in the table when a batch ends between the two: a delete that names its new key
    and whose create is not among `rows` is dropped (the create's batch deletes the old key), and each create
    that names an old key deletes it, at the create's place in the order winners are chosen in (so a later row
    of the old key still wins). `deletes`: False under write.deletes ignore, where the old row stays. Only for
    keys of integer and string columns, whose values in a header and in a column compare exactly."""
    if NEW_KEY_COLUMN not in rows.column_names:
        return rows
    new_keys = rows.column(NEW_KEY_COLUMN).combine_chunks()
    rows = rows.drop_columns([NEW_KEY_COLUMN])
    kinds = _key_kinds(rows.schema, key)
    if not deletes or kinds is None or OLD_KEY_COLUMN not in rows.column_names or rows.num_rows == 0:
        return rows
    creates = _creates(rows, key, kinds)
    deleted = rows.column(DELETED_COLUMN).combine_chunks()
    moving = pc.and_(pc.is_valid(new_keys), pc.fill_null(deleted, False))
    named = set(creates.values())
    waiting = [  # a create that names this key as its old one will delete it: its header fits as this one does
        int(i)
        for i in pc.indices_nonzero(moving).to_pylist()
        if _fitting_key(new_keys[i].as_py(), key, kinds) is not None and _key_of(rows, key, i) not in named
    ]
    if waiting:
        rows = rows.filter(pa.array(~np.isin(np.arange(rows.num_rows), waiting)))
        creates = {i - int(np.searchsorted(waiting, i)): old for i, old in creates.items()}
    return pa.concat_tables([rows, _deletes_of(rows, key, order_by, creates)]) if creates else rows


def _key_kinds(schema: pa.Schema, key: Sequence[str]) -> list[type] | None:
    """The Python type (int or str) of each key column's values; None when a column is of another type."""
    types = [schema.field(c).type for c in key]
    if not all(pa.types.is_integer(t) or placeholders.is_text(t) for t in types):
        return None
    return [int if pa.types.is_integer(t) else str for t in types]


def _creates(rows: pa.Table, key: Sequence[str], kinds: Sequence[type]) -> dict[int, Key]:
    """{row: the old key it names} of the creates of primary-key changes whose old key fits the key's columns."""
    old_keys = rows.column(OLD_KEY_COLUMN).combine_chunks()
    creates = {}
    for i in pc.indices_nonzero(pc.is_valid(old_keys)).to_pylist():
        old = _fitting_key(old_keys[i].as_py(), key, kinds)
        if old is not None and old != _key_of(rows, key, i):
            creates[int(i)] = old
    return creates


def _fitting_key(header: bytes | None, key: Sequence[str], kinds: Sequence[type]) -> Key | None:
    """The key a header names when each of its values is of its column's kind (int or str), else None."""
    named = _old_key(header, key)
    return named if named is not None and all(type(v) is kind for v, kind in zip(named, kinds)) else None


def _key_of(rows: pa.Table, key: Sequence[str], i: int) -> Key:
    return tuple(rows.column(c)[i].as_py() for c in key)


def _deletes_of(rows: pa.Table, key: Sequence[str], order_by: str | None, olds: dict[int, Key]) -> pa.Table:
    """A delete of each key of `olds` ({row: key}) at its row's place (order_by and lineage); null elsewhere."""
    at = rows.take(pa.array(list(olds), pa.int64()))
    kept = {*LINEAGE, *([order_by] if order_by else [])}
    columns = []
    for field in rows.schema:
        if field.name in key:
            columns.append(pa.array([old[list(key).index(field.name)] for old in olds.values()], field.type))
        elif field.name == DELETED_COLUMN:
            columns.append(pa.repeat(True, len(olds)))
        elif field.name == DEBEZIUM_OP_COLUMN:
            columns.append(pa.array([DELETE_OP] * len(olds), field.type))
        elif field.name in kept:
            columns.append(at.column(field.name).combine_chunks())
        else:
            columns.append(pa.nulls(len(olds), field.type))
    return pa.Table.from_arrays(columns, schema=rows.schema)


def carry_across_key_changes(
    rows: pa.Table, key: Sequence[str], order_by: str | None, unavailable: str | None, old_rows: OldRows | None
) -> tuple[pa.Table, KeyChanges]:
    """`rows` without OLD_KEY_COLUMN, each unavailable value of a row that names an old key (a primary-key
    change's create: Debezium sends, for the new key, the placeholder for every TOASTed value the change left
    alone) replaced by that column's value in the old key's row as it stood before the change: its latest
    earlier row in the batch that has the value, else its row in the table (`old_rows`). Changes are followed
    in the order winners are chosen in, so a key changed twice in one batch takes its values from the first
    old key. Same-key carrying (`carry_values`) is done here too, before and after."""
    if OLD_KEY_COLUMN not in rows.column_names:
        return rows, KeyChanges()
    old_keys = rows.column(OLD_KEY_COLUMN).combine_chunks()
    rows = rows.drop_columns([OLD_KEY_COLUMN])
    if unavailable is None or rows.num_rows == 0 or old_keys.null_count == len(old_keys):
        return rows, KeyChanges()
    frame = ordering_frame(rows, key, order_by)
    rows = carry_values(rows, frame, key, order_by, unavailable)
    columns = placeholders.holding_columns(rows, key, unavailable)
    lacking = {c: placeholders.holds(rows.column(c), unavailable).to_numpy(zero_copy_only=False) for c in columns}
    named = pc.is_valid(old_keys).to_numpy(zero_copy_only=False)
    moved = [int(i) for i in np.flatnonzero(named) if any(lacking[c][i] for c in columns)]
    if not moved:
        return rows, KeyChanges()
    in_order = frame.sort(winner_order(order_by), nulls_last=False, maintain_order=True).get_column("_row").to_numpy()
    rank = np.empty(rows.num_rows, dtype=np.int64)
    rank[in_order] = np.arange(rows.num_rows)  # each row's place in the order winners are chosen in
    olds = {i: _old_key(old_keys[i].as_py(), key) for i in moved}
    named_keys = [k for k in olds.values() if k is not None]
    history = _rows_of_keys(rows, key, set(named_keys), rank)
    in_table: dict[Key, dict[str, Any]] | None = None  # read once, when the batch lacks an old row's value
    deleted = rows.column(DELETED_COLUMN).combine_chunks() if DELETED_COLUMN in rows.column_names else None
    found: dict[str, dict[int, object]] = {c: {} for c in columns}
    left = 0
    for target in sorted(moved, key=lambda i: rank[i]):
        old = olds[target]
        for column in (c for c in columns if lacking[c][target]):
            value, known = _value_before(rows, column, old, rank[target], rank, history, lacking, found, deleted)
            if not known and old is not None and old_rows is not None:
                in_table = old_rows(named_keys) if in_table is None else in_table
                before = in_table.get(old, {})
                if column in before and _older(before, rows, target, order_by):
                    value, known = before[column], True
            if known:
                found[column][target] = value
            else:
                left += 1
    for column, values in found.items():
        rows = _with_values(rows, column, values)
    rows = carry_values(rows, frame, key, order_by, unavailable)  # the new key's later rows take them too
    return rows, KeyChanges(sum(map(len, found.values())), left)


def _older(row: dict[str, Any], rows: pa.Table, target: int, order_by: str | None) -> bool:
    """Whether the table's `row` of an old key came before the change `rows[target]`: a row of the old key
    written after the change (inserted again, its create in a later batch) is not the one that moved."""
    if order_by is None:
        return True
    change, then = rows.column(order_by)[target].as_py(), row.get(order_by)
    return change is None or then is None or bool(then <= change)


def _old_key(header: bytes | None, key: Sequence[str]) -> Key | None:
    """The key a create's old-key header names, as a tuple in `key`'s order (None: unreadable, or not this
    pipeline's key). The header is JSON of the key's fields (with the JSON converter's schemas, its payload)."""
    try:
        fields = json.loads(header) if header is not None else None
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(fields, dict) and set(fields) == {"schema", "payload"}:
        fields = fields["payload"]
    if not isinstance(fields, dict) or any(c not in fields for c in key):
        return None
    return tuple(fields[c] for c in key)


def _rows_of_keys(rows: pa.Table, key: Sequence[str], keys: set[Key], rank: np.ndarray) -> dict[Key, list[int]]:
    """{key: its rows' indices, latest first} for the rows whose key is one of `keys`."""
    if not keys:
        return {}
    mask = None
    for j, column in enumerate(key):
        values = rows.column(column)
        try:
            wanted = pa.array([k[j] for k in keys], values.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # a header value this column cannot hold
            return {}
        hit = pc.fill_null(pc.is_in(values, value_set=wanted), False)
        mask = hit if mask is None else pc.and_(mask, hit)
    by_key: dict[Key, list[int]] = {}
    for i in pc.indices_nonzero(mask).to_pylist():
        by_key.setdefault(tuple(rows.column(c)[i].as_py() for c in key), []).append(i)
    for indices in by_key.values():
        indices.sort(key=lambda i: -rank[i])
    return by_key


def _value_before(
    rows: pa.Table,
    column: str,
    old: Key | None,
    before: int,
    rank: np.ndarray,
    history: dict[Key, list[int]],
    lacking: dict[str, np.ndarray],
    found: dict[str, dict[int, object]],
    deleted: pa.Array | None,
) -> tuple[object, bool]:
    """(value, whether known) of `column` in key `old`'s latest row ranked before `before` that holds it,
    counting the values found for earlier changes; a delete holds nothing (a key change's own delete of the
    old key comes just before its create)."""
    for i in history.get(old, []) if old is not None else []:
        if rank[i] >= before:
            continue
        if i in found[column]:
            return found[column][i], True
        if lacking[column][i] or (deleted is not None and deleted[i].as_py()):
            continue
        return rows.column(column)[i].as_py(), True
    return None, False


def _with_values(rows: pa.Table, column: str, values: dict[int, object]) -> pa.Table:
    """`rows` with `column`'s value at each index of `values` replaced."""
    if not values:
        return rows
    current = rows.column(column).combine_chunks()
    take = np.arange(rows.num_rows)
    take[list(values)] = rows.num_rows + np.arange(len(values))
    replaced = pa.concat_arrays([current, pa.array(list(values.values()), current.type)]).take(pa.array(take))
    return rows.set_column(rows.schema.get_field_index(column), rows.schema.field(column), replaced)


def keys_predicate(key: Sequence[str], keys: Sequence[Key]) -> str | None:
    """SQL that holds for the rows with one of `keys` (integer and string values only, whose literals compare
    exactly; keys of other values are left out). None: no key left."""
    chosen = [k for k in keys if all(type(v) in (int, str) for v in k)]
    if not chosen:
        return None
    matches = (" AND ".join(f"{quoted_column(c)} = {sql_literal(v)}" for c, v in zip(key, k)) for k in chosen)
    return " OR ".join(f"({match})" for match in matches)
