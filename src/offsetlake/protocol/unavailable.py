"""Debezium's placeholder for a value it does not have, in each column type it sends one in.

PostgreSQL leaves a large (TOASTed) value out of an update that does not change it, unless the table's
REPLICA IDENTITY is FULL; Debezium's PostgreSQL connector then sends its `unavailable.value.placeholder`
(`format.debezium.unavailable_value`), shaped to the column's type (its `UnchangedToastedPlaceholder`):

- text (and json, xml...): the placeholder itself;
- bytea: the placeholder's UTF-8 bytes;
- text[] (and varchar[]...): a one-element array holding it;
- integer[] and bigint[]: its bytes, one element each.

A column holding it keeps the row's current value (protocol/upsert.py); these are the one definition of
what "holding it" means, for the driver's fold (Arrow) and for the MERGE (SQL).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def placeholder(kind: pa.DataType, marker: str) -> object | None:
    """The value a column of type `kind` holds in place of a value the connector does not have; None for a
    type that never holds one (a number, a date: never TOASTed)."""
    if is_text(kind):
        return marker
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return marker.encode()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = kind.value_type
        if is_text(item):
            return [marker]
        if pa.types.is_int32(item) or pa.types.is_int64(item):
            return list(marker.encode())
    return None


def holding_columns(rows: pa.Table, key: Sequence[str], marker: str) -> list[str]:
    """The columns (never a key's) where some row holds the placeholder."""
    candidates = [f.name for f in rows.schema if f.name not in key and placeholder(f.type, marker) is not None]
    return [c for c in candidates if bool(pc.any(holds(rows.column(c), marker)).as_py())]


def holds(values: pa.ChunkedArray | pa.Array, marker: str) -> pa.Array:
    """Per value: whether it is the placeholder (null: False)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    wanted = placeholder(values.type, marker)
    if wanted is None:
        return pa.array(np.zeros(len(values), dtype=bool))
    if not isinstance(wanted, list):
        return pc.fill_null(pc.equal(values, pa.scalar(wanted, values.type)), False)
    # Arrow compares no lists: only those of the placeholder's length are looked at one by one.
    same_length = pc.fill_null(pc.equal(pc.list_value_length(values), len(wanted)), False)
    found = np.zeros(len(values), dtype=bool)
    candidates = pc.indices_nonzero(same_length)
    for i, value in zip(candidates.to_pylist(), values.take(candidates).to_pylist()):
        found[i] = value == wanted
    return pa.array(found)


def sql_literal(kind: pa.DataType, marker: str) -> str:
    """The placeholder of a column of type `kind` as a DataFusion literal, to compare a MERGE source with."""
    wanted = placeholder(kind, marker)
    if isinstance(wanted, str):
        return "'" + wanted.replace("'", "''") + "'"
    if isinstance(wanted, bytes):
        return f"X'{wanted.hex()}'"
    if isinstance(wanted, list) and is_text(kind.value_type):
        return "make_array('" + marker.replace("'", "''") + "')"
    if isinstance(wanted, list):
        arrow = "Int32" if pa.types.is_int32(kind.value_type) else "Int64"
        return "make_array(" + ", ".join(f"arrow_cast({b}, '{arrow}')" for b in wanted) + ")"
    raise ValueError(f"a column of type {kind} never holds the unavailable value")


def is_text(kind: pa.DataType) -> bool:
    """A string column, in any of Arrow's layouts."""
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))
