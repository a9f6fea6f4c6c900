"""Schema evolution: which table schema holds both the table's rows and a newer writer schema's records.

Delta can add a column (or a field inside a struct) to a table: existing rows read it
as null. It cannot narrow or change a column's type (delta-rs has no type widening),
so a writer schema that does that cannot be written: `merge_type` raises
`Incompatible` with the reason, and the records written with that schema are
quarantined. A value of a narrower type goes into a wider column as is (an Avro
`int` into a `long` column, a `float` into a `double`).

The merged schema is committed in the same Delta commit as the data and the
offsets (`commit.py`), so no reader sees data without its column, or a column
without the offsets of the records that brought it.
"""

from __future__ import annotations

import base64

import pyarrow as pa


class Incompatible(ValueError):
    """The writer's type cannot be held by the table's column."""


def merge_type(table: pa.DataType, writer: pa.DataType, where: str) -> pa.DataType:
    """The type holding both: `table` itself, or it with fields the writer adds."""
    if pa.types.is_struct(table) and pa.types.is_struct(writer):
        fields = {table.field(i).name: table.field(i) for i in range(table.num_fields)}
        merged = [
            f.with_type(merge_type(f.type, writer.field(f.name).type, _join(where, f.name)))
            if writer.get_field_index(f.name) >= 0
            else f
            for f in fields.values()
        ]
        merged += [
            pa.field(writer.field(i).name, writer.field(i).type, nullable=True)
            for i in range(writer.num_fields)
            if writer.field(i).name not in fields
        ]
        return pa.struct(merged)
    if pa.types.is_list(table) and pa.types.is_list(writer):
        return pa.list_(table.value_field.with_type(merge_type(table.value_type, writer.value_type, f"{where}[]")))
    if pa.types.is_map(table) and pa.types.is_map(writer):
        if _norm(table.key_type) != _norm(writer.key_type):
            raise _incompatible(where, table, writer)
        return pa.map_(table.key_type, merge_type(table.item_type, writer.item_type, f"{where}{{}}"))
    if _norm(table) == _norm(writer) or _widens(table, writer):
        return table
    raise _incompatible(where, table, writer)


def merge_schema(table: pa.Schema, writer: pa.Schema) -> pa.Schema:
    """Column by column, as merge_type; new columns are appended, nullable."""
    merged = merge_type(pa.struct(list(table)), pa.struct(list(writer)), "")
    return pa.schema([merged.field(i) for i in range(merged.num_fields)], metadata=table.metadata)


def adds_columns(table: pa.Schema, merged: pa.Schema) -> bool:
    """True when `merged` has a column or a nested field `table` lacks (types are merge_type's)."""
    return _shape(pa.struct(list(merged))) != _shape(pa.struct(list(table)))


def _shape(t: pa.DataType):
    if pa.types.is_struct(t):
        return tuple((t.field(i).name, _shape(t.field(i).type)) for i in range(t.num_fields))
    if pa.types.is_list(t):
        return ("list", _shape(t.value_type))
    if pa.types.is_map(t):
        return ("map", _shape(t.item_type))
    return None


def _widens(table: pa.DataType, writer: pa.DataType) -> bool:
    """Values of `writer` fit `table` exactly."""
    if pa.types.is_integer(table) and pa.types.is_integer(writer):
        return table.bit_width > writer.bit_width or (table.bit_width == writer.bit_width and table == writer)
    if pa.types.is_floating(table) and pa.types.is_floating(writer):
        return table.bit_width >= writer.bit_width
    if pa.types.is_decimal(table) and pa.types.is_decimal(writer):
        return table.scale >= writer.scale and table.precision - table.scale >= writer.precision - writer.scale
    return False


def _norm(t: pa.DataType):
    """What Delta can tell apart (it reads back strings as string_view, names list items 'element'...)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return "binary"
    if pa.types.is_timestamp(t):
        return ("timestamp", t.tz is not None)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return ("list", _norm(t.value_type))
    if pa.types.is_struct(t):
        return ("struct", tuple((t.field(i).name, _norm(t.field(i).type)) for i in range(t.num_fields)))
    if pa.types.is_map(t):
        return ("map", _norm(t.key_type), _norm(t.item_type))
    return str(t)


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal as far as Delta can tell types apart."""
    return _norm(a) == _norm(b)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """Delta's schema as Arrow gives it, with plain string/binary/list types (the ones rows are built in)."""
    return pa.schema([f.with_type(_plain(f.type)) for f in schema], metadata=schema.metadata)


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_plain(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    return t


def _incompatible(where: str, table: pa.DataType, writer: pa.DataType) -> Incompatible:
    return Incompatible(
        f"field {where or 'value'!r} is {writer} in this schema but {table} in the table, "
        f"and Delta cannot change a column's type"
    )


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def schema_to_text(schema: pa.Schema) -> str:
    """A schema as text, to travel in a Spark task's result."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
