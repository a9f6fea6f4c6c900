"""Protobuf message classes from `.proto` text, compiled at run time by offsetlake's own protoc call (no
generated code in the repo): what a test's producer serializes with."""

from __future__ import annotations

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message_factory import GetMessageClass
from google.type import date_pb2

from offsetlake.formats.protobuf import MAIN_PROTO, _proto_well_known, compile_proto


def message_class(source: str, name: str):
    """The message `name` (its full name) of the `.proto` file `source`; it may import the well-known types
    and google/type/date.proto."""
    pool = DescriptorPool()
    _proto_well_known(pool)
    date = descriptor_pb2.FileDescriptorProto.FromString(date_pb2.DESCRIPTOR.serialized_pb)
    for file in compile_proto({MAIN_PROTO: source}, {date.name: date}):  # protoc ships no google/type
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.Add(file)
    return GetMessageClass(pool.FindMessageTypeByName(name))
