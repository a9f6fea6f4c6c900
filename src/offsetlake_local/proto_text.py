"""A FileDescriptorProto written back as `.proto` source: what Karapace answers for a Protobuf schema.

Karapace (and, by their docs, Apicurio's and Redpanda's Confluent-compatible APIs) keeps a Protobuf schema
as `.proto` text and answers with it even when asked for `format=serialized`. The embedded registry
answers as they do when started with `--answer-as karapace`, so the registry-format tests read schemas
that confluent-kafka's ProtobufSerializer registered as descriptors back as text. Covers what those
tests register: proto2/proto3, packages, imports, nested messages and enums, maps, oneofs and proto3
`optional`. Options other than `map_entry` are left out (they do not change the wire format).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2

_F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    _F.TYPE_DOUBLE: "double",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_INT64: "int64",
    _F.TYPE_UINT64: "uint64",
    _F.TYPE_INT32: "int32",
    _F.TYPE_FIXED64: "fixed64",
    _F.TYPE_FIXED32: "fixed32",
    _F.TYPE_BOOL: "bool",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "bytes",
    _F.TYPE_UINT32: "uint32",
    _F.TYPE_SFIXED32: "sfixed32",
    _F.TYPE_SFIXED64: "sfixed64",
    _F.TYPE_SINT32: "sint32",
    _F.TYPE_SINT64: "sint64",
}


def proto_text(file: descriptor_pb2.FileDescriptorProto) -> str:
    """The `.proto` source of `file`."""
    syntax = file.syntax or "proto2"
    lines = [f'syntax = "{syntax}";']
    if file.package:
        lines.append(f"package {file.package};")
    lines += [f'import "{dep}";' for dep in file.dependency]
    for enum in file.enum_type:
        lines += _enum(enum, "")
    for message in file.message_type:
        lines += _message(message, "", syntax)
    return "\n".join(lines) + "\n"


def _enum(enum, indent: str) -> list[str]:
    return [f"{indent}enum {enum.name} {{", *(f"{indent}  {v.name} = {v.number};" for v in enum.value), f"{indent}}}"]


def _message(message, indent: str, syntax: str) -> list[str]:
    inner = indent + "  "
    maps = {n.name: n for n in message.nested_type if n.options.map_entry}
    lines = [f"{indent}message {message.name} {{"]
    for nested in message.nested_type:
        if nested.name not in maps:
            lines += _message(nested, inner, syntax)
    for enum in message.enum_type:
        lines += _enum(enum, inner)
    real_oneofs = {f.oneof_index for f in message.field if f.HasField("oneof_index") and not f.proto3_optional}
    printed: set[int] = set()
    for field in message.field:
        if field.HasField("oneof_index") and field.oneof_index in real_oneofs:
            if field.oneof_index in printed:
                continue
            printed.add(field.oneof_index)
            lines.append(f"{inner}oneof {message.oneof_decl[field.oneof_index].name} {{")
            lines += [
                _field(f, inner + "  ", syntax, maps, in_oneof=True)
                for f in message.field
                if f.HasField("oneof_index") and f.oneof_index == field.oneof_index
            ]
            lines.append(f"{inner}}}")
        else:
            lines.append(_field(field, inner, syntax, maps))
    lines.append(f"{indent}}}")
    return lines


def _type(field) -> str:
    return SCALARS.get(field.type) or field.type_name  # a fully qualified ".pkg.Name" is valid source


def _field(field, indent: str, syntax: str, maps: dict, in_oneof: bool = False) -> str:
    entry = maps.get(field.type_name.rsplit(".", 1)[-1]) if field.type == _F.TYPE_MESSAGE else None
    if entry is not None and field.label == _F.LABEL_REPEATED:
        key, value = entry.field
        return f"{indent}map<{_type(key)}, {_type(value)}> {field.name} = {field.number};"
    if in_oneof:
        label = ""
    elif field.label == _F.LABEL_REPEATED:
        label = "repeated "
    elif field.label == _F.LABEL_REQUIRED:
        label = "required "
    elif syntax == "proto2" or field.proto3_optional:
        label = "optional "
    else:
        label = ""
    return f"{indent}{label}{_type(field)} {field.name} = {field.number};"
