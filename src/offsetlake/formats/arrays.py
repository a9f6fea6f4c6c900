"""Arrow columns as one array each, without a copy where a column already is one array."""

from __future__ import annotations

import pyarrow as pa


def one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`column` as one array: its only chunk as it is (`combine_chunks` copies even that one, and a batch's
    values are most of its bytes), or its chunks joined."""
    if isinstance(column, pa.Array):
        return column
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks()
