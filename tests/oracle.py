"""The exactly-once oracle: a pipeline's table and quarantine, row by row and value by value, against two
truths — what Kafka returns under read_committed, and what the producers recorded they committed.

What it checks (`check` collects every finding; `assert_exactly_once` fails naming each kind's offsets):
- every record Kafka holds below the ledger's end is in the table or the quarantine, once, and nothing
  else is: no duplicate, no row of an aborted record, no record quarantined twice;
- every column that comes from Kafka equals what this module decodes from the record: key, headers,
  timestamp, and the value as its format decodes it (raw bytes, JSON fields, registry records);
- every quarantine row holds its record's key, value and timestamp, and a reason;
- producer-side truth (`Journal`): every record a producer committed below the ledger's end is one Kafka
  returns, with the same key, value and headers, and none it aborted is; a record the producers made bad
  is quarantined with its reason, and a record they made good is not quarantined.

The decoding here shares no code with offsetlake's formats: `json.loads`, fastavro with the writer schema
the registry client fetches, confluent-kafka's ProtobufDeserializer, base64 and datetime from the standard
library. A bug in offsetlake's decoding therefore shows as a difference instead of cancelling out.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import io
import json
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deltalake import DeltaTable, QueryBuilder

from offsetlake.config import (
    DEBEZIUM_OP_COLUMN,
    DEBEZIUM_POSITION_COLUMN,
    HEADERS_COLUMN,
    KEY_COLUMN,
    LINEAGE_COLUMNS,
    UNKNOWN_FIELDS_COLUMN,
)
from offsetlake.protocol.ledger import read_ledger
from offsetlake.storage.location import Location
from offsetlake.table import open_table, query
from offsetlake_local.producer import BAD_VALUES
from oracle_judge import UNFRAMED, quarantine_defect
from oracle_types import (
    WriterColumns,
    avro_type,
    expected_columns,
    json_schema_resolver,
    json_schema_type,
    protobuf_type,
    same_type,
    struct_columns,
)

Offset = tuple[str, int, int]  # (topic, partition, offset)
UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


# -- what Kafka holds --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaRecord:
    key: bytes | None
    value: bytes | None
    headers: list  # [(name, bytes | None)], in order
    timestamp: dt.datetime


def read_committed(
    bootstrap: str, topic: str, until: dict[int, int] | None = None, client: dict | None = None
) -> dict[Offset, KafkaRecord]:
    """Every record Kafka returns under read_committed, from each partition's log start up to `until[p]`
    (default: the LSO now), read by a plain consumer of its own (`client`: the cluster's security settings)."""
    settings = {"bootstrap.servers": bootstrap, **(client or {})}
    partitions = kafka_partitions(settings, topic)
    ends = kafka_offsets(settings, topic, partitions, "latest")
    starts = kafka_offsets(settings, topic, partitions, "earliest")
    out: dict[Offset, KafkaRecord] = {}
    for p in partitions:
        end = ends[p] if until is None else until.get(p, 0)
        if end > starts[p]:
            out.update(_read_partition(settings, topic, p, starts[p], end))
    return out


def kafka_partitions(settings: dict, topic: str, admin=None) -> list[int]:
    """The topic's partitions, as the oracle's own admin client hears them from the broker (not from
    offsetlake: a partition offsetlake missed must not be missed here too). `admin`: one to ask (else a new
    one for `settings`)."""
    from confluent_kafka.admin import AdminClient

    metadata = (admin or AdminClient(settings)).list_topics(topic, timeout=10)
    found = metadata.topics.get(topic)
    assert found is not None and found.error is None, f"the oracle cannot see topic {topic}: {found and found.error}"
    return sorted(found.partitions)


OFFSETS_RETRY_SECONDS = 60  # longer than a leader election after a node's restart
ASK_AGAIN = {  # answers to a ListOffsets while leadership moves, which librdkafka may not mark retriable
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
}


def kafka_offsets(settings: dict, topic: str, partitions: list[int], which: str, admin=None) -> dict[int, int]:
    """{partition: offset}: "earliest" (the log start), "latest" under read_committed (the LSO) or "high" (the
    high watermark, read_uncommitted's end). `admin`: one to ask (else a new one for `settings`)."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import AdminClient, OffsetSpec

    spec = OffsetSpec.earliest() if which == "earliest" else OffsetSpec.latest()
    isolation = IsolationLevel.READ_UNCOMMITTED if which == "high" else IsolationLevel.READ_COMMITTED
    asked = {TopicPartition(topic, p): spec for p in partitions}
    admin = admin or AdminClient(settings)  # kept until the answers are in: a collected one never resolves them
    deadline = time.monotonic() + OFFSETS_RETRY_SECONDS
    while True:
        futures = admin.list_offsets(asked, isolation_level=isolation, request_timeout=10)
        try:
            return {tp.partition: future.result(timeout=30).offset for tp, future in futures.items()}
        except KafkaException as err:
            # A partition's new leader answers OFFSET_NOT_AVAILABLE until its high watermark has caught up
            # (KIP-207), and a moving leader NOT_LEADER_OR_FOLLOWER: Kafka's word to ask again.
            kerr = err.args[0]
            if not (kerr.retriable() or kerr.code() in ASK_AGAIN) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_partition(settings: dict, topic: str, partition: int, start: int, end: int) -> dict[Offset, KafkaRecord]:
    consumer = Consumer(
        {
            **settings,
            "group.id": f"truth_{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    consumer.assign([TopicPartition(topic, partition, start)])
    out, done, deadline = {}, False, time.monotonic() + 60
    try:
        while not done and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.05):  # short: a batch of fewer records returns when it times out
                if msg.error():  # an event, not a record (end of partition; a refused group lookup): no offset
                    continue
                if msg.offset() >= end:
                    done = True
                    break
                out[(topic, partition, msg.offset())] = KafkaRecord(
                    msg.key(), msg.value(), msg.headers() or [], EPOCH + dt.timedelta(milliseconds=msg.timestamp()[1])
                )
            if not done and consumer.position([TopicPartition(topic, partition)])[0].offset >= end:
                done = True
    finally:
        consumer.close()
    assert done, f"the oracle could not read {topic}[{partition}] up to {end}"
    return out


# -- what the producers recorded -----------------------------------------------------------------------


@dataclass
class Sent:
    key: bytes | None
    value: bytes | None
    headers: list
    bad: str | None  # the reason the producer made it bad (a fragment the quarantine's error must hold)
    outcome: str = "in doubt"  # committed | aborted | in doubt (its transaction's end was not seen)
    transaction: str | None = None
    sent_at: float = 0.0  # wall clock: when it was produced, acknowledged, and its transaction ended
    acked_at: float = 0.0
    ended_at: float = 0.0

    @property
    def settled_at(self) -> float:
        """When the producer was told the record is committed: its ack, or its transaction's end."""
        return self.ended_at if self.transaction else self.acked_at


class Journal:
    """Producer-side truth: every record the test producers sent, by where the broker put it, and how its
    transaction ended. Thread-safe: the chaos workload's producers write from two threads and
    librdkafka's delivery callbacks. Implements offsetlake_local.producer.Journal."""

    def __init__(self):
        self._lock = threading.RLock()
        self._by_offset: dict[Offset, Sent] = {}
        self._open: dict[str, list[Sent]] = collections.defaultdict(list)
        # Records acknowledged without an offset: librdkafka delivers a retried write that the broker
        # answers DUPLICATE_SEQUENCE_NUMBER (it already holds it) with offset -1. Placed by the check.
        self._unplaced: dict[str, list[Sent]] = collections.defaultdict(list)

    def sent(self, topic: str, record: dict, transaction: str | None, bad: str | None = None) -> Callable:
        value = record.get("value")
        if bad is None and value in BAD_VALUES:
            bad = BAD_REASON[value]
        sent = Sent(
            record.get("key"), value, _headers(record.get("headers")), bad, transaction=transaction, sent_at=time.time()
        )

        def delivered(err, msg) -> None:
            # No lock here: librdkafka calls this from wherever a producer is polled, flushed or torn
            # down, and a 200-fault chaos run deadlocked with three threads waiting on the journal's lock
            # and none holding it. One dict store and one list append are atomic under the GIL.
            if err is not None:
                return  # never written: no offset to account for
            sent.acked_at = time.time()
            if transaction is None:
                sent.outcome = "committed"
            else:
                self._open[transaction].append(sent)
            if msg.offset() is None or msg.offset() < 0:
                self._unplaced[msg.topic()].append(sent)
            else:
                self._by_offset[(msg.topic(), msg.partition(), msg.offset())] = sent

        return delivered

    def ended(self, transaction: str, committed: bool) -> None:
        with self._lock:
            for sent in self._open.pop(transaction, []):
                sent.outcome = "committed" if committed else "aborted"
                sent.ended_at = time.time()

    def add(self, where: Offset, sent: Sent) -> None:
        """Record a record as placed (the meta-test states a producer's record this way)."""
        with self._lock:
            self._by_offset[where] = sent

    def of_topic(self, topic: str) -> dict[Offset, Sent]:
        """The records sent to `topic`, by where the broker put them."""
        # dict.copy() runs no Python code while it copies; iterating the dict itself can (an allocation
        # may collect a producer whose teardown delivers reports into it: "dictionary changed size").
        placed = self._by_offset.copy().items()
        return {k: v for k, v in placed if k[0] == topic}

    def unplaced(self, topic: str) -> list[Sent]:
        """The records sent to `topic` that were acknowledged without an offset."""
        return list(self._unplaced.get(topic, []))


def _headers(headers) -> list:
    if not headers:
        return []
    items = headers.items() if isinstance(headers, dict) else headers
    return [(k, v.encode() if isinstance(v, str) else v) for k, v in items]


JOURNAL = Journal()  # the test session's: support.produce and support.JournaledProducer write here

# The quarantine's reason for each of the demo producer's bad values, by the format the pipeline reads.
BAD_REASON = {
    BAD_VALUES[0]: "value is not JSON",
    BAD_VALUES[1]: "field 'user_id': expected an integer",
    BAD_VALUES[2]: "required field 'event_id' is missing",
    BAD_VALUES[3]: "value is not JSON",
}


# -- decoding, independently of offsetlake ------------------------------------------------------------


class Decoder:
    """The row a record must become: {column: value} for every column that comes from Kafka."""

    def __init__(self, cfg, registry=None, protobuf: dict | None = None):
        self.cfg, self.fmt = cfg, cfg.format
        self._registry = registry
        self._protobuf = protobuf or {}  # "value" / "key": the message class a test's producer used
        self._writers: dict[int, tuple[dict, Any]] = {}  # schema id: (its document, parsed by fastavro)
        self._file_schema = None
        # The Arrow type of each writer schema the decoded records used: the table's columns (_check_schema).
        self.writers = WriterColumns()
        self.last_writers = WriterColumns()
        self.writers.registry_payload = cfg.format.type in ("avro", "protobuf", "json_schema") and not (
            cfg.format.schema_file
        )

    def row(self, record: KafkaRecord, schema: pa.Schema) -> dict:
        row: dict[str, Any] = {"kafka_timestamp": record.timestamp}
        fmt = self.fmt
        if fmt.type == "raw":
            row.update(key=record.key, value=record.value)
        else:
            fields = self._value(record.value)
            if fmt.envelope == "debezium":
                fields = debezium_row(fields, fmt.debezium.position)
            payload = [
                f for f in schema if f.name not in {*LINEAGE_COLUMNS, KEY_COLUMN, HEADERS_COLUMN, UNKNOWN_FIELDS_COLUMN}
            ]
            for f in payload:
                row[f.name] = coerce(fields.get(f.name), f.type)
            if fmt.unknown_fields == "keep":
                extra = {k: v for k, v in fields.items() if k not in {f.name for f in payload}}
                row[UNKNOWN_FIELDS_COLUMN] = extra or None
        if fmt.key is not None:
            row[KEY_COLUMN] = self._key(record.key, schema.field(KEY_COLUMN).type)
        if fmt.include_headers:
            row[HEADERS_COLUMN] = list(record.headers)
        return row

    # -- what the quarantine judge (oracle_judge) asks of a record -------------------------------------

    def key_of(self, key: bytes | None, schema: pa.Schema):
        return self._key(key, schema.field(KEY_COLUMN).type if KEY_COLUMN in schema.names else pa.null())

    def known_schema(self, schema_id: int) -> bool:
        """Whether the registry knows the id (False on its 404; any other error is raised)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            self.registry().get_schema(schema_id)
        except SchemaRegistryError as err:
            if err.http_status_code == 404:
                return False
            raise
        return True

    def payload(self, value: bytes) -> dict:
        """The value's fields, decoded without telling the schema check (a quarantined record's writer
        schema is not one the table must have)."""
        seen, self.writers = self.writers, WriterColumns()
        try:
            return self._value(value)
        finally:
            self.last_writers, self.writers = self.writers, seen

    def writer_type(self, part: str, value: bytes) -> pa.DataType:
        """The Arrow type of the writer schema `payload` just decoded."""
        (found,) = self.last_writers.types[part].values()
        return found

    def _value(self, value: bytes) -> dict:
        kind = self.fmt.type
        if kind == "json":
            return json.loads(value)
        if kind == "avro" and self.fmt.schema_file:
            if self._file_schema is None:
                document = json.loads(Path(self.fmt.schema_file).read_text())
                self._file_schema = (document, fastavro.parse_schema(document))
            document, parsed = self._file_schema
            self.writers.saw("value", "schema_file", lambda: self._payload_type(avro_type(document)))
            return fastavro.schemaless_reader(io.BytesIO(value), parsed, None)
        return self._registered(value, kind, "value")

    def _payload_type(self, t: pa.DataType, part: str = "value") -> pa.DataType:
        """A value schema's columns: a Debezium envelope's are its `after` record's."""
        if part == "value" and self.fmt.envelope == "debezium":
            return t.field("after").type
        return t

    def _key(self, key: bytes | None, arrow_type: pa.DataType):
        if key is None:
            return None
        kind = self.fmt.key.type
        if kind == "raw":
            return key
        if kind == "string":
            return key.decode()
        decoded = json.loads(key) if kind == "json" else self._registered(key, kind, "key")
        return coerce(decoded, arrow_type)

    def _registered(self, data: bytes, kind: str, part: str) -> dict:
        """The Confluent wire format: magic byte 0, the schema id, then the payload."""
        assert data[:1] == b"\x00", f"not in the Schema Registry wire format: {data[:16]!r}"
        if kind == "protobuf":
            return self._protobuf_message(data, part)
        schema_id = struct.unpack(">I", data[1:5])[0]
        if kind == "json_schema":
            self.writers.saw(part, schema_id, lambda: self._payload_type(self._json_schema_type(schema_id), part))
            return json.loads(data[5:])
        if schema_id not in self._writers:
            document = json.loads(self.registry().get_schema(schema_id).schema_str)
            self._writers[schema_id] = (document, fastavro.parse_schema(document))
        document, parsed = self._writers[schema_id]
        self.writers.saw(part, schema_id, lambda: self._payload_type(avro_type(document), part))
        return fastavro.schemaless_reader(io.BytesIO(data[5:]), parsed, None)

    def _json_schema_type(self, schema_id: int) -> pa.DataType:
        schema = self.registry().get_schema(schema_id)
        return json_schema_type(json.loads(schema.schema_str), self._json_schema_resolver(schema))

    def _json_schema_resolver(self, schema):
        """`$ref` resolution over the schema and every schema its `references` name, recursively."""
        referenced: dict[str, dict] = {}
        pending = list(schema.references or [])
        while pending:
            ref = pending.pop()
            if ref.name not in referenced:
                found = self.registry().get_version(ref.subject, ref.version).schema
                referenced[ref.name] = json.loads(found.schema_str)
                pending.extend(found.references or [])
        return json_schema_resolver(json.loads(schema.schema_str), referenced)

    def registered_columns(self) -> dict[str, pa.DataType]:
        """Every column of every version of the value subject (`<topic>-value`), as far as the oracle can
        map them without compiling Protobuf: columns a table created from a later schema may hold."""
        if self.fmt.type == "protobuf" or self.fmt.schema_file:
            return {}
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        columns: dict[str, pa.DataType] = {}
        for topic in self.cfg.topics:
            subject = f"{topic}-value"
            try:
                versions = self.registry().get_versions(subject)
            except SchemaRegistryError:
                continue  # another subject name strategy: nothing more the oracle can allow
            for version in versions:
                schema = self.registry().get_version(subject, version).schema
                document = json.loads(schema.schema_str)
                if self.fmt.type == "json_schema":
                    made = json_schema_type(document, self._json_schema_resolver(schema))
                else:
                    made = avro_type(document)
                for name, t in struct_columns(self._payload_type(made)).items():
                    columns.setdefault(name, t)
        return columns

    def _protobuf_message(self, data: bytes, part: str) -> dict:
        from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        message_type = self._protobuf.get(part)
        assert message_type is not None, (
            f"the oracle decodes Protobuf with the producer's message class: pass protobuf={{{part!r}: <class>}}"
        )
        self.writers.saw(part, message_type.DESCRIPTOR.full_name, lambda: protobuf_type(message_type.DESCRIPTOR))
        deserialize = ProtobufDeserializer(message_type, {"use.deprecated.format": False})
        field_kind = MessageField.VALUE if part == "value" else MessageField.KEY
        return protobuf_fields(deserialize(data, SerializationContext(self.cfg.topics[0], field_kind)))

    def registry(self):
        if self._registry is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            settings = self.fmt.registry
            assert settings.url, "the oracle needs registry=<client> for a registry given as an Airflow connection"
            conf = {"url": settings.url}
            if settings.username is not None:
                conf["basic.auth.user.info"] = (
                    f"{settings.username.get_secret_value()}:{settings.password.get_secret_value()}"
                )
            self._registry = SchemaRegistryClient(conf)
        return self._registry


def debezium_row(event: dict, position: str) -> dict:
    """What a Debezium change event makes of a row, as Debezium documents its envelope: `after` for c, r
    and u, `before` for d, with the op and `source.<position>`."""
    if set(event) == {"schema", "payload"}:
        event = event["payload"]
    op = event["op"]
    assert op in ("c", "r", "u", "d"), f"op {op!r} changes no row"
    row = event["before" if op == "d" else "after"]
    assert isinstance(row, dict), f"op {op!r} without its row"
    return {**row, DEBEZIUM_OP_COLUMN: op, DEBEZIUM_POSITION_COLUMN: event["source"][position]}


def protobuf_fields(message) -> dict:
    """A Protobuf message as plain values: enums by name, Timestamps as datetimes, maps as dicts, an unset
    message or `optional` field as None (a proto3 scalar without presence reads as its default)."""
    out = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            out[f.name] = {k: _protobuf_scalar(value_field, value[k]) for k in value}
        elif f.is_repeated:
            out[f.name] = [_protobuf_scalar(f, v) for v in value]
        elif f.has_presence and not message.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _protobuf_scalar(f, value)
    return out


def _protobuf_scalar(f, value):
    if f.message_type is not None:
        if f.message_type.full_name == "google.protobuf.Timestamp":
            return value.ToDatetime(tzinfo=UTC)
        return protobuf_fields(value)
    if f.enum_type is not None:  # proto3 enums are open: a number the schema does not name is kept, as its text
        named = f.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    return value


def same(have, want) -> bool:
    """Equal values of the same types: `True` is not 1, 1 is not 1.0, a float is equal only bit for bit,
    a timestamp is the same instant in the same zone; lists, maps (as pairs) and structs item by item."""
    if have is None or want is None:
        return have is None and want is None
    if type(have) is not type(want):
        return False
    if isinstance(have, dict):
        return have.keys() == want.keys() and all(same(have[k], want[k]) for k in have)
    if isinstance(have, (list, tuple)):
        return len(have) == len(want) and all(same(h, w) for h, w in zip(have, want, strict=True))
    if isinstance(have, float):
        return struct.pack("<d", have) == struct.pack("<d", want)
    if isinstance(have, dt.datetime):
        return have == want and have.utcoffset() == want.utcoffset()
    return bool(have == want)


def coerce(value, t: pa.DataType):
    """A decoded value as a column of type `t` reads back (pyarrow's to_pylist): the JSON forms of
    timestamps, dates and binary parsed, floats narrowed, structs filled with None, maps as pairs."""
    if value is None:
        return None
    if pa.types.is_timestamp(t):
        if isinstance(value, bool):
            raise TypeError("a timestamp given as a boolean")
        if isinstance(value, (int, float)):
            moment = EPOCH + dt.timedelta(milliseconds=value)
        else:
            moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
        if t.tz is None:  # a wall-clock reading of no zone (timestamp_ntz)
            return moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)
        # An instant, read back in the column's zone (Delta's: UTC), whatever offset the record wrote it with.
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    if pa.types.is_date(t):
        return dt.date.fromisoformat(value) if isinstance(value, str) else value
    if pa.types.is_decimal(t):  # decimal text exactly, a number as its shortest text; never rounded
        if isinstance(value, decimal.Decimal):  # a registry format's decimal, decoded as one
            return value
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise TypeError(f"a decimal given as {type(value).__name__}")
        exact = decimal.Decimal(value if isinstance(value, str) else repr(value))
        if exact.as_tuple().exponent < -t.scale:
            raise ValueError(f"{value!r} has more places than scale {t.scale}")
        return exact.quantize(decimal.Decimal(1).scaleb(-t.scale))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return base64.b64decode(value, validate=True) if isinstance(value, str) else bytes(value)
    if pa.types.is_floating(t) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return value  # not a number: no column of numbers can hold it as its record has it
    if pa.types.is_float32(t):
        return struct.unpack("<f", struct.pack("<f", value))[0]
    if pa.types.is_floating(t):
        return float(value)
    if pa.types.is_struct(t):
        return {t.field(i).name: coerce(value.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_map(t):
        pairs = value.items() if isinstance(value, dict) else value
        return [(k, coerce(v, t.item_type)) for k, v in pairs]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [coerce(v, t.value_type) for v in value]
    return value


# -- the table's schema, as the docs promise it (the types: oracle_types) -----------------------------------


def _check_schema(findings: Findings, cfg, schema: pa.Schema, decoder: Decoder) -> None:
    """The table's columns are the pipeline file's and those of the writer schemas of the records it holds
    (merged as the table widens), each with its type (timestamp unit and zone, decimal precision and scale
    included) and every payload column nullable. A column no writer schema of those records has must come
    from a registered version of the value subject (the table is created from the subject's latest)."""
    expected = expected_columns(cfg)
    payload: set[str] = set()
    for part in ("value", "key"):
        merged, conflicts = decoder.writers.merged(part)
        for conflict in conflicts:
            findings.add(SCHEMA, (part, -1, -1), f"records in the table were written with clashing types: {conflict}")
        if merged is not None and part == "value":
            columns = struct_columns(merged)
            expected.update(columns)
            payload.update(columns)
        elif merged is not None:
            expected[KEY_COLUMN] = merged
    have = {f.name: f for f in schema}
    for name, want in expected.items():
        if name not in have:
            findings.add(SCHEMA, (name, -1, -1), f"column {name!r} ({want}) is not in the table")
        elif not same_type(have[name].type, want):
            findings.add(SCHEMA, (name, -1, -1), f"column {name!r} is {have[name].type}, the oracle's is {want}")
        elif name in payload and not have[name].nullable:
            findings.add(SCHEMA, (name, -1, -1), f"payload column {name!r} is not nullable")
    registered = decoder.registered_columns() if decoder.writers.registry_payload else {}
    for name in have.keys() - expected.keys():
        if name not in registered:
            findings.add(SCHEMA, (name, -1, -1), f"column {name!r} ({have[name].type}) is in no schema of its pipeline")
        elif not same_type(have[name].type, registered[name]):
            findings.add(
                SCHEMA, (name, -1, -1), f"column {name!r} is {have[name].type}, its schema's is {registered[name]}"
            )


# The quarantine's columns, as docs/usage/pipelines.md describes its table: where the record was (the lineage
# columns), its key and value bytes as Kafka holds them, why; with format.include_headers (its reference
# entry), its headers in order.
QUARANTINE_COLUMNS = {
    "kafka_topic": pa.string(),
    "kafka_partition": pa.int32(),
    "kafka_offset": pa.int64(),
    "kafka_timestamp": pa.timestamp("us", tz="UTC"),
    "key": pa.binary(),
    "value": pa.binary(),
    "error": pa.string(),
}
QUARANTINE_HEADERS = pa.map_(pa.string(), pa.binary())


def _check_quarantine_schema(findings: Findings, cfg, schema: pa.Schema | None) -> None:
    """The quarantine table has exactly the documented columns, of their types (None: it does not exist yet)."""
    if schema is None:
        return
    have = {f.name: f.type for f in schema}
    expected = dict(QUARANTINE_COLUMNS)
    if cfg.format.include_headers:
        expected[HEADERS_COLUMN] = QUARANTINE_HEADERS
    for name, want in expected.items():
        if name not in have:
            findings.add(SCHEMA, (f"quarantine.{name}", -1, -1), f"quarantine column {name!r} ({want}) is missing")
        elif not same_type(have[name], want):
            findings.add(
                SCHEMA, (f"quarantine.{name}", -1, -1), f"quarantine column {name!r} is {have[name]}, not {want}"
            )
    for name in have.keys() - expected.keys():
        findings.add(SCHEMA, (f"quarantine.{name}", -1, -1), f"quarantine column {name!r} is not a documented one")


# -- the check -------------------------------------------------------------------------------------------


@dataclass
class Findings:
    """What the oracle found wrong, by kind: each a list of (offset, message)."""

    kinds: dict[str, list[tuple[Offset, str]]] = field(default_factory=lambda: collections.defaultdict(list))
    kafka_records: int = 0
    table_rows: int = 0
    quarantined: int = 0
    journaled: int = 0  # records the producers committed, checked against their record
    # What the check left out, by kind, and how many of each it may leave out before that is a finding.
    left_out: collections.Counter = field(default_factory=collections.Counter)
    bounds: dict[str, int] = field(default_factory=dict)

    def leave_out(self, kind: str, n: int = 1) -> None:
        self.left_out[kind] += n

    def over_bounds(self) -> list[str]:
        """Each kind left out more often than its bound allows (0 unless the caller set one)."""
        return [
            f"{n} {kind} (bound {self.bounds.get(kind, 0)})"
            for kind, n in sorted(self.left_out.items())
            if n > self.bounds.get(kind, 0)
        ]

    def add(self, kind: str, where: Offset, message: str) -> None:
        self.kinds[kind].append((where, message))

    def count(self, *kinds: str) -> int:
        return sum(len(self.kinds.get(k, [])) for k in kinds)

    def examples(self, limit: int = 5) -> list[Offset]:
        return sorted(w for found in self.kinds.values() for w, _ in found)[:limit]

    @property
    def ok(self) -> bool:
        return not any(self.kinds.values()) and not self.over_bounds()

    def disagreement(self, kind: str) -> str:
        """Which two sides a finding kind sets against each other: the table against Kafka (offsetlake's
        to answer for), or Kafka against what the producers were told (the broker's, or the test's data)."""
        return KAFKA_VS_PRODUCERS if kind in NOT_THE_TABLE else TABLE_VS_KAFKA

    def count_of(self, side: str) -> int:
        return sum(len(found) for kind, found in self.kinds.items() if self.disagreement(kind) == side)

    def report(self, per_kind: int = 3) -> str:
        """The findings under two headings, so a broker's fault is never read as the table's, nor the reverse."""
        lines = []
        for side in (TABLE_VS_KAFKA, KAFKA_VS_PRODUCERS):
            kinds = [(k, found) for k, found in sorted(self.kinds.items()) if found and self.disagreement(k) == side]
            if kinds:
                lines.append(f"{side} ({sum(len(f) for _, f in kinds)}):")
            for kind, found in kinds:
                lines.append(f"  {len(found)} {kind}:")
                lines += [f"    {_where(w)}: {m}" for w, m in sorted(found)[:per_kind]]
        over = self.over_bounds()
        if over:
            lines.append(f"left out of the check past their bounds: {'; '.join(over)}")
        return "\n".join(lines)

    def left_out_summary(self) -> str:
        """Every count the check left out, with its bound: printed whether or not it passed."""
        return ", ".join(f"{n} {k} (bound {self.bounds.get(k, 0)})" for k, n in sorted(self.left_out.items()))


def _where(where: Offset) -> str:
    return f"{where[0]}[{where[1]}]@{where[2]}"


MISSING, DUPLICATED, UNEXPECTED = "records missing", "rows duplicated", "rows Kafka does not hold"
SCHEMA = "columns missing, extra or of another type than the pipeline's"
WRONG_VALUE, BOTH = "rows whose values are not their record's", "records in the table and the quarantine"
QUARANTINED_TWICE, QUARANTINE_UNEXPECTED = "records quarantined twice", "quarantine rows Kafka does not hold"
QUARANTINE_WRONG, GOOD_QUARANTINED = "quarantine rows unlike their record", "good records quarantined"
BAD_NOT_QUARANTINED = "bad records not quarantined"
PRODUCER_LOST, PRODUCER_ABORTED = (
    "records the producers committed that Kafka does not return",
    "records the producers aborted that Kafka returns",
)
PRODUCER_DIFFERS = "records Kafka returns unlike what the producers sent"
# What the check may leave out (Findings.left_out), each counted and bounded.
UNPLACED = "records acknowledged without an offset, not found below the check's end (it may lie past it)"
IN_DOUBT = "records in doubt (their transaction's end raised: only Kafka knows how it ended)"
QUARANTINE_AHEAD = "quarantine rows ahead of the ledger (a job killed between its two commits)"
BEYOND_RETENTION = "rows of records retention deleted from Kafka (below the log start: nothing to compare)"
PRODUCED_BEYOND_RETENTION = "records the producers committed that retention deleted since (below the log start)"
# The two sides a finding sets against each other (Findings.disagreement).
TABLE_VS_KAFKA = "the table disagrees with Kafka"
KAFKA_VS_PRODUCERS = "Kafka disagrees with the producers (not the table's doing)"


def _settings(cfg) -> dict:
    return {"bootstrap.servers": cfg.kafka.bootstrap_servers, **cfg.kafka.client}


def _partitions(cfg) -> list[tuple[str, int]]:
    return [(t, p) for t in cfg.topics for p in kafka_partitions(_settings(cfg), t)]


def ledger_offsets(cfg, partitions: list[tuple[str, int]] | None = None) -> dict:
    """The ledger's next offsets for `partitions` (default: every partition the broker lists)."""
    return read_ledger(
        cfg.table_location, open_table(cfg.table_location), cfg.name, partitions or _partitions(cfg)
    ).offsets


def _kafka_below(cfg, until: dict) -> dict[Offset, KafkaRecord]:
    """What Kafka returns under read_committed for every topic of the pipeline, below `until`."""
    kafka: dict[Offset, KafkaRecord] = {}
    for topic in cfg.topics:
        parts = {p: o for (t, p), o in until.items() if t == topic}
        kafka.update(read_committed(cfg.kafka.bootstrap_servers, topic, parts, cfg.kafka.client))
    return kafka


def _ledger_at_lso(cfg, caught_up: bool) -> dict:
    """The ledger's offsets; with `caught_up`, failing unless they are Kafka's LSO."""
    offsets = ledger_offsets(cfg)
    if caught_up:
        lso = {
            (t, p): end
            for t in cfg.topics
            for p, end in kafka_offsets(_settings(cfg), t, kafka_partitions(_settings(cfg), t), "latest").items()
        }
        behind = {tp: (offsets.get(tp), end) for tp, end in lso.items() if offsets.get(tp, 0) != end}
        assert not behind, f"ledger is not at the LSO: {behind}"
    return offsets


def read_with_delta_rs(location: Location) -> pa.Table:
    """The table's current version, every column, as delta-rs (the product's own engine) reads it."""
    return query(location, "SELECT * FROM t")


def check(
    cfg,
    until: dict | None = None,
    *,
    read: Callable[[Location], pa.Table] = read_with_delta_rs,
    quarantine_ahead: bool = False,
    journal: Journal = JOURNAL,
    registry=None,
    protobuf: dict | None = None,
    bounds: dict[str, int] | None = None,
    user_columns: dict[str, pa.DataType] | None = None,
) -> Findings:
    """Everything the oracle checks, below `until` ({(topic, partition): end}, default the ledger's).
    `read`: how the table and the quarantine are read (delta-spark's reader, in test_delta_spark.py).
    `user_columns`: columns a user added to the table ({name: type}), which the pipeline writes nothing to:
    each must be there, of its type, and null in every row.
    `quarantine_ahead`: quarantine rows at or past `until` are left out (a job killed between its quarantine
    commit and its table commit leaves them ahead of the ledger; the next batch skips them). Whatever is left
    out is counted (`Findings.left_out`); past its bound in `bounds` (0 by default) the check fails.

    Upsert mode (`write.mode: upsert`): the table must be the fold of what Kafka returns instead (see
    `_fold`); the quarantine and the producers are checked as in append mode."""
    until = ledger_offsets(cfg) if until is None else until
    findings = Findings(bounds=dict(bounds or {}))
    kafka = _kafka_below(cfg, until)
    log_start = {
        (t, p): start
        for t in cfg.topics
        for p, start in kafka_offsets(_settings(cfg), t, kafka_partitions(_settings(cfg), t), "earliest").items()
    }
    findings.kafka_records = len(kafka)
    table = _without_user_columns(findings, read(cfg.table_location), user_columns or {})
    findings.table_rows = table.num_rows
    quarantine_table = _quarantine_table(cfg, read)
    quarantine = {} if quarantine_table is None else _by_offset(quarantine_table.to_pylist())
    if quarantine_ahead:
        below = {k: v for k, v in quarantine.items() if k[2] < until.get(k[:2], 0)}
        findings.leave_out(QUARANTINE_AHEAD, len(quarantine) - len(below))
        quarantine = below
    findings.quarantined = sum(len(v) for v in quarantine.values())

    decoder = Decoder(cfg, registry, protobuf)
    if cfg.write.upsert:
        expected = _fold(findings, cfg, kafka, quarantine, decoder, table.schema)
        _check_against_fold(findings, cfg, table.to_pylist(), expected, log_start)
        rows: dict = {w: True for w in kafka if w not in quarantine}  # every record accounted by the fold
    else:
        rows = _by_offset(table.to_pylist())
        _check_table(findings, cfg, rows, kafka, decoder, table.schema, log_start)
    _check_schema(findings, cfg, table.schema, decoder)  # after decoding: the writer schemas are known
    _check_quarantine_schema(findings, cfg, None if quarantine_table is None else quarantine_table.schema)
    _check_quarantine(findings, quarantine, rows, kafka, log_start, cfg, decoder, table.schema)
    for topic in cfg.topics:
        journaled = journal.of_topic(topic)
        journaled.update(_place(findings, journal.unplaced(topic), journaled, kafka, topic, until, cfg))
        _check_producers(findings, journaled, kafka, rows, quarantine, until, cfg, log_start)
    return findings


def _by_offset(rows: list[dict]) -> dict[Offset, list[dict]]:
    out = collections.defaultdict(list)
    for row in rows:
        out[(row["kafka_topic"], row["kafka_partition"], row["kafka_offset"])].append(row)
    return out


def _quarantine_table(cfg, read: Callable[[Location], pa.Table] = read_with_delta_rs) -> pa.Table | None:
    """The quarantine table as `read` reads it; None before its first commit."""
    location = cfg.quarantine_location
    if not DeltaTable.is_deltatable(location.uri, location.storage_options):
        return None
    return read(location)


def _deleted_by_retention(where: Offset, log_start: dict) -> bool:
    return where[2] < log_start.get(where[:2], 0)


def _without_user_columns(findings: Findings, table: pa.Table, user_columns: dict[str, pa.DataType]) -> pa.Table:
    """The table less the columns a user added, each checked: there, of its type, null in every row."""
    for name, want in user_columns.items():
        if name not in table.column_names:
            findings.add(SCHEMA, (name, -1, -1), f"column {name!r}, added by a user, is gone")
            continue
        have = table.schema.field(name).type
        if not same_type(have, want):
            findings.add(SCHEMA, (name, -1, -1), f"column {name!r} is {have}, the user added it as {want}")
        lineage = zip(
            table["kafka_topic"].to_pylist(),
            table["kafka_partition"].to_pylist(),
            table["kafka_offset"].to_pylist(),
            table[name].to_pylist(),
        )
        for topic, partition, offset, value in lineage:
            if value is not None:
                findings.add(
                    WRONG_VALUE,
                    (topic, partition, offset),
                    f"column {name!r}, which the pipeline does not write, is {value!r}",
                )
        table = table.drop_columns([name])
    return table


def _check_table(findings: Findings, cfg, rows, kafka, decoder: Decoder, schema: pa.Schema, log_start: dict) -> None:
    """Each row its record's, and each record that is a row one the oracle's judge finds good (a bad one is a
    finding whatever its values, and whatever the producers' journal says)."""
    for where, record in kafka.items():
        if where not in rows:
            continue
        defect = quarantine_defect(cfg, decoder, record, schema)
        if defect is not None:
            findings.add(BAD_NOT_QUARANTINED, where, f"the oracle finds it bad ({defect!r}), yet it is a row")
            continue
        try:
            expected = decoder.row(record, schema)
        except Exception as err:  # noqa: BLE001 - a record the oracle cannot decode is a row that should not be
            findings.add(WRONG_VALUE, where, f"the table holds a row for a record the oracle cannot decode: {err}")
            continue
        got = rows[where][0]
        for column, want in expected.items():
            have = got.get(column)
            if column == UNKNOWN_FIELDS_COLUMN:
                have = None if have is None else json.loads(have)
            if not same(have, want):
                findings.add(WRONG_VALUE, where, f"column {column!r} is {have!r}, its record's is {want!r}")
                break
    for where, found in rows.items():
        if len(found) > 1:
            findings.add(DUPLICATED, where, f"{len(found)} rows")
        if where not in kafka:
            if _deleted_by_retention(where, log_start):
                findings.leave_out(BEYOND_RETENTION)
                continue
            findings.add(
                UNEXPECTED,
                where,
                "a row for an offset Kafka does not return under read_committed (aborted, or past the ledger's end)",
            )


def _check_quarantine(
    findings: Findings, quarantine, rows, kafka, log_start: dict, cfg, decoder: Decoder, schema: pa.Schema
) -> None:
    """Every record in the table or the quarantine once; each quarantine row its record's; each quarantined
    record one the oracle finds bad (oracle_judge), for the reason it finds."""
    for where in kafka:
        if where not in rows and where not in quarantine:
            findings.add(MISSING, where, "in neither the table nor the quarantine")
    for where, found in quarantine.items():
        if len(found) > 1:
            findings.add(QUARANTINED_TWICE, where, f"{len(found)} quarantine rows")
        if where in rows:
            findings.add(BOTH, where, "in the table and in the quarantine")
        record = kafka.get(where)
        if record is None and _deleted_by_retention(where, log_start):
            findings.leave_out(BEYOND_RETENTION)
            continue
        if record is None:
            findings.add(
                QUARANTINE_UNEXPECTED,
                where,
                "a quarantine row for an offset Kafka does not return under read_committed (aborted?)",
            )
            continue
        row = found[0]
        defect = quarantine_defect(cfg, decoder, record, schema)
        if defect is None:
            findings.add(GOOD_QUARANTINED, where, f"the oracle finds it good, quarantined as {row['error']!r}")
        elif defect not in (row["error"] or ""):
            findings.add(QUARANTINE_WRONG, where, f"quarantined as {row['error']!r}; the oracle's reason: {defect!r}")
        if cfg.format.include_headers and not same(list(row.get(HEADERS_COLUMN) or []), list(record.headers)):
            findings.add(
                QUARANTINE_WRONG, where, f"holds headers {row.get(HEADERS_COLUMN)!r}, its record {record.headers!r}"
            )
        kept = (row["key"], row["value"], row["kafka_timestamp"])
        if kept != (record.key, record.value, record.timestamp) or not row["error"]:
            findings.add(
                QUARANTINE_WRONG,
                where,
                f"holds {kept!r} with reason {row['error']!r}, its record is "
                f"{(record.key, record.value, record.timestamp)!r}",
            )


def _check_producers(
    findings: Findings, journaled: dict[Offset, Sent], kafka, rows, quarantine, until, cfg, log_start: dict
) -> None:
    registry_format = cfg.format.type not in ("json", "raw")
    for where, sent in journaled.items():
        if where[2] >= until.get(where[:2], 0):
            continue
        if sent.outcome == "in doubt":
            findings.leave_out(IN_DOUBT)
            continue
        record = kafka.get(where)
        if sent.outcome == "aborted":
            if record is not None:
                findings.add(PRODUCER_ABORTED, where, "its transaction was aborted")
            continue
        if record is None and _deleted_by_retention(where, log_start):
            findings.leave_out(PRODUCED_BEYOND_RETENTION)
            continue
        findings.journaled += 1
        if record is None:
            findings.add(PRODUCER_LOST, where, f"committed with value {_short(sent.value)!r} ({_when(sent)})")
            continue
        if (sent.key, sent.value, sent.headers) != (record.key, record.value, list(record.headers)):
            findings.add(
                PRODUCER_DIFFERS,
                where,
                f"sent {(sent.key, _short(sent.value), sent.headers)!r}, Kafka "
                f"returns {(record.key, _short(record.value), record.headers)!r}",
            )
        if sent.bad is None and where in quarantine:
            findings.add(GOOD_QUARANTINED, where, f"quarantined as {quarantine[where][0]['error']!r}")
        elif sent.bad is not None:
            reason = UNFRAMED if registry_format and sent.value in BAD_VALUES else sent.bad
            if where not in quarantine:
                findings.add(BAD_NOT_QUARANTINED, where, f"made bad ({reason}) but not in the quarantine")
            elif reason not in quarantine[where][0]["error"]:
                findings.add(
                    QUARANTINE_WRONG, where, f"quarantined as {quarantine[where][0]['error']!r}, made bad as {reason!r}"
                )


def _place(findings: Findings, unplaced: list[Sent], journaled: dict, kafka, topic: str, until: dict, cfg) -> dict:
    """{offset: sent} for each record acknowledged without an offset, found by its key, value and headers
    among the records Kafka returns that no other journaled record claims. One not found is lost when the
    check reads up to the LSO; below it, it may lie past the check's end: counted, bounded."""
    if not unplaced:
        return {}
    free = collections.defaultdict(list)
    for where, record in sorted(kafka.items()):
        if where[0] == topic and where not in journaled:
            free[(record.key, record.value, repr(list(record.headers)))].append(where)
    lso = kafka_offsets(_settings(cfg), topic, kafka_partitions(_settings(cfg), topic), "latest")
    read_to_lso = all(until.get((topic, p), 0) >= end for p, end in lso.items())
    placed = {}
    for sent in unplaced:
        found = free.get((sent.key, sent.value, repr(sent.headers)))
        if found:
            placed[found.pop(0)] = sent
        elif sent.outcome == "committed" and read_to_lso:
            findings.add(
                PRODUCER_LOST, (topic, -1, -1), f"acknowledged without an offset, value {_short(sent.value)!r}"
            )
        elif sent.outcome == "committed":
            findings.leave_out(UNPLACED)
    return placed


def _when(sent: Sent) -> str:
    """When a record was sent and its transaction ended, for a report beside the harness's event times."""
    clock = time.strftime("%H:%M:%S", time.localtime(sent.sent_at)) + f".{int(sent.sent_at % 1 * 1000):03d}"
    if sent.transaction is None:
        return f"sent {clock} outside a transaction"
    ended = time.strftime("%H:%M:%S", time.localtime(sent.ended_at)) + f".{int(sent.ended_at % 1 * 1000):03d}"
    return f"sent {clock} in transaction {sent.transaction[:8]}, ended {ended}"


def _short(value: bytes | None) -> bytes | None:
    return None if value is None else value[:40]


def assert_exactly_once(
    cfg, caught_up: bool = True, read_changes: Callable[[Location, int], pa.Table] | None = None, **options
) -> int:
    """The oracle's whole check, below the ledger's end (which, `caught_up`, must be Kafka's LSO): fails
    naming the offsets of each kind of finding. Returns the table's row count. `read_changes`: how the
    change feed is read, from a version on (default delta-rs' load_cdf)."""
    offsets = _ledger_at_lso(cfg, caught_up)
    findings = check(cfg, offsets, **options)
    assert findings.ok, f"the oracle found, in {cfg.table_path}:\n{findings.report()}"
    if cfg.write.upsert and cfg.write.change_data_feed:
        replays = change_feed_replays(cfg, read_changes or changes_with_delta_rs, options.get("read"))
        assert replays, "the change data feed does not replay to the table"
    return findings.table_rows


# -- upsert mode ------------------------------------------------------------------------------------------

KEY_IN_TWO_PLACES = "keys the fold finds in two partitions (the test's data, not the table)"
NOT_THE_TABLE = {PRODUCER_LOST, PRODUCER_ABORTED, PRODUCER_DIFFERS, KEY_IN_TWO_PLACES}


def upsert_key(row: dict, key: list[str]) -> str:
    """A row's key as a hashable value (a struct key is a dict)."""
    return json.dumps([row.get(c) for c in key], sort_keys=True, default=repr)


def _fold(findings: Findings, cfg, kafka, quarantine, decoder: Decoder, schema: pa.Schema) -> dict[str, tuple]:
    """{key: (offset, row)}: the fold of every record not quarantined, a deleted key's row None."""
    write = cfg.write
    latest: dict[str, tuple[Offset, dict | None]] = {}
    for where in sorted(kafka):
        if where in quarantine:
            continue
        record = kafka[where]
        defect = quarantine_defect(cfg, decoder, record, schema)
        if defect is not None:
            findings.add(BAD_NOT_QUARANTINED, where, f"the oracle finds it bad ({defect!r}), not quarantined")
            continue
        if record.value is None:  # a tombstone
            if write.deletes == "ignore" or cfg.format.envelope == "debezium":  # debezium: its `d` deleted
                continue
            row = {}
            if cfg.format.type == "raw":
                row["key"] = record.key
            if cfg.format.key is not None:
                row[KEY_COLUMN] = decoder._key(record.key, schema.field(KEY_COLUMN).type)
            deleted = True
        else:
            try:
                row = decoder.row(record, schema)
            except Exception as err:  # noqa: BLE001 - the record is bad: it must be in the quarantine
                findings.add(BAD_NOT_QUARANTINED, where, f"the oracle cannot decode it ({err}), not quarantined")
                continue
            deleted = row.get(DEBEZIUM_OP_COLUMN) == "d"
            if deleted and write.deletes == "ignore":
                continue
        if any(row.get(c) is None for c in write.required):
            findings.add(BAD_NOT_QUARANTINED, where, f"a null in {write.required}, not quarantined")
            continue
        key = upsert_key(row, write.key)
        known = latest.get(key)
        if known is not None and write.order_by is None and known[0][:2] != where[:2]:
            findings.add(KEY_IN_TWO_PLACES, where, f"key {key} also at {_where(known[0])}")
        if known is not None and write.order_by is not None and known[1] is not None:
            if row[write.order_by] < known[1][write.order_by]:
                continue
        latest[key] = (where, None if deleted else row)
    return latest


def _check_against_fold(findings: Findings, cfg, rows: list[dict], folded: dict[str, tuple], log_start: dict) -> None:
    expected = {k: v for k, v in folded.items() if v[1] is not None}
    by_key = collections.defaultdict(list)
    for row in rows:
        by_key[upsert_key(row, cfg.write.key)].append(row)
    for key, found in by_key.items():
        where = (found[0]["kafka_topic"], found[0]["kafka_partition"], found[0]["kafka_offset"])
        if len(found) > 1:
            findings.add(DUPLICATED, where, f"{len(found)} rows for key {key}")
        if key not in expected:
            if key not in folded and _deleted_by_retention(where, log_start):  # the fold saw no record of it
                findings.leave_out(BEYOND_RETENTION)
                continue
            findings.add(UNEXPECTED, where, f"a row for key {key}, which the fold deletes or never saw")
            continue
        want_at, want = expected[key]
        if where != want_at:
            findings.add(
                WRONG_VALUE, where, f"key {key} holds the record at {_where(where)}, the fold's is {_where(want_at)}"
            )
            continue
        for column, value in want.items():
            have = found[0].get(column)
            if column == UNKNOWN_FIELDS_COLUMN:
                have = None if have is None else json.loads(have)
            if not same(have, value):
                findings.add(WRONG_VALUE, where, f"key {key}: column {column!r} is {have!r}, its record's is {value!r}")
                break
    for key, (want_at, _) in expected.items():
        if key not in by_key:
            findings.add(MISSING, want_at, f"key {key} is not in the table")


def changes_with_delta_rs(location: Location, starting_version: int) -> pa.Table:
    table = location.delta_table()
    return pa.table(table.load_cdf(starting_version=starting_version))


def change_feed_state(cfg, read_changes: Callable[[Location, int], pa.Table] = changes_with_delta_rs) -> list[dict]:
    """The table as its change data feed replays it: from its creation, or, when log clean-up has removed
    the first commits, from the table as of its oldest checkpoint. Inserts and post-images set a key's
    row, deletes remove it. Each row's columns as the table's (the feed's own left out)."""
    base = _oldest_loadable_version(cfg.table_location)
    state: dict[str, dict] = {}
    if base is not None:
        old = cfg.table_location.delta_table(base)
        rows = QueryBuilder().register("t", old).execute("SELECT * FROM t").read_all()
        state = {upsert_key(r, cfg.write.key): r for r in pa.table(rows).to_pylist()}
    changes = read_changes(cfg.table_location, 0 if base is None else base + 1).to_pylist()
    order = {"delete": 0, "update_preimage": 0, "insert": 1, "update_postimage": 1}
    for change in sorted(changes, key=lambda c: (c["_commit_version"], order[c["_change_type"]])):
        kind = change.pop("_change_type")
        change.pop("_commit_version"), change.pop("_commit_timestamp")
        key = upsert_key(change, cfg.write.key)
        if kind in ("delete", "update_preimage"):
            state.pop(key, None)
        else:
            state[key] = change
    return sorted(state.values(), key=lambda r: upsert_key(r, cfg.write.key))


def _oldest_loadable_version(location: Location) -> int | None:
    """None when the log still starts at version 0; else its oldest checkpoint's version."""
    import pyarrow.fs as pafs

    fs, root = location.filesystem()
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{root.rstrip('/')}/_delta_log"))]
    if "00000000000000000000.json" in names:
        return None
    checkpoints = sorted(int(n.split(".")[0]) for n in names if ".checkpoint" in n and n.endswith(".parquet"))
    assert checkpoints, f"{location}: no version 0 and no checkpoint in the log"
    return checkpoints[0]


def change_feed_replays(
    cfg,
    read_changes: Callable[[Location, int], pa.Table] = changes_with_delta_rs,
    read: Callable[[Location], pa.Table] | None = None,
) -> bool:
    """True when the change data feed, replayed from the table's creation, builds the table row by row
    (the table as `read` reads it; default delta-rs)."""
    rows = (read(cfg.table_location) if read else query(cfg.table_location, "SELECT * FROM t")).to_pylist()
    table = sorted(rows, key=lambda r: upsert_key(r, cfg.write.key))
    return change_feed_state(cfg, read_changes) == table
