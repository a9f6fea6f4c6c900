"""Debezium change events (`format.envelope: debezium`): the row a change event carries, its op and position.

A Debezium event is an envelope `{before, after, source, op, ts_ms, transaction}` (in JSON, with
`schemas.enable` also wrapped as `{schema, payload}`). Ops `c` (insert), `r` (a snapshot read) and `u`
(update) carry the row in `after`; `d` carries the deleted row in `before` (with PostgreSQL's default
replica identity only its key columns, which is all a delete needs). The tombstone Debezium writes after a
`d` (for log compaction) is skipped by `records.convert`: the `d` did the delete, and on a compacted topic
where the `d` is gone every older record of its key is gone with it. `t` (truncate) empties the table
(`format.debezium.truncate: apply`, the default: records.py keeps it as a row of op `t`, protocol/upsert.py
applies it) or is quarantined; `m` (message) events change no row of the table: they are quarantined,
saying so, so that nobody mistakes them for applied. The source position (`source.lsn`, `source.pos`...:
`format.debezium.position`) is kept as column `_debezium_position`, so `write.order_by` can order one key's
events across partitions.

A snapshot read that ends its table's snapshot (`source.snapshot` `last_in_data_collection`, or `last`)
also gives a marker row (op `snapshot_end`, its position; `format.debezium.snapshot: replace`): every row
of the table older than that snapshot and not read by it is gone from the source (a connector that lost
its offsets takes a new snapshot, and sends no delete for a row deleted meanwhile), so protocol/upsert.py
deletes it. Every snapshot read carries the position the snapshot was taken at.

Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import base64
import binascii
import json

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.config import DEBEZIUM_COLUMNS, DEBEZIUM_OP_COLUMN, DEBEZIUM_POSITION_COLUMN
from offsetlake.formats.arrays import one_array
from offsetlake.formats.values import coerce, from_unscaled

ROW_OPS = ("c", "r", "u")
DELETE_OP = "d"
TRUNCATE_OP = "t"
SNAPSHOT_END_OP = "snapshot_end"  # never Debezium's: a marker row of ours, never written
SNAPSHOT_ENDS = ("last_in_data_collection", "last")  # source.snapshot of a table's last snapshot read
OPS = (*ROW_OPS, DELETE_OP)
ENVELOPE_FIELDS = ("before", "after", "source", "op")
# On a primary-key change Debezium sends a delete of the old key and a create of the new one; the create
# names the old key in this header, the delete the new key in the other (the key's fields as JSON text, Kafka
# Connect's SimpleHeaderConverter).
OLD_KEY_HEADER = "__debezium.oldkey"
NEW_KEY_HEADER = "__debezium.newkey"


class NotAChangeEvent(ValueError):
    """The value is not a Debezium change event of a row (the message says why, in one line)."""


def _op_error(op: object) -> NotAChangeEvent:
    if op == "t":
        return NotAChangeEvent("debezium: op 't' (a truncate) changes no row; truncate the table by hand if meant")
    if op == "m":
        return NotAChangeEvent("debezium: op 'm' (a logical decoding message) changes no row")
    return NotAChangeEvent(f"debezium: op {op!r} is not one of {', '.join(OPS)}")


def json_event(
    raw: bytes, position: str, position_type: str, truncates: bool = False, scaled_bytes: dict[str, int] | None = None
) -> tuple[str, bytes, object, bool]:
    """(op, the row as JSON, the source position, whether it ends its table's snapshot) of one JSON change
    event. `truncates`: a TRUNCATE is an event too (op `t`, an empty row). `scaled_bytes` ({field: scale}):
    decimals the connector sent as base64 of their unscaled bytes (`decimal.handling.mode=precise` without
    schemas), given back as decimal text."""
    try:
        event = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise NotAChangeEvent(f"value is not valid JSON ({err})") from err
    if isinstance(event, dict) and set(event) == {"schema", "payload"}:  # the JSON converter's schemas.enable
        event = event["payload"]
    if not isinstance(event, dict) or "op" not in event:
        raise NotAChangeEvent("debezium: value is not a change event (an object with 'op')")
    op = event["op"]
    if op not in OPS and not (truncates and op == TRUNCATE_OP):
        raise _op_error(op)
    side = "before" if op == DELETE_OP else "after"
    row = {} if op == TRUNCATE_OP else event.get(side)
    if not isinstance(row, dict):
        raise NotAChangeEvent(f"debezium: op {op!r} without an object in '{side}'")
    source = event.get("source")
    if not isinstance(source, dict) or position not in source:
        raise NotAChangeEvent(f"debezium: source has no field {position!r} (format.debezium.position)")
    try:
        at = None if source[position] is None else coerce(source[position], position_type)
    except (TypeError, ValueError, OverflowError) as err:
        raise NotAChangeEvent(f"debezium: source.{position}: {err}") from err
    for name, scale in (scaled_bytes or {}).items():
        if row.get(name) is not None:
            row[name] = _scaled_text(row[name], name, scale)
    return op, msgspec.json.encode(row), at, op == "r" and source.get("snapshot") in SNAPSHOT_ENDS


def _scaled_text(value: object, name: str, scale: int) -> str:
    """A decimal Kafka Connect's JSON converter wrote as bytes (base64 of the unscaled value, big-endian two's
    complement) as decimal text at `scale`."""
    try:
        if not isinstance(value, str):
            raise ValueError
        unscaled = int.from_bytes(base64.b64decode(value, validate=True), "big", signed=True)
    except (ValueError, binascii.Error) as err:
        raise NotAChangeEvent(
            f"debezium: field {name!r} is not base64 of a decimal's unscaled bytes "
            "(format.debezium.decimal_handling_mode: precise)"
        ) from err
    return str(from_unscaled(unscaled, scale))


def envelope_type(current: list[pa.Field], position: str) -> pa.DataType:
    """The type a table with `current` payload columns reads change events as: the row in `before` and
    `after`, the position in `source`; what writers add merges in (evolution.merge_type)."""
    row = pa.struct([f for f in current if f.name not in DEBEZIUM_COLUMNS])
    fields = [pa.field("before", row), pa.field("after", row)]
    at = next((f for f in current if f.name == DEBEZIUM_POSITION_COLUMN), None)
    if at is not None:
        fields.append(pa.field("source", pa.struct([pa.field(position, at.type)])))
    return pa.struct(fields)


def table_columns(event: pa.DataType, position: str) -> list[pa.Field]:
    """A table's payload columns for events of type `event`: the row's, then op and position."""
    if any(event.get_field_index(name) < 0 for name in ENVELOPE_FIELDS):
        missing = [name for name in ENVELOPE_FIELDS if event.get_field_index(name) < 0]
        raise NotAChangeEvent(f"debezium: the registry's schema is not a change event (no {missing[0]!r})")
    row = event.field("after").type
    source = event.field("source").type
    if not pa.types.is_struct(source) or source.get_field_index(position) < 0:
        raise NotAChangeEvent(f"debezium: the registry's source has no field {position!r} (format.debezium.position)")
    return [
        *(row.field(i).with_nullable(True) for i in range(row.num_fields)),
        pa.field(DEBEZIUM_OP_COLUMN, pa.string()),
        pa.field(DEBEZIUM_POSITION_COLUMN, source.field(position).type),
    ]


def unwrap(events: pa.Table, position: str, truncates: bool = False) -> tuple[pa.Table, dict[int, str], list[int]]:
    """Decoded change events (columns before, after, source, op...) as rows with op and position columns,
    {row: why} for the events that are not a row's change (their rows are left in, to be dropped), and the
    rows that end their table's snapshot. `truncates`: a TRUNCATE is an event too (op `t`, its row all
    null). Raises NotAChangeEvent when the events' schema is not Debezium's."""
    columns = table_columns(pa.struct(list(events.schema)), position)
    op = one_array(events.column("op"))
    deleting = pc.fill_null(pc.equal(op, DELETE_OP), False)
    row_type = events.schema.field("after").type
    before = one_array(events.column("before")).cast(row_type)
    after = one_array(events.column("after"))
    row = pc.if_else(deleting, before, after)
    at = one_array(events.column("source"))
    at = pc.struct_field(at, position)
    errors = {}
    for i, (o, present) in enumerate(zip(op.to_pylist(), pc.is_valid(row).to_pylist())):
        if o == TRUNCATE_OP and truncates:
            continue
        if o not in OPS:
            errors[i] = str(_op_error(o))
        elif not present:
            errors[i] = f"debezium: op {o!r} without a row in '{'before' if o == DELETE_OP else 'after'}'"
    rows = pa.Table.from_struct_array(row) if len(row) else pa.schema(list(row_type)).empty_table()
    rows = rows.append_column(columns[-2], op.cast(pa.string())).append_column(columns[-1], at)
    return rows.cast(pa.schema(columns)), errors, _snapshot_ends(one_array(events.column("source")), op)


def _snapshot_ends(source: pa.Array, op: pa.Array) -> list[int]:
    """The events that end their table's snapshot: a read whose source.snapshot says so (a writer schema
    without the field, or an old one where it is a boolean, ends none)."""
    kind = source.type
    if kind.get_field_index("snapshot") < 0 or not pa.types.is_string(kind.field("snapshot").type):
        return []
    ending = pc.and_(pc.equal(op, "r"), pc.is_in(pc.struct_field(source, "snapshot"), pa.array(SNAPSHOT_ENDS)))
    return pc.indices_nonzero(pc.fill_null(ending, False)).to_pylist()


def _rows_of(rows: pa.Table, op: str) -> pa.Array:
    """Which rows have op `op`."""
    return pc.fill_null(pc.equal(rows.column(DEBEZIUM_OP_COLUMN), op), False).combine_chunks()


def truncate_rows(rows: pa.Table) -> pa.Array:
    """Which rows are TRUNCATE events."""
    return _rows_of(rows, TRUNCATE_OP)


def snapshot_end_rows(rows: pa.Table) -> pa.Array:
    """Which rows are the marker of a table's snapshot end."""
    return _rows_of(rows, SNAPSHOT_END_OP)


def marker_rows(rows: pa.Table) -> pa.Array:
    """Which rows are no row of the table, but a TRUNCATE or a snapshot's end."""
    return pc.or_(truncate_rows(rows), snapshot_end_rows(rows))


def deletes(rows: pa.Table) -> pa.Array:
    """Which rows are deletes."""
    return _rows_of(rows, DELETE_OP)
