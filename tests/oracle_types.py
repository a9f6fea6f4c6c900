"""The oracle's own idea of a table's columns: from the pipeline file, and from the writer schemas of the
records (Avro, Protobuf, JSON Schema), each mapped to Arrow by the rules docs/reference/pipeline.md and
docs/usage/registry-formats.md state. Written here again, sharing no code with offsetlake's formats: a
column offsetlake gives another type than the docs promise is a finding, not a shared mistake."""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa

from offsetlake.config import (
    DEBEZIUM_OP_COLUMN,
    DEBEZIUM_POSITION_COLUMN,
    HEADERS_COLUMN,
    KEY_COLUMN,
    UNKNOWN_FIELDS_COLUMN,
)

UTC_MICROS = pa.timestamp("us", tz="UTC")
DECLARED_TYPES = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "timestamp": UTC_MICROS,
    "date": pa.date32(),
    "binary": pa.binary(),
}
DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def declared_type(name: str) -> pa.DataType:
    """A declared field type (docs/reference/pipeline.md) as Arrow: a name above, or `decimal(p,s)`."""
    found = DECIMAL.fullmatch(name)
    return pa.decimal128(int(found[1]), int(found[2])) if found else DECLARED_TYPES[name]


LINEAGE_TYPES = {
    "kafka_topic": pa.string(),
    "kafka_partition": pa.int32(),
    "kafka_offset": pa.int64(),
    "kafka_timestamp": UTC_MICROS,
}
HEADERS_TYPE = pa.map_(pa.string(), pa.binary())  # every header, in order, a null value kept


def expected_columns(cfg) -> dict[str, pa.DataType]:
    """The columns the pipeline file itself defines, with their types (a registry format's payload and key
    columns come from its writer schemas: `WriterColumns`)."""
    fmt = cfg.format
    columns: dict[str, pa.DataType] = {}
    if fmt.type == "raw":
        columns.update(key=pa.binary(), value=pa.binary())
    elif fmt.type == "json":
        columns.update({f.name: declared_type(f.type) for f in fmt.schema_})
    if fmt.unknown_fields == "keep":
        columns[UNKNOWN_FIELDS_COLUMN] = pa.string()
    if fmt.envelope == "debezium":
        columns[DEBEZIUM_OP_COLUMN] = pa.string()
        columns[DEBEZIUM_POSITION_COLUMN] = DECLARED_TYPES[fmt.debezium.position_type]
    if fmt.key is not None and fmt.key.type in ("raw", "string"):
        columns[KEY_COLUMN] = pa.binary() if fmt.key.type == "raw" else pa.string()
    elif fmt.key is not None and fmt.key.type == "json":
        columns[KEY_COLUMN] = pa.struct([(f.name, declared_type(f.type)) for f in fmt.key.schema_])
    if fmt.include_headers:
        columns[HEADERS_COLUMN] = HEADERS_TYPE
    columns.update(LINEAGE_TYPES)
    return columns


# -- Avro ------------------------------------------------------------------------------------------------

AVRO_PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
AVRO_LOGICAL = {"date": pa.date32(), "timestamp-millis": UTC_MICROS, "timestamp-micros": UTC_MICROS}


def avro_type(schema, named: dict | None = None, namespace: str = "") -> pa.DataType:
    """An Avro schema (parsed JSON) as the Delta column it becomes. `named`: the named types defined so
    far, by full and short name (a later reference to a record, enum or fixed reads as its definition)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        if schema in AVRO_PRIMITIVES:
            return AVRO_PRIMITIVES[schema]
        found = named.get(schema) or named.get(f"{namespace}.{schema}")
        if found is None:
            raise ValueError(f"the oracle knows no Avro type {schema!r}")
        return found
    if isinstance(schema, list):
        kinds = [s for s in schema if s != "null"]
        if len(kinds) != 1:
            raise ValueError(f"an Avro union of several types has no column: {schema}")
        return avro_type(kinds[0], named, namespace)
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(schema["precision"], schema.get("scale", 0))
    if logical in AVRO_LOGICAL:
        return AVRO_LOGICAL[logical]
    if kind == "record":
        space = schema.get("namespace", namespace)
        full = schema["name"] if "." in schema["name"] else f"{space}.{schema['name']}".lstrip(".")
        fields = [(f["name"], avro_type(f["type"], named, space)) for f in schema["fields"]]
        named[full] = named[schema["name"].rsplit(".", 1)[-1]] = pa.struct(fields)
        return named[full]
    if kind in ("enum", "fixed"):
        made = pa.string() if kind == "enum" else pa.binary()
        space = schema.get("namespace", namespace)
        named[f"{space}.{schema['name']}".lstrip(".")] = named[schema["name"]] = made
        return made
    if kind == "array":
        return pa.list_(avro_type(schema["items"], named, namespace))
    if kind == "map":
        return pa.map_(pa.string(), avro_type(schema["values"], named, namespace))
    return avro_type(kind, named, namespace)  # {"type": "string"}, or a logical type the docs map to its base


# -- Protobuf --------------------------------------------------------------------------------------------

# FieldDescriptor.TYPE_* numbers, as descriptor.proto defines them.
PROTOBUF_SCALARS = {
    1: pa.float64(),  # double
    2: pa.float32(),  # float
    3: pa.int64(),  # int64
    4: pa.decimal128(20, 0),  # uint64: above a long's range
    5: pa.int32(),  # int32
    6: pa.decimal128(20, 0),  # fixed64
    7: pa.int64(),  # fixed32: unsigned
    8: pa.bool_(),
    9: pa.string(),
    12: pa.binary(),
    13: pa.int64(),  # uint32
    14: pa.string(),  # enum: the value's name
    15: pa.int32(),  # sfixed32
    16: pa.int64(),  # sfixed64
    17: pa.int32(),  # sint32
    18: pa.int64(),  # sint64
}
PROTOBUF_WELL_KNOWN = {"google.protobuf.Timestamp": UTC_MICROS, "google.type.Date": pa.date32()}


def protobuf_type(message) -> pa.DataType:
    """A Protobuf message descriptor as the struct its record becomes."""
    return pa.struct([(f.name, _protobuf_field_type(f)) for f in message.fields])


def _protobuf_field_type(f) -> pa.DataType:
    entry = f.message_type
    if entry is not None and entry.GetOptions().map_entry:
        keys, values = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return pa.map_(_protobuf_single_type(keys), _protobuf_single_type(values))
    single = _protobuf_single_type(f)
    return pa.list_(single) if f.is_repeated else single


def _protobuf_single_type(f) -> pa.DataType:
    if f.message_type is None:
        return PROTOBUF_SCALARS[f.type]
    name = f.message_type.full_name
    if name in PROTOBUF_WELL_KNOWN:
        return PROTOBUF_WELL_KNOWN[name]
    if name.startswith("google.protobuf.") and name.endswith("Value"):  # a wrapper: its `value`
        return _protobuf_single_type(f.message_type.fields_by_name["value"])
    return protobuf_type(f.message_type)


# -- JSON Schema -----------------------------------------------------------------------------------------

JSON_FORMATS = {"date-time": UTC_MICROS, "date": pa.date32(), "byte": pa.binary()}
JSON_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}


def json_schema_type(node: dict, resolve: Callable[[str], dict]) -> pa.DataType:
    """A JSON Schema node as its Delta column. `resolve(ref)`: the node a `$ref` points at."""
    if "$ref" in node:
        return json_schema_type(resolve(node["$ref"]), resolve)
    for either in ("oneOf", "anyOf"):
        if either in node:
            kinds = [n for n in node[either] if n.get("type") != "null"]
            if len(kinds) != 1:
                raise ValueError(f"a JSON Schema union of several types has no column: {node[either]}")
            return json_schema_type(kinds[0], resolve)
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f"a JSON Schema union of several types has no column: {kind}")
        kind = kinds[0]
    if kind == "object" and "properties" in node:
        return pa.struct([(name, json_schema_type(sub, resolve)) for name, sub in node["properties"].items()])
    if kind == "object":
        return pa.map_(pa.string(), json_schema_type(node["additionalProperties"], resolve))
    if kind == "array":
        return pa.list_(json_schema_type(node["items"], resolve))
    if kind == "string" and node.get("format") in JSON_FORMATS:
        return JSON_FORMATS[node["format"]]
    if kind in JSON_SCALARS:
        return JSON_SCALARS[kind]
    raise ValueError(f"the oracle knows no JSON Schema type {kind!r}")


def json_schema_resolver(document: dict, referenced: dict[str, dict]) -> Callable[[str], dict]:
    """`$ref` → node: `#/...` in `document`; `name.json` or `name.json#/...` in the schema the registry
    lists under that reference name; an absolute URI matching a referenced schema's `$id`."""
    by_id = {doc.get("$id"): doc for doc in referenced.values() if doc.get("$id")}

    def resolve(ref: str, base: dict = document) -> dict:
        where, _, pointer = ref.partition("#")
        doc = base if not where else referenced.get(where) or by_id.get(where)
        if doc is None:
            raise ValueError(f"$ref {ref!r} points at no schema the registry lists")
        for part in [p for p in pointer.split("/") if p]:
            doc = doc[part]
        return doc

    return resolve


# -- the writer schemas seen, merged as a table widens --------------------------------------------------


class WriterColumns:
    """Per part ("value", "key"): the Arrow type of each writer schema the records in the table were written
    with, by schema id; merged, the columns a table that widens with each new field must have."""

    def __init__(self):
        self.types: dict[str, dict] = {"value": {}, "key": {}}
        self.registry_payload = False  # whether the value's columns come from a registry's schemas

    def saw(self, part: str, schema_id, make: Callable[[], pa.DataType]) -> None:
        if schema_id not in self.types[part]:
            self.types[part][schema_id] = make()

    def merged(self, part: str) -> tuple[pa.DataType | None, list[str]]:
        """(the merged type, or None if no record used this part's schemas; conflicts, described)."""
        merged, conflicts = None, []
        for schema_id in sorted(self.types[part], key=str):
            merged = _merge(merged, self.types[part][schema_id], f"{part} schema {schema_id}", conflicts)
        return merged, conflicts


def _merge(have: pa.DataType | None, new: pa.DataType, where: str, conflicts: list[str], path: str = ""):
    if have is None:
        return new
    if pa.types.is_struct(have) and pa.types.is_struct(new):
        fields = {have.field(i).name: have.field(i).type for i in range(have.num_fields)}
        for i in range(new.num_fields):
            name, t = new.field(i).name, new.field(i).type
            fields[name] = _merge(fields.get(name), t, where, conflicts, f"{path}.{name}".lstrip("."))
        return pa.struct(list(fields.items()))
    if not same_type(have, new):
        conflicts.append(f"{where} gives {path or 'the value'} type {new}, an earlier one {have}")
    return have


def same_type(have: pa.DataType, want: pa.DataType) -> bool:
    """Equal Arrow types, struct fields by name (a widened struct appends its new fields) and without the
    names Arrow and Delta give list items and map entries."""
    if pa.types.is_struct(have) and pa.types.is_struct(want):
        mine = {have.field(i).name: have.field(i).type for i in range(have.num_fields)}
        theirs = {want.field(i).name: want.field(i).type for i in range(want.num_fields)}
        return mine.keys() == theirs.keys() and all(same_type(mine[k], theirs[k]) for k in mine)
    if pa.types.is_map(have) and pa.types.is_map(want):
        return same_type(have.key_type, want.key_type) and same_type(have.item_type, want.item_type)
    if _is_list(have) and _is_list(want):
        return same_type(have.value_type, want.value_type)
    if pa.types.is_string(have) or pa.types.is_large_string(have) or pa.types.is_string_view(have):
        return pa.types.is_string(want)
    if pa.types.is_binary(have) or pa.types.is_large_binary(have) or pa.types.is_binary_view(have):
        return pa.types.is_binary(want)
    return have.equals(want)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


def struct_columns(t: pa.DataType) -> dict[str, pa.DataType]:
    """A record's struct as its columns; a schema that is not a record is one column, `value`."""
    if pa.types.is_struct(t):
        return {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
    return {"value": t}
