"""The columns of a pipeline's table and its quarantine, as the pipeline file defines them (and, for registry
formats, as a new table takes them from the registry): one definition, written by `records` and read by
every writer and checker.
Runs in executors: no deltalake import here.
"""

from __future__ import annotations

import pyarrow as pa

from offsetlake.config import (
    DEBEZIUM_OP_COLUMN,
    DEBEZIUM_POSITION_COLUMN,
    HEADERS_COLUMN,
    KEY_COLUMN,
    REGISTRY_FORMATS,
    UNKNOWN_FIELDS_COLUMN,
    KeyFormat,
    PipelineConfig,
)
from offsetlake.formats import debezium
from offsetlake.formats.declared_json import ARROW_TYPES, arrow_type
from offsetlake.formats.evolution import Incompatible
from offsetlake.formats.wire_values import registry_decoders

LINEAGE_SCHEMA = pa.schema(
    [
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
QUARANTINE_SCHEMA = pa.schema(
    [
        *LINEAGE_SCHEMA,
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("error", pa.string()),
    ]
)
HEADERS_TYPE = pa.map_(pa.string(), pa.binary())
# With format.include_headers the quarantine keeps each record's headers too: nothing of a record is lost.
QUARANTINE_HEADERS = pa.field(HEADERS_COLUMN, HEADERS_TYPE)


def quarantine_schema(cfg: PipelineConfig) -> pa.Schema:
    """The quarantine's columns: lineage, raw key and value, the reason; with `format.include_headers`,
    the headers as the table has them (every one, in order)."""
    return QUARANTINE_SCHEMA.append(QUARANTINE_HEADERS) if cfg.format.include_headers else QUARANTINE_SCHEMA


# A table schema whose payload columns come from the registry carries this in its metadata: the columns
# a pipeline file names are checked, the payload may be any and grow (table.check_schema).
OPEN_PAYLOAD = {b"offsetlake.payload": b"from the registry, grows with the writer schemas"}


def table_schema(cfg: PipelineConfig) -> pa.Schema:
    """The table's columns as the pipeline file defines them. Registry formats: without the payload (and
    a registry key) columns, which come from the registry (`initial_table_schema`), marked OPEN_PAYLOAD."""
    fmt = cfg.format
    if fmt.type == "raw":
        payload = [pa.field("key", pa.binary()), pa.field("value", pa.binary())]
    elif fmt.type == "json":
        payload = [pa.field(f.name, arrow_type(f.type)) for f in fmt.schema_]
    elif fmt.schema_file:
        payload = list(struct_fields(registry_decoders(cfg).file_type()))
    else:
        payload = []
    if fmt.unknown_fields == "keep":
        payload.append(pa.field(UNKNOWN_FIELDS_COLUMN, pa.string()))
    if fmt.debezium_envelope and fmt.type == "json":  # registry formats: the registry's schema gives them
        payload.append(pa.field(DEBEZIUM_OP_COLUMN, pa.string()))
        payload.append(pa.field(DEBEZIUM_POSITION_COLUMN, ARROW_TYPES[fmt.debezium.position_type]))
    key_type = fixed_key_type(fmt.key)
    extra = [pa.field(KEY_COLUMN, key_type)] if key_type is not None else []
    if fmt.include_headers:
        extra.append(pa.field(HEADERS_COLUMN, HEADERS_TYPE))
    return pa.schema([*payload, *extra, *LINEAGE_SCHEMA], metadata=OPEN_PAYLOAD if fmt.evolves else None)


def initial_table_schema(cfg: PipelineConfig) -> pa.Schema:
    """The schema a new table is created with: registry formats take the latest schema of the value (and
    key) subject of the first topic."""
    fixed = table_schema(cfg)
    if not cfg.format.evolves or cfg.format.type == "connect_json":  # connect_json: columns come with the values
        return fixed
    from offsetlake.formats.registry import latest_arrow_type

    fmt, topic = cfg.format, cfg.topics[0]
    assert fmt.registry is not None  # a format that evolves reads its schema from a registry
    latest = latest_arrow_type(fmt.registry, fmt.type, topic)
    if fmt.debezium_envelope:
        try:
            payload = debezium.table_columns(latest, fmt.debezium.position)
        except debezium.NotAChangeEvent as err:
            raise Incompatible(f"topic {topic}: {err}") from err
    else:
        payload = struct_fields(latest)
    columns = [*payload, *fixed]
    if fmt.key is not None and fmt.key.type in REGISTRY_FORMATS:
        key = pa.field(KEY_COLUMN, latest_arrow_type(fmt.registry, fmt.key.type, topic, key=True))
        columns.insert(len(payload), key)
    clash = sorted({f.name for f in payload} & {f.name for f in fixed})
    if clash:
        raise Incompatible(f"the registry schema's field {clash[0]!r} clashes with a column offsetlake adds")
    return pa.schema(columns, metadata=OPEN_PAYLOAD)


def fixed_key_type(key: KeyFormat | None) -> pa.DataType | None:
    if key is None or key.type in REGISTRY_FORMATS:
        return None
    if key.type == "json":
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in key.schema_])
    return pa.binary() if key.type == "raw" else pa.string()


def struct_fields(t: pa.DataType) -> list[pa.Field]:
    return [t.field(i).with_nullable(True) for i in range(t.num_fields)]
