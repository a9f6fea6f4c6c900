"""A data file's Delta statistics (numRecords, minValues, maxValues, nullCount), gathered as its rows are
written a table at a time, so the driver never reads a file again to commit it.

Each table written adds its row and null counts and its columns' bounds. A string column's bounds come
from the Parquet footer once the file is closed: the writer has compared every value already, and
comparing them again took most of the time statistics took. A row group the writer kept no bounds for
(its smallest or largest value over the writer's 4 KiB limit) is covered by the rows themselves: a table
with a value over LONG_STRING_BYTES has that column's bounds computed as it is written.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STRING_STATS_MAX = 32  # longer strings get no min/max: a truncated max would be wrong for skipping
# Well under the writer's limit for the statistics it keeps (4 KiB): a table with no value this long has
# every row group's bounds in the footer.
LONG_STRING_BYTES = 1024


class FileStatistics:
    """The statistics of one file whose rows (of `schema`) are given to `add` in the order they are written,
    each table as one `write_table` of the file's Parquet writer."""

    def __init__(self, schema: pa.Schema, bounds_from_footer: bool = True) -> None:
        self._names = schema.names
        self._types = {f.name: f.type for f in schema}
        self._rows = 0
        self._nulls = dict.fromkeys(schema.names, 0)
        self._lows: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._highs: dict[str, list[Any]] = {name: [] for name in schema.names}
        # The string columns whose bounds the footer gives. A table with a nested column gets none from it:
        # its columns are not the footer's leaves one for one.
        nested = any(pa.types.is_nested(f.type) for f in schema)
        footer = bounds_from_footer and not nested
        self._from_footer = {f.name for f in schema if pa.types.is_string(f.type)} if footer else set()
        self._starts: list[int] = []  # the first row of each table added
        self._computed: list[set[str]] = []  # per table added: the footer's string columns bounded here

    @property
    def rows(self) -> int:
        return self._rows

    def add(self, rows: pa.Table) -> None:
        self._starts.append(self._rows)
        self._rows += rows.num_rows
        computed = set()
        for name in self._names:
            column = rows[name]
            self._nulls[name] += column.null_count
            if column.null_count == len(column) or not _has_bounds(column.type):
                continue
            if name in self._from_footer:
                if not _has_long_value(column):
                    continue
                computed.add(name)
            result = pc.min_max(column)
            self._lows[name].append(result["min"].as_py())
            self._highs[name].append(result["max"].as_py())
        self._computed.append(computed)

    def to_json(self, footer: pq.FileMetaData | None) -> str:
        """The statistics as Delta's add action holds them; `footer`: the file's, as its writer wrote it
        (None only for statistics made with bounds_from_footer False)."""
        written, unbounded = self._footer_bounds(footer)
        mins, maxs = {}, {}
        for name in self._names:
            lows = self._lows[name] + [low for low, _ in written.get(name, [])]
            highs = self._highs[name] + [high for _, high in written.get(name, [])]
            if name in unbounded or not lows:
                continue
            bounds = _delta_bounds(self._types[name], lows, highs)
            if bounds is not None:
                mins[name], maxs[name] = bounds
        return json.dumps(
            {"numRecords": self._rows, "minValues": mins, "maxValues": maxs, "nullCount": self._nulls},
            separators=(",", ":"),
        )

    def _footer_bounds(self, footer: pq.FileMetaData | None) -> tuple[dict[str, list[tuple[Any, Any]]], set[str]]:
        """Each footer string column's row groups' (min, max), and the columns that have a row group with
        values and no bounds from either side (none, unless the writer drops bounds below its stated limit:
        such a column gets none in the file's statistics, which is never wrong for skipping)."""
        written: dict[str, list[tuple[Any, Any]]] = {name: [] for name in self._from_footer}
        if not self._from_footer:
            return written, set()
        if footer is None:
            raise ValueError("a file's string bounds were left to its footer, and no footer was given")
        unbounded = set()
        for index, name in enumerate(self._names):
            if name not in self._from_footer:
                continue
            first_row = 0
            for group in range(footer.num_row_groups):
                row_group = footer.row_group(group)
                table = bisect.bisect_right(self._starts, first_row) - 1
                first_row += row_group.num_rows
                stats = row_group.column(index).statistics
                if stats is not None and stats.has_min_max:
                    written[name].append((stats.min, stats.max))
                elif (stats is None or stats.num_values > 0) and name not in self._computed[table]:
                    unbounded.add(name)
        return written, unbounded


def _has_bounds(t: pa.DataType) -> bool:
    """Binary and booleans get nullCount only."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_date(t)
    )


def _has_long_value(column: pa.ChunkedArray) -> bool:
    longest = pc.max(pc.binary_length(column)).as_py()
    return longest is not None and longest > LONG_STRING_BYTES


def _delta_bounds(t: pa.DataType, lows: list[Any], highs: list[Any]) -> tuple[Any, Any] | None:
    """The column's Delta min and max from the bounds of its parts, or None when Delta gets none for it."""
    if pa.types.is_floating(t):  # a part of NaN only says nothing (Arrow's min_max passes NaN by)
        lows = [v for v in lows if not math.isnan(v)] or [math.nan]
        highs = [v for v in highs if not math.isnan(v)] or [math.nan]
    low: Any = min(lows)
    high: Any = max(highs)
    if pa.types.is_floating(t) and not (math.isfinite(low) and math.isfinite(high)):
        return None
    if pa.types.is_string(t):
        if len(low) > STRING_STATS_MAX or len(high) > STRING_STATS_MAX:
            return None
        return low, high
    if pa.types.is_timestamp(t):
        # Delta stores millisecond precision: round the min down and the max up so skipping stays safe.
        low = low.replace(microsecond=low.microsecond // 1000 * 1000)
        if high.microsecond % 1000:
            high = high.replace(microsecond=high.microsecond // 1000 * 1000) + dt.timedelta(milliseconds=1)
        return _iso_ms(low), _iso_ms(high)
    if pa.types.is_date(t):
        return low.isoformat(), high.isoformat()
    return low, high


def _iso_ms(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def delta_stats(table: pa.Table, footer: pq.FileMetaData | None = None) -> str:
    """The statistics of a file holding `table`, written in one `write_table`; `footer`: that file's (None:
    every bound computed from the rows)."""
    statistics = FileStatistics(table.schema, bounds_from_footer=footer is not None)
    statistics.add(table)
    return statistics.to_json(footer)
