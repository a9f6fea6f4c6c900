"""Protobuf through a Schema Registry: a message type built from the registry's schema (no generated code),
its imports resolved through the schema's references, read into the Arrow type it maps to.

The registry may answer a Protobuf schema in two forms. `format=serialized` asks for a base64
FileDescriptorProto (Confluent's registry sends it); the default is the `.proto` text (Karapace sends it
whatever the format, and refuses `format=serialized` with HTTP 500 for a schema with references; Apicurio's
and Redpanda's Confluent-compatible APIs may answer either way). `fetch_schema` asks for the descriptor and
takes the text when that is refused or is not a descriptor; text is compiled with protoc (`compile_proto`).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from offsetlake.formats.protobuf_batches import FastProtobuf
from offsetlake.formats.registry_client import Registry, RegistryRefused, UnusableSchema, shortened
from offsetlake.formats.schema_decoder import TIMESTAMP, SchemaDecoder


class ProtobufDecoder(SchemaDecoder):
    """A message type built from the registry's descriptor (no generated code), read field by field.

    proto3 fields without presence read as their default when unset (as every Protobuf reader does);
    message fields and `optional` fields are null when unset."""

    kind_name = "Protobuf"

    def __init__(self, descriptor):
        from google.protobuf.message_factory import GetMessageClass

        self._cls = GetMessageClass(descriptor)
        self.arrow_type = proto_to_arrow(descriptor, set())
        self._convert = _proto_converter(descriptor)
        self.batches = FastProtobuf.of(descriptor, self.arrow_type)

    def decode(self, payload: bytes) -> Any:
        from google.protobuf.message import DecodeError

        try:
            message = self._cls.FromString(payload)
        except DecodeError as err:
            raise ValueError(f"not a valid Protobuf message: {err}") from err
        try:
            return self._convert(message)
        except (ValueError, OverflowError, OSError) as err:  # a Timestamp or Date outside what they may hold
            raise ValueError(f"not a valid Protobuf message: {err}") from err


_WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(),
    "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(),
    "google.protobuf.UInt64Value": pa.decimal128(20, 0),
    "google.protobuf.Int32Value": pa.int32(),
    "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(),
    "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}


def _proto_scalar(field) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_DOUBLE: pa.float64(),
        F.TYPE_FLOAT: pa.float32(),
        F.TYPE_INT64: pa.int64(),
        F.TYPE_SINT64: pa.int64(),
        F.TYPE_SFIXED64: pa.int64(),
        F.TYPE_UINT64: pa.decimal128(20, 0),
        F.TYPE_FIXED64: pa.decimal128(20, 0),
        F.TYPE_INT32: pa.int32(),
        F.TYPE_SINT32: pa.int32(),
        F.TYPE_SFIXED32: pa.int32(),
        F.TYPE_UINT32: pa.int64(),
        F.TYPE_FIXED32: pa.int64(),
        F.TYPE_BOOL: pa.bool_(),
        F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(),
        F.TYPE_ENUM: pa.string(),
    }[field.type]


def _is_repeated(field) -> bool:
    return field.is_repeated


def proto_to_arrow(descriptor, seen: set[str]) -> pa.DataType:
    name = descriptor.full_name
    if name == "google.protobuf.Timestamp":
        return TIMESTAMP
    if name == "google.type.Date":
        return pa.date32()
    if name in _WRAPPERS:
        return _WRAPPERS[name]
    if name in seen:
        raise UnusableSchema(f"Protobuf message {name!r} is recursive, which a Delta table cannot hold")
    if name in ("google.protobuf.Any", "google.protobuf.Struct", "google.protobuf.Value"):
        raise UnusableSchema(f"Protobuf {name} has no fixed shape, which a Delta column needs")
    inner = seen | {name}
    return pa.struct([pa.field(f.name, _proto_field_type(f, inner)) for f in descriptor.fields])


def _proto_field_type(field, seen: set[str]) -> pa.DataType:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return pa.map_(_proto_scalar(key), _proto_value_type(value, seen))
    element = _proto_value_type(field, seen)
    return pa.list_(element) if _is_repeated(field) else element


def _proto_value_type(field, seen: set[str]) -> pa.DataType:
    return proto_to_arrow(field.message_type, seen) if field.message_type is not None else _proto_scalar(field)


def _proto_converter(descriptor) -> Callable[[Any], Any]:
    name = descriptor.full_name
    if name == "google.protobuf.Timestamp":
        return lambda m: dt.datetime.fromtimestamp(m.seconds, dt.UTC) + dt.timedelta(microseconds=m.nanos // 1000)
    if name == "google.type.Date":
        return lambda m: dt.date(m.year, m.month, m.day) if m.year else None
    if name in _WRAPPERS:
        return lambda m: m.value
    fields = [
        (
            f.name,
            _proto_field_converter(f),
            f.message_type is not None and not _is_repeated(f),
            f.has_presence and not _is_repeated(f),
        )
        for f in descriptor.fields
    ]

    def message(m):
        out = {}
        for fname, convert, _is_message, has_presence in fields:
            if has_presence and not m.HasField(fname):
                out[fname] = None
            else:
                out[fname] = convert(getattr(m, fname))
        return out

    return message


def _proto_field_converter(field) -> Callable[[Any], Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        value = _proto_value_converter(value_field)
        return lambda m: [(k, value(v)) for k, v in m.items()]
    value = _proto_value_converter(field)
    if _is_repeated(field):
        return lambda items: [value(v) for v in items]
    return value


def _proto_value_converter(field) -> Callable[[Any], Any]:
    if field.message_type is not None:
        return _proto_converter(field.message_type)
    if field.enum_type is not None:
        enum = field.enum_type

        def enum_name(number):
            found = enum.values_by_number.get(number)
            return found.name if found is not None else str(number)  # an enum value newer than the schema

        return enum_name
    return lambda v: v


def proto_message(registry: Registry, schema, indexes: tuple):
    """The message type at `indexes` in a registry schema, its imports resolved through `registry`."""
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool()
    _proto_well_known(pool)
    files = _proto_files(registry, schema)
    for file_proto in files:
        try:
            pool.FindFileByName(file_proto.name)  # a well-known type, or a file two references share
        except KeyError:
            pool.Add(file_proto)
    file_proto = files[-1]
    path, message = [], None
    scope = file_proto.message_type
    for index in indexes:
        if index >= len(scope):
            raise UnusableSchema(f"message index {list(indexes)} is not in the schema")
        message = scope[index]
        path.append(message.name)
        scope = message.nested_type
    return pool.FindMessageTypeByName(".".join([file_proto.package, *path] if file_proto.package else path))


# ---- Protobuf schemas as the registry returns them ------------------------------------------------
# Source is compiled here with protoc from the grpcio-tools wheel (Google's own compiler, so every
# construct of the language parses as the producer's did; a pure-Python parser would be a second grammar
# to trust), once per schema per process.
MAIN_PROTO = "offsetlake_schema.proto"  # the name the schema itself gets; its imports keep their names
SERIALIZED = "serialized"


def fetch_schema(fetch: Callable[[str | None], Any]):
    """A Protobuf schema from the registry, `fetch(format)` asking for it in one form.

    The serialized form first: a FileDescriptorProto is exactly what the producer's serializer saw. When
    the registry refuses it (Karapace 3.16: HTTP 500 for a schema with references) or answers with
    something that is not a descriptor (Karapace sends the `.proto` text whatever the format), the default
    (text) form is asked for and compiled. An unknown schema (404) is not asked twice: `UnusableSchema`."""
    try:
        found = fetch(SERIALIZED)
    except RegistryRefused:
        return fetch(None)
    if file_proto(found.schema_str) is not None:
        return found
    return fetch(None)


def _proto_files(registry: Registry, schema) -> list:
    """The schema's FileDescriptorProto and every file it imports, dependencies first (the schema last)."""
    sources: dict[str, str] = {}  # file name -> .proto source
    compiled: dict[str, Any] = {}  # file name -> FileDescriptorProto (the registry sent descriptors)
    _proto_sources(registry, schema, MAIN_PROTO, sources, compiled)
    if not sources:
        return list(compiled.values())  # references are read before the file that imports them
    return compile_proto(sources, compiled)


def _version(registry: Registry, subject: str, version: int, fmt: str | None):
    return registry.version(subject, version, fmt=fmt).schema


def _proto_sources(registry: Registry, schema, name: str, sources: dict, compiled: dict) -> None:
    for ref in schema.references or []:
        if ref.name.startswith(("google/protobuf/", "google/type/")) or ref.name in sources or ref.name in compiled:
            continue  # well-known types come with protobuf (and protoc); a shared import is read once
        referenced = fetch_schema(functools.partial(_version, registry, ref.subject, ref.version))
        _proto_sources(registry, referenced, ref.name, sources, compiled)
    descriptor = file_proto(schema.schema_str)
    if descriptor is None:
        sources[name] = schema.schema_str
    else:
        compiled[name] = descriptor


def file_proto(schema_str: str):
    """The FileDescriptorProto a base64 schema holds; None for anything else (`.proto` source)."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(schema_str, validate=True))
    except Exception:
        return None
    return proto if proto.name or proto.message_type else None


def compile_proto(sources: dict[str, str], compiled: dict) -> list:
    """protoc over the sources (imports resolved among them, then among the `compiled` descriptors, then
    the well-known types protoc ships); UnusableSchema with protoc's first error line when it refuses."""
    import os
    import subprocess
    import sys
    import tempfile
    from importlib import resources

    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory(prefix="offsetlake-proto-") as work:
        for name, text in sources.items():
            path = os.path.join(work, "src", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        out = os.path.join(work, "schema.pb")
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{os.path.join(work, 'src')}",
            f"-I{resources.files('grpc_tools') / '_proto'}",
            "--include_imports",
            f"--descriptor_set_out={out}",
        ]
        if compiled:
            given = os.path.join(work, "given.pb")
            with open(given, "wb") as given_file:
                given_file.write(descriptor_pb2.FileDescriptorSet(file=list(compiled.values())).SerializeToString())
            args.append(f"--descriptor_set_in={given}")
        done = subprocess.run([*args, *sources], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if line.strip()), f"exit {done.returncode}")
            raise UnusableSchema(f"the registry's Protobuf schema does not compile: {shortened(first)}")
        with open(out, "rb") as out_file:
            files = list(descriptor_pb2.FileDescriptorSet.FromString(out_file.read()).file)
    # protoc writes dependencies first; the schema itself goes last, whichever form it came in.
    main = compiled.get(MAIN_PROTO) or next(f for f in files if f.name == MAIN_PROTO)
    return [*(f for f in files if f.name != MAIN_PROTO), main]


def _proto_well_known(pool) -> None:
    from google.protobuf import any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2, wrappers_pb2

    for module in (any_pb2, duration_pb2, empty_pb2, struct_pb2, timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    try:
        from google.type import date_pb2

        pool.AddSerializedFile(date_pb2.DESCRIPTOR.serialized_pb)
    except ImportError:
        pass
