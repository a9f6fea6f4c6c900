"""Protobuf schemas as `.proto` source (what Karapace answers): the embedded registry's printer and
offsetlake's compiler agree with protoc on every construct the registry tests register."""

import base64
import json

import pytest
from google.protobuf import descriptor_pb2

from offsetlake.formats import protobuf
from offsetlake.formats.protobuf import MAIN_PROTO
from offsetlake.formats.registry import UnusableSchema
from offsetlake_local.proto_text import proto_text
from offsetlake_local.schema_registry import as_karapace

F = descriptor_pb2.FieldDescriptorProto


def money_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop.common", syntax="proto3")
    money = file.message_type.add(name="Money")
    money.field.add(name="currency", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="currency")
    money.field.add(name="units", number=2, type=F.TYPE_SINT64, label=F.LABEL_OPTIONAL, json_name="units")
    return file


def order_file(name: str = MAIN_PROTO) -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name=name, package="shop", syntax="proto3", dependency=["google/protobuf/timestamp.proto", "shop/money.proto"]
    )
    kind = file.enum_type.add(name="Kind")
    kind.value.add(name="KIND_UNSPECIFIED", number=0)
    kind.value.add(name="RETAIL", number=3)
    order = file.message_type.add(name="Order")
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="sku")
    line.field.add(
        name="price",
        number=2,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".shop.common.Money",
        json_name="price",
    )
    entry = order.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="key")
    entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL, json_name="value")
    status = order.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    add = order.field.add
    add(name="id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, json_name="id")
    add(
        name="created",
        number=2,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".google.protobuf.Timestamp",
        json_name="created",
    )
    add(
        name="lines",
        number=3,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".shop.Order.Line",
        json_name="lines",
    )
    add(
        name="counts",
        number=4,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".shop.Order.CountsEntry",
        json_name="counts",
    )
    add(
        name="status",
        number=5,
        type=F.TYPE_ENUM,
        label=F.LABEL_OPTIONAL,
        type_name=".shop.Order.Status",
        json_name="status",
    )
    add(name="kind", number=6, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL, type_name=".shop.Kind", json_name="kind")
    order.oneof_decl.add(name="payment")
    add(name="card", number=7, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0, json_name="card")
    add(name="voucher", number=8, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, oneof_index=0, json_name="voucher")
    order.oneof_decl.add(name="_note")
    add(
        name="note",
        number=9,
        type=F.TYPE_STRING,
        label=F.LABEL_OPTIONAL,
        oneof_index=1,
        proto3_optional=True,
        json_name="note",
    )
    add(name="tags", number=10, type=F.TYPE_BYTES, label=F.LABEL_REPEATED, json_name="tags")
    return file


def test_proto_text_compiles_back_to_the_same_descriptor():
    files = protobuf.compile_proto(
        {"shop/money.proto": proto_text(money_file()), MAIN_PROTO: proto_text(order_file())}, {}
    )
    by_name = {f.name: f for f in files}
    assert [f.name for f in files][-1] == MAIN_PROTO  # the schema last, its imports before it
    assert "google/protobuf/timestamp.proto" in by_name  # well-known types from protoc's own include dir
    assert by_name[MAIN_PROTO] == order_file()
    assert by_name["shop/money.proto"] == money_file()


def test_a_proto2_file_keeps_its_labels():
    file = descriptor_pb2.FileDescriptorProto(name=MAIN_PROTO)  # no syntax: proto2, as protoc writes it
    m = file.message_type.add(name="Legacy")
    m.field.add(name="a", number=1, type=F.TYPE_INT32, label=F.LABEL_REQUIRED, json_name="a")
    m.field.add(name="b", number=2, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL, json_name="b")
    m.field.add(name="c", number=3, type=F.TYPE_FIXED32, label=F.LABEL_REPEATED, json_name="c")
    assert protobuf.compile_proto({MAIN_PROTO: proto_text(file)}, {})[-1] == file


def test_source_that_imports_a_descriptor_compiles_against_it():
    """A registry may hold the schema as source and an import as a descriptor (registered by another client)."""
    files = protobuf.compile_proto({MAIN_PROTO: proto_text(order_file())}, {"shop/money.proto": money_file()})
    assert files[-1] == order_file()


def test_source_protoc_refuses_is_one_line_naming_the_error():
    with pytest.raises(UnusableSchema) as err:
        protobuf.compile_proto({MAIN_PROTO: 'syntax = "proto3";\nmessage M { strin x = 1; }\n'}, {})
    message = str(err.value)
    assert message.startswith("the registry's Protobuf schema does not compile:") and "\n" not in message
    assert "strin" in message


def test_a_descriptor_is_not_mistaken_for_source_and_source_not_for_a_descriptor():
    as_base64 = base64.b64encode(order_file().SerializeToString()).decode()
    assert protobuf.file_proto(as_base64) == order_file()
    assert protobuf.file_proto(proto_text(order_file())) is None


def test_the_embedded_registry_answers_as_karapace_does():
    descriptor = base64.b64encode(money_file().SerializeToString()).decode()
    shown = as_karapace({"schema": descriptor, "schemaType": "PROTOBUF", "references": []})
    assert shown["schema"].startswith('syntax = "proto3";') and "message Money {" in shown["schema"]
    avro = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}'
    shown = as_karapace({"schema": avro, "schemaType": "AVRO", "references": []})["schema"]
    assert shown.startswith('{"fields": [{"name": "a"') and json.loads(shown) == json.loads(avro)
    schema = '{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}'
    shown = as_karapace({"schema": schema, "schemaType": "JSON", "references": []})["schema"]
    assert "http:\\/\\/json-schema.org\\/draft-07\\/schema#" in shown
    assert json.loads(shown) == json.loads(schema)


class _Answer:
    def __init__(self, schema_str: str):
        self.schema_str = schema_str


def test_a_refused_or_undecodable_serialized_form_falls_back_to_the_text_form_and_an_unknown_id_does_not():
    from offsetlake.formats.registry_client import RegistryRefused

    descriptor = base64.b64encode(order_file().SerializeToString()).decode()
    text = proto_text(order_file())
    asked: list = []

    def registry(serialized):
        def fetch(fmt):
            asked.append(fmt)
            if isinstance(serialized, Exception) and (fmt == "serialized" or isinstance(serialized, UnusableSchema)):
                raise serialized
            return _Answer(serialized if fmt == "serialized" else text)

        return fetch

    assert protobuf.fetch_schema(registry(descriptor)).schema_str == descriptor  # Confluent: one request
    assert asked == ["serialized"]
    asked.clear()
    refused = RegistryRefused("Schema Registry at http://r refused schema id 8: HTTP 500 Internal server error")
    assert protobuf.fetch_schema(registry(refused)).schema_str == text  # Karapace, a schema with references
    assert asked == ["serialized", None]
    asked.clear()
    assert protobuf.fetch_schema(registry("bm90IGEgZGVzY3JpcHRvcg==")).schema_str == text  # not a descriptor
    assert asked == ["serialized", None]
    asked.clear()
    with pytest.raises(UnusableSchema, match="unknown"):
        protobuf.fetch_schema(registry(UnusableSchema("unknown to the Schema Registry at http://r")))
    assert asked == ["serialized"]
