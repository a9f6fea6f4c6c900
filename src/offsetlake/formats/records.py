"""Record formats: turn Kafka messages (Arrow) into table rows, and bad records into quarantine rows.

`raw` keeps key and value as bytes. `json` parses the value by the declared
schema. `avro`, `protobuf` and `json_schema` read the Confluent wire format
through the Schema Registry (`registry.py`); their payload columns are the table's
plus any a newer writer schema adds (`evolution.py`). The key (`format.key`) and
the headers (`format.include_headers`) become columns in every format. A record
that does not parse or does not fit becomes a quarantine row (raw bytes, offsets,
error) instead of stopping the batch.
Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from offsetlake.config import (
    DEBEZIUM_OP_COLUMN,
    DEBEZIUM_POSITION_COLUMN,
    DELETED_COLUMN,
    HEADERS_COLUMN,
    KEY_COLUMN,
    LINEAGE_COLUMNS,
    NEW_KEY_COLUMN,
    OLD_KEY_COLUMN,
    REGISTRY_FORMATS,
    PipelineConfig,
)
from offsetlake.config.columns import decimal_type
from offsetlake.formats import debezium, declared_json
from offsetlake.formats.columns import (
    HEADERS_TYPE,
    LINEAGE_SCHEMA,
    QUARANTINE_HEADERS,
    QUARANTINE_SCHEMA,
    fixed_key_type,
    quarantine_schema,
    struct_fields,
    table_schema,
)
from offsetlake.formats.declared_json import ARROW_TYPES, int64_scalar
from offsetlake.formats.wire_values import decode_values, registry_decoders


def _lineage(messages: pa.Table) -> list[pa.ChunkedArray]:
    return [messages.column(name).cast(LINEAGE_SCHEMA.field(name).type) for name in LINEAGE_COLUMNS]


def reads_headers(cfg: PipelineConfig) -> bool:
    """Whether the records' headers are read: to keep them (format.include_headers), or for the old key that a
    primary-key change's create names (Debezium upserts: `carries_old_keys`)."""
    return cfg.format.include_headers or carries_old_keys(cfg)


def carries_old_keys(cfg: PipelineConfig) -> bool:
    """Debezium change events (always upserts): the rows carry the keys a primary-key change names (each
    create's old key, OLD_KEY_COLUMN; each delete's new key, NEW_KEY_COLUMN)."""
    return cfg.format.debezium_envelope


def convert(cfg: PipelineConfig, messages: pa.Table, columns: pa.Schema | None = None) -> tuple[pa.Table, pa.Table]:
    """Return (rows for the table, rows for the quarantine). `columns`: the table's schema now (registry
    formats: the rows may add columns to it, see evolution.py; None: the pipeline's `table_schema`)."""
    messages = _with_key_changes(cfg, messages)
    messages, oversized = _split_oversized(messages, cfg.format.max_value_bytes)
    key_values, key_type, bad_keys = _convert_keys(cfg, messages, columns)
    quarantines = []
    if bad_keys:
        rows, errors = zip(*sorted(bad_keys.items()))
        quarantines.append(_quarantine_rows(messages.take(pa.array(rows, pa.int64())), list(errors)))
        keep = pa.array([i for i in range(messages.num_rows) if i not in bad_keys], pa.int64())
        messages, key_values = messages.take(keep), key_values.take(keep)
    tombstones = None
    # An upsert's tombstones stay among the messages for a registry format, whose decoder passes them by:
    # no copy of every other value.
    tombstones_in = cfg.write.upsert and cfg.format.type not in ("raw", "json")
    if cfg.write.upsert and cfg.format.type != "raw":  # raw keeps a null value as it is: marked below
        messages, key_values, tombstones = _split_tombstones(messages, key_values, keep_all=tombstones_in)
        if cfg.write.deletes == "ignore" or cfg.format.debezium_envelope:  # debezium: the `d` before it deleted
            tombstones = None
    if cfg.format.type == "raw":
        payload, good = pa.table({"key": messages.column("key"), "value": messages.column("value")}), None
    elif cfg.format.type == "json" and cfg.format.debezium_envelope:
        payload, good, bad = _convert_debezium_json(cfg, messages)
        quarantines.append(bad)
    elif cfg.format.type == "json":
        payload, good, bad = _convert_json(cfg, messages)
        quarantines.append(bad)
    else:
        payload, good, bad = _convert_registry(cfg, messages, columns, tombstones_in)
        quarantines.append(bad)
    if cfg.format.debezium_envelope and cfg.write.deletes == "ignore":
        payload, good = _without_deletes(payload, good, messages.num_rows)
    # The records of the rows: their lineage, headers and key changes; their key and value bytes (most of a
    # record) are taken only for a quarantine (`whole`).
    kept = messages if good is None else messages.drop_columns(["key", "value"]).take(good)
    whole = _given(messages) if good is None else lambda: messages.take(good)
    extra = []
    if key_type is not None:
        extra.append((pa.field(KEY_COLUMN, key_type), key_values if good is None else key_values.take(good)))
    if cfg.format.include_headers:
        extra.append((pa.field(HEADERS_COLUMN, HEADERS_TYPE), kept.column("headers")))
    for column in (OLD_KEY_COLUMN, NEW_KEY_COLUMN):
        if column in kept.column_names:
            extra.append((pa.field(column, pa.binary()), kept.column(column)))
    fields = [*payload.schema, *(f for f, _ in extra), *LINEAGE_SCHEMA]
    table = pa.Table.from_arrays([*payload.columns, *(a for _, a in extra), *_lineage(kept)], schema=pa.schema(fields))
    if cfg.write.upsert:
        table, no_key = _upsert_rows(cfg, table, tombstones, whole)
        quarantines.append(no_key)
    if oversized is not None:
        quarantines.append(oversized)
    quarantine = pa.concat_tables(quarantines) if quarantines else quarantine_schema(cfg).empty_table()
    if len(quarantines) > 1:
        quarantine = quarantine.sort_by([("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
    return table, quarantine


def _with_key_changes(cfg: PipelineConfig, messages: pa.Table) -> pa.Table:
    """Debezium upserts: each record's old-key header (debezium.OLD_KEY_HEADER, its last) as OLD_KEY_COLUMN
    and its new-key header as NEW_KEY_COLUMN, null where it has none; the headers column goes on only when the
    pipeline keeps headers."""
    if not carries_old_keys(cfg) or "headers" not in messages.column_names:
        return messages
    headers = messages.column("headers")
    for column, header in ((OLD_KEY_COLUMN, debezium.OLD_KEY_HEADER), (NEW_KEY_COLUMN, debezium.NEW_KEY_HEADER)):
        named = pc.map_lookup(headers, pa.scalar(header, pa.string()), "last")
        messages = messages.append_column(pa.field(column, pa.binary()), named)
    return messages if cfg.format.include_headers else messages.drop_columns(["headers"])


def _split_tombstones(messages: pa.Table, key_values, keep_all: bool = False):
    """(messages with a value, or all of them if `keep_all`; their keys; (tombstone messages, their keys) or
    None)."""
    null = pc.is_null(messages.column("value"))
    if not pc.any(null).as_py():
        return messages, key_values, None
    live = pc.invert(null)
    keys = (lambda m: None) if key_values is None else key_values.filter
    tombstones = (messages.filter(null), keys(null))
    if keep_all:
        return messages, key_values, tombstones
    return messages.filter(live), keys(live), tombstones


def _upsert_rows(
    cfg: PipelineConfig, rows: pa.Table, tombstones, whole: Callable[[], pa.Table]
) -> tuple[pa.Table, pa.Table]:
    """Upsert mode: the rows with DELETED_COLUMN (a tombstone: its key, its lineage, no payload), and the
    quarantine rows of records whose key has a null column (they could never be found again). `whole()`: the
    rows' records, key and value bytes included (taken only for that quarantine)."""
    if rows.num_rows == 0 and tombstones is None:  # (connect_json: maybe no payload column yet, not even the key)
        return rows.append_column(pa.field(DELETED_COLUMN, pa.bool_()), pa.array([], pa.bool_())), _no_rows(cfg)
    deleted = pa.repeat(False, rows.num_rows)
    if cfg.format.debezium_envelope:
        deleted = debezium.deletes(rows)
    elif cfg.format.type == "raw" and cfg.write.deletes == "tombstone":
        deleted = pc.is_null(rows.column("value")).combine_chunks()
    elif cfg.format.type == "raw":  # deletes: ignore
        live = pc.is_valid(rows.column("value"))
        rows, whole = rows.filter(live), _given(whole().filter(live))
        deleted = pa.repeat(False, rows.num_rows)
    if tombstones is not None:
        messages, key_values = tombstones
        columns = [
            key_values
            if f.name == KEY_COLUMN
            else messages.column(f.name).cast(f.type)
            if f.name in LINEAGE_COLUMNS
            else pa.nulls(messages.num_rows, f.type)
            for f in rows.schema
        ]
        rows = pa.concat_tables([rows, pa.Table.from_arrays(columns, schema=rows.schema)])
        earlier = whole
        whole = lambda: pa.concat_tables([earlier(), messages])  # noqa: E731
        deleted = pa.concat_arrays([deleted, pa.repeat(True, messages.num_rows)])
    rows = rows.append_column(pa.field(DELETED_COLUMN, pa.bool_()), deleted)
    required = cfg.write.required
    no_key = functools.reduce(pc.or_, [pc.is_null(rows.column(c)) for c in required])
    if cfg.format.debezium_envelope:  # a TRUNCATE or a snapshot's end has no key: it is for every key
        no_key = pc.and_(no_key, pc.invert(debezium.marker_rows(rows)))
    if not pc.any(no_key).as_py():
        return rows, _no_rows(cfg)
    bad = rows.filter(no_key)
    nulls = {c: pc.is_null(bad.column(c)).to_pylist() for c in required}

    def error(i: int) -> str:
        column = next(c for c in required if nulls[c][i])
        return f"write.{'key' if column in cfg.write.key else 'order_by'} column {column!r} is null"

    return rows.filter(pc.invert(no_key)), _quarantine_rows(
        whole().filter(no_key), [error(i) for i in range(bad.num_rows)]
    )


def _given(table: pa.Table) -> Callable[[], pa.Table]:
    return lambda: table


def _truncates(cfg: PipelineConfig) -> bool:
    """TRUNCATE events are rows (op `t`) for the driver to apply, not quarantined."""
    return cfg.format.debezium_envelope and cfg.format.debezium.truncate == "apply"


def _no_rows(cfg: PipelineConfig) -> pa.Table:
    return quarantine_schema(cfg).empty_table()


def _without_deletes(payload: pa.Table, good: pa.Array | None, n: int) -> tuple[pa.Table, pa.Array]:
    """`write.deletes: ignore` with Debezium: the `d` events' rows dropped (neither applied nor quarantined)."""
    keep = pc.invert(debezium.deletes(payload))
    positions = pa.array(np.arange(n), pa.int64()) if good is None else good
    return payload.filter(keep), positions.filter(keep)


def _convert_debezium_json(cfg: PipelineConfig, messages: pa.Table) -> tuple[pa.Table, pa.Array | None, pa.Table]:
    """JSON change events: each event's row goes through the declared schema as a plain JSON value would
    (`_convert_json`), its op and position become columns; a quarantined event keeps its own value."""
    settings = cfg.format.debezium
    scaled_bytes = None
    if settings.decimal_handling_mode == "precise":
        declared = {f.name: decimal_type(f.type) for f in cfg.format.schema_}
        scaled_bytes = {name: d[1] for name, d in declared.items() if d is not None}
    positions, rows, ops, at, errors = [], [], [], [], {}
    # (message, source position) of each TRUNCATE (no row to decode) and each snapshot end (a row besides)
    truncating: list[tuple[int, object]] = []
    ending: list[tuple[int, object]] = []
    for i, raw in enumerate(messages.column("value").to_pylist()):
        try:
            op, row, where, ends_snapshot = debezium.json_event(
                raw, settings.position, settings.position_type, _truncates(cfg), scaled_bytes
            )
        except debezium.NotAChangeEvent as err:
            errors[i] = str(err)
            continue
        if op == debezium.TRUNCATE_OP:
            truncating.append((i, where))
            continue
        if ends_snapshot and settings.replaces_on_snapshot:
            ending.append((i, where))
        positions.append(i)
        rows.append(row)
        ops.append(op)
        at.append(where)
    events = messages.take(pa.array(positions, pa.int64()))
    events = events.set_column(events.schema.get_field_index("value"), "value", pa.array(rows, pa.binary()))
    payload, good, bad = _convert_json(cfg, events)
    op_column = pa.array(ops, pa.string())
    at_column = pa.array(at, ARROW_TYPES[settings.position_type])
    if good is not None:
        op_column, at_column = op_column.take(good), at_column.take(good)
        bad_rows = sorted(set(range(events.num_rows)) - set(good.to_pylist()))
        errors.update({positions[j]: e for j, e in zip(bad_rows, bad.column("error").to_pylist())})
    payload = payload.append_column(pa.field(DEBEZIUM_OP_COLUMN, pa.string()), op_column)
    payload = payload.append_column(pa.field(DEBEZIUM_POSITION_COLUMN, at_column.type), at_column)
    kept = pa.array(positions, pa.int64()) if good is None else pa.array(positions, pa.int64()).take(good)
    for op, marked in ((debezium.TRUNCATE_OP, truncating), (debezium.SNAPSHOT_END_OP, ending)):
        if marked:
            where, sources = zip(*marked)
            payload, kept = _with_markers(payload, kept, op, list(where), pa.array(sources))
    bad_positions = sorted(errors)
    quarantine = _quarantine_rows(
        messages.take(pa.array(bad_positions, pa.int64())), [errors[i] for i in bad_positions]
    )
    return payload, (None if not errors and not truncating and not ending else kept), quarantine


def _with_markers(
    payload: pa.Table, kept: pa.Array, op: str, where: list[int], sources: pa.Array
) -> tuple[pa.Table, pa.Array]:
    """`payload` and its message positions `kept`, with a marker row (op `op`, all null but op and source
    position) per message in `where` after the others' (a TRUNCATE, a snapshot's end: the positions say
    where they fall)."""
    marks = {DEBEZIUM_OP_COLUMN: pa.repeat(op, len(where)), DEBEZIUM_POSITION_COLUMN: sources}
    columns = [marks[f.name].cast(f.type) if f.name in marks else pa.nulls(len(where), f.type) for f in payload.schema]
    payload = pa.concat_tables([payload, pa.Table.from_arrays(columns, schema=payload.schema)])
    return payload, pa.concat_arrays([kept, pa.array(where, pa.int64())])


def _split_oversized(messages: pa.Table, limit: int) -> tuple[pa.Table, pa.Table | None]:
    """Values above `limit` bytes are quarantined whole: a table row that size hurts every reader."""
    sizes = pc.binary_length(messages.column("value")).fill_null(0)
    too_big = pc.greater(sizes, int64_scalar(limit))
    if not pc.any(too_big).as_py():
        return messages, None
    errors = [f"value is {n} bytes, above format.max_value_bytes ({limit})" for n in sizes.filter(too_big).to_pylist()]
    return messages.filter(pc.invert(too_big)), _quarantine_rows(messages.filter(too_big), errors)


def _quarantine_rows(bad: pa.Table, errors: list[str]) -> pa.Table:
    """Quarantine rows: the records' lineage, raw key and value bytes, why, and their headers if read."""
    arrays = [*_lineage(bad), bad.column("key"), bad.column("value"), pa.array(errors, pa.string())]
    if "headers" not in bad.column_names:
        return pa.Table.from_arrays(arrays, schema=QUARANTINE_SCHEMA)
    return pa.Table.from_arrays([*arrays, bad.column("headers")], schema=QUARANTINE_SCHEMA.append(QUARANTINE_HEADERS))


def _convert_json(cfg: PipelineConfig, messages: pa.Table) -> tuple[pa.Table, pa.Array | None, pa.Table]:
    """(payload columns of the good records, their positions in `messages` (None: all), quarantine rows)."""
    parsed = declared_json.parse_values(cfg, messages)
    bad = messages.take(pa.array(parsed.bad, pa.int64()))
    return parsed.payload, parsed.good, _quarantine_rows(bad, parsed.errors)


# ---- registry formats ---------------------------------------------------------------------------


def _convert_registry(cfg: PipelineConfig, messages: pa.Table, columns: pa.Schema | None, tombstones_in: bool):
    """Avro, Protobuf, JSON Schema and Connect JSON values: the payload columns are the table's plus what
    writers add. `tombstones_in`: null values are tombstones, passed by (no row, no error). Returns (payload
    columns, their positions in `messages` (None: all, in order), quarantine rows)."""
    decoders = registry_decoders(cfg)
    fixed = {KEY_COLUMN, HEADERS_COLUMN, *LINEAGE_COLUMNS}
    current = [f for f in (columns if columns is not None else table_schema(cfg)) if f.name not in fixed]
    envelope = cfg.format.debezium_envelope
    position = cfg.format.debezium.position
    table_type = debezium.envelope_type(current, position) if envelope else pa.struct(current)
    raw = messages.column("value")
    values, merged, errors = decode_values(decoders, raw, table_type, "value", nulls_allowed=tombstones_in)
    decoded = pc.is_valid(raw).to_numpy(zero_copy_only=False).copy() if tombstones_in else np.ones(len(raw), bool)
    decoded[list(errors)] = False
    rows = pa.array(np.nonzero(decoded)[0], pa.int64())
    good = values if len(rows) == len(values) else values.take(rows)
    payload = pa.Table.from_struct_array(good) if len(rows) else pa.schema(struct_fields(merged)).empty_table()
    payload = payload.cast(pa.schema(struct_fields(merged)))
    if envelope:
        payload, rows = _unwrap_events(payload, rows, errors, position, current, cfg)
    bad = sorted(errors)
    # Without a quarantined record, no take: a take of a table copies every chunk of each column into one.
    bad_messages = messages.take(pa.array(bad, pa.int64())) if bad else messages.slice(0, 0)
    quarantine = _quarantine_rows(bad_messages, [errors[i] for i in bad])
    return payload, None if len(rows) == messages.num_rows and not envelope else rows, quarantine


def _unwrap_events(
    events: pa.Table, rows: pa.Array, errors: dict[int, str], position: str, current: list[pa.Field], cfg
):
    """Registry change events as rows (`debezium.unwrap`), with a marker row for each snapshot's end; the
    positions of events that are no row's change join `errors`."""
    try:
        payload, not_rows, ending = debezium.unwrap(events, position, _truncates(cfg))
    except debezium.NotAChangeEvent as err:
        errors.update(dict.fromkeys(rows.to_pylist(), str(err)))
        return pa.schema(current).empty_table(), pa.array([], pa.int64())
    ending = [j for j in ending if j not in not_rows]
    if ending and cfg.format.debezium.replaces_on_snapshot:
        events_ending = pa.array(ending, pa.int64())
        sources = payload.column(DEBEZIUM_POSITION_COLUMN).combine_chunks().take(events_ending)
        where = rows.take(events_ending).to_pylist()
        payload, rows = _with_markers(payload, rows, debezium.SNAPSHOT_END_OP, where, sources)
    if not not_rows:
        return payload, rows
    positions = rows.to_pylist()
    errors.update({positions[j]: why for j, why in not_rows.items()})
    keep = pa.array([j for j in range(len(positions)) if j not in not_rows], pa.int64())
    return payload.take(keep), rows.take(keep)


def _convert_keys(cfg: PipelineConfig, messages: pa.Table, columns: pa.Schema | None):
    """(the kafka_key column, its type, {position: error}); (None, None, {}) without format.key."""
    key = cfg.format.key
    if key is None:
        return None, None, {}
    if key.type in REGISTRY_FORMATS:
        table_type = columns.field(KEY_COLUMN).type if columns is not None and KEY_COLUMN in columns.names else None
        # No table type and no key seen: a null column of binary, the most neutral type.
        return decode_values(
            registry_decoders(cfg, key=True), messages.column("key"), table_type, "key", nulls_allowed=True
        )
    if key.type == "raw":
        return messages.column("key").combine_chunks(), pa.binary(), {}
    raws = messages.column("key").to_pylist()
    errors: dict[int, str] = {}
    if key.type == "string":
        values = []
        for i, raw in enumerate(raws):
            try:
                values.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError:
                errors[i] = "key is not UTF-8"
                values.append(None)
        return pa.array(values, pa.string()), pa.string(), errors
    if key.type == "json":
        key_type = fixed_key_type(key)
        values = []
        for i, raw in enumerate(raws):
            try:
                values.append(None if raw is None else declared_json.parse_record(raw, key.schema_)[0])
            except declared_json.BadRecord as err:
                errors[i] = f"key: {err}"
                values.append(None)
        return pa.array(values, key_type), key_type, errors
    raise ValueError(f"key type {key.type!r}")  # config validation allows no other
