"""Many Protobuf messages of one type decoded in one call into Arrow columns (`FastProtobuf`), exactly as
`protobuf.ProtobufDecoder` decodes them one by one, or not at all. Runs in executors: no deltalake import."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from offsetlake.formats.schema_decoder import TIMESTAMP


class FastProtobuf:
    """Many Protobuf messages of one type decoded in one call into Arrow, by ptars (a Rust decoder).

    ptars reads the wire format as upb does (unknown fields skipped, the last value of a scalar field
    given twice kept, a message field given twice merged, invalid UTF-8 refused); a batch either decodes
    whole or raises, and then the caller decodes it record by record. Two well-known types are read as plain
    messages (the schema's files are rewritten to point at look-alikes) and converted here, so that
    a value neither reader may hold (a Timestamp outside years 1-9999, a Date that is no day) sends
    the batch record by record too, where the record is quarantined with its reason, and so that
    negative nanoseconds round down as the record-by-record path rounds them. Schemas with a map field
    (whose order and repeated keys differ between the two readers), a proto2 group or an enum with
    aliases always take the record-by-record path.
    """

    MIN_RECORDS = 64  # below this the record-by-record path is as fast
    _PLAIN = {"google.protobuf.Timestamp": "Timestamp", "google.type.Date": "Date"}
    _PLAIN_PACKAGE = "offsetlake_plain"

    def __init__(self, descriptor, arrow_type: pa.DataType):
        from ptars import HandlerPool, PtarsConfig

        self.arrow_type = arrow_type
        self._descriptor = descriptor
        message = _plain_pool(descriptor, self._PLAIN, self._PLAIN_PACKAGE).FindMessageTypeByName(descriptor.full_name)
        config = PtarsConfig(
            enum_repr="string",
            list_nullable=True,
            map_nullable=True,
            list_value_nullable=True,
            map_value_nullable=True,
        )
        self._handler = HandlerPool([message.file], config=config).get_for_message(message)

    @staticmethod
    def of(descriptor, arrow_type: pa.DataType) -> FastProtobuf | None:
        """The batch decoder of the message, or None: its messages go record by record."""
        if not _fast_readable(descriptor, set()):
            return None
        try:
            return FastProtobuf(descriptor, arrow_type)
        except Exception:  # a construct ptars does not take (a newer edition's feature): slower, never wrong
            return None

    def decode(self, payloads: list[bytes] | pa.BinaryArray) -> pa.Array | None:
        try:
            if isinstance(payloads, pa.Array):
                batch = self._handler.array_to_record_batch(payloads.cast(pa.binary()))
            else:
                batch = self._handler.list_to_record_batch(payloads)
        except Exception:
            return None
        decoded = pa.StructArray.from_arrays(batch.columns, fields=list(batch.schema))
        try:
            return _finish(decoded, self._descriptor).cast(self.arrow_type)
        except (_Unholdable, pa.ArrowException):  # a value the record path refuses, or a type ptars made otherwise
            return None


class _Unholdable(Exception):
    """A decoded value the record-by-record path would refuse: decode the batch that way."""


_EARLIEST_SECOND, _LATEST_SECOND = -62_135_596_800, 253_402_300_799  # 0001-01-01, 9999-12-31T23:59:59 UTC
_EARLIEST_MICRO, _LATEST_MICRO = _EARLIEST_SECOND * 1_000_000, _LATEST_SECOND * 1_000_000 + 999_999


def _fast_readable(descriptor, seen: set[str]) -> bool:
    """Whether ptars reads every field of the message as the record-by-record path does."""
    from google.protobuf.descriptor import FieldDescriptor

    if descriptor.full_name in seen:
        return False
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_GROUP:
            return False
        if field.enum_type is not None and field.enum_type.GetOptions().allow_alias:
            return False
        kind = field.message_type
        if kind is None or kind.full_name in FastProtobuf._PLAIN:  # wrappers are read as their scalar
            continue
        if kind.GetOptions().map_entry or not _fast_readable(kind, seen | {descriptor.full_name}):
            return False
    return True


def _plain_pool(descriptor, plain: dict[str, str], package: str):
    """A pool of the message's files in which fields of the `plain` well-known types point at
    look-alike messages instead (same field numbers and types, so the same bytes decode)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.descriptor_pool import DescriptorPool

    F = descriptor_pb2.FieldDescriptorProto
    plain_file = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    shapes = {
        "Timestamp": (("seconds", F.TYPE_INT64), ("nanos", F.TYPE_INT32)),
        "Date": (("year", F.TYPE_INT32), ("month", F.TYPE_INT32), ("day", F.TYPE_INT32)),
    }
    for name, fields in shapes.items():
        message = plain_file.message_type.add(name=name)
        for number, (field_name, kind) in enumerate(fields, start=1):
            message.field.add(name=field_name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    renamed = {f".{full}": f".{package}.{short}" for full, short in plain.items()}
    pool = DescriptorPool()
    pool.Add(plain_file)
    for file in _files_in_order(descriptor.file, []):
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        for message in proto.message_type:
            _point_fields(message, renamed)
        proto.dependency.append(plain_file.name)
        pool.Add(proto)
    return pool


def _files_in_order(file, done: list) -> list:
    """The file and every file it imports, each after its imports."""
    for dependency in file.dependencies:
        if dependency not in done:
            _files_in_order(dependency, done)
    if file not in done:
        done.append(file)
    return done


def _point_fields(message, renamed: dict[str, str]) -> None:
    for field in message.field:
        if field.type_name in renamed:  # an assignment, even of "", would mark a scalar field as typed
            field.type_name = renamed[field.type_name]
    for nested in message.nested_type:
        _point_fields(nested, renamed)


def _finish(array: pa.Array, descriptor) -> pa.Array:
    """ptars' array of the message with the plain look-alikes made into the types they map to."""
    name = descriptor.full_name
    if name == "google.protobuf.Timestamp":
        return _timestamps(array)
    if name == "google.type.Date":
        return _dates(array)
    if not _has_plain(descriptor, set()):  # wrappers (ptars reads them as their nullable scalar) too
        return array
    children = []
    for field in descriptor.fields:
        child = array.field(field.name)
        if field.message_type is not None and _has_plain(field.message_type, set()):
            if field.is_repeated:
                values = _finish(child.values, field.message_type)
                child = pa.ListArray.from_arrays(child.offsets, values, mask=child.is_null())
            else:
                child = _finish(child, field.message_type)
        children.append(child)
    names = [field.name for field in descriptor.fields]
    return pa.StructArray.from_arrays(children, names=names, mask=array.is_null())


def _has_plain(descriptor, seen: set[str]) -> bool:
    if descriptor.full_name in FastProtobuf._PLAIN:
        return True
    if descriptor.full_name in seen:
        return False
    inner = seen | {descriptor.full_name}
    return any(f.message_type is not None and _has_plain(f.message_type, inner) for f in descriptor.fields)


def _timestamps(array: pa.StructArray) -> pa.Array:
    """Microseconds as `dt.datetime.fromtimestamp(seconds) + nanos // 1000 µs` gives them record by record."""
    present = array.is_valid().to_numpy(zero_copy_only=False)
    seconds = array.field("seconds").to_numpy(zero_copy_only=False).astype(np.int64)
    nanos = array.field("nanos").to_numpy(zero_copy_only=False).astype(np.int64)
    in_range = (seconds >= _EARLIEST_SECOND) & (seconds <= _LATEST_SECOND)
    micros = np.where(in_range, seconds, 0) * 1_000_000 + np.floor_divide(nanos, 1000)
    holdable = in_range & (micros >= _EARLIEST_MICRO) & (micros <= _LATEST_MICRO)
    if np.any(present & ~holdable):
        raise _Unholdable
    return pa.array(np.where(present, micros, 0), TIMESTAMP, mask=~present)


def _dates(array: pa.StructArray) -> pa.Array:
    """Days as `dt.date(year, month, day) if year else None` gives them record by record."""
    year = array.field("year").to_numpy(zero_copy_only=False).astype(np.int64)
    month = array.field("month").to_numpy(zero_copy_only=False).astype(np.int64)
    day = array.field("day").to_numpy(zero_copy_only=False).astype(np.int64)
    present = array.is_valid().to_numpy(zero_copy_only=False) & (year != 0)
    plausible = (year >= 1) & (year <= 9999) & (month >= 1) & (month <= 12) & (day >= 1)
    months = np.where(plausible, (year - 1970) * 12 + month - 1, 0).astype("datetime64[M]")
    first = months.astype("datetime64[D]")
    length = ((months + 1).astype("datetime64[D]") - first).astype(np.int64)
    if np.any(present & ~(plausible & (day <= length))):
        raise _Unholdable
    days = (first - np.datetime64(0, "D")).astype(np.int64) + day - 1
    return pa.array(np.where(present, days, 0).astype(np.int32), pa.date32(), mask=~present)
