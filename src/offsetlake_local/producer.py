"""Demo and test data: JSON events written by an idempotent and a transactional producer.

Some transactions are aborted on purpose (after their records reached the
broker, so they occupy offsets): a correct reader must never let one through.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from offsetlake.config import KafkaSettings
from offsetlake.errors import KafkaError
from offsetlake.kafka import client_settings, retrying

ACTIONS = ("view", "click", "add_to_cart", "purchase", "refund")


@dataclass
class ProduceReport:
    committed: int = 0
    aborted: int = 0
    transactions: int = 0
    aborted_transactions: int = 0

    def __str__(self) -> str:
        return (
            f"produced {self.committed} committed records ({self.transactions} transactions, "
            f"{self.aborted_transactions} aborted holding {self.aborted} records that readers must skip)"
        )


class Journal(Protocol):
    """What a producer tells a record keeper (the tests' producer-side truth): each record as it is sent,
    and how its transaction ended. `transaction` is None for a record written outside a transaction."""

    def sent(self, topic: str, record: dict, transaction: str | None) -> Callable:
        """Called before the record is produced; returns its delivery callback (err, msg)."""

    def ended(self, transaction: str, committed: bool) -> None:
        """The transaction's records are committed (or aborted) now."""


def ensure_topic(settings: KafkaSettings, topic: str, partitions: int) -> None:
    admin = AdminClient(client_settings(settings))
    if topic in admin.list_topics(timeout=settings.timeout_seconds).topics:
        return
    future = admin.create_topics([NewTopic(topic, partitions)])[topic]  # the broker's replication factor
    try:
        future.result()
    except KafkaException as err:
        if "TOPIC_ALREADY_EXISTS" not in str(err):
            raise KafkaError(f"cannot create topic {topic!r}: {err}") from err


def demo_event(rng: random.Random, seq: int) -> tuple[bytes, bytes]:
    user = rng.randrange(1, 5000)
    now = dt.datetime.now(dt.UTC)
    event = {
        "event_id": uuid.UUID(int=rng.getrandbits(128)).hex[:20],
        "user_id": user,
        "action": rng.choice(ACTIONS),
        "amount": round(rng.uniform(0, 500), 2),
        "event_time": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "seq": seq,
    }
    return str(user).encode(), json.dumps(event, separators=(",", ":")).encode()


# The demo event in Avro, as a Schema Registry subject would hold it: version 2 adds a field (a
# compatible change), so a topic carrying both shows a column arriving with its first record.
DEMO_AVRO_V1 = {
    "type": "record",
    "name": "DemoEvent",
    "namespace": "offsetlake.demo",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "user_id", "type": "long"},
        {"name": "action", "type": {"type": "enum", "name": "Action", "symbols": [a.upper() for a in ACTIONS]}},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "seq", "type": "long"},
    ],
}
DEMO_AVRO_V2 = {
    **DEMO_AVRO_V1,
    "fields": [*DEMO_AVRO_V1["fields"], {"name": "country", "type": ["null", "string"], "default": None}],
}
COUNTRIES = ("DE", "FR", "IN", "JP", "US")


def registry_client(url: str, username: str | None = None, password: str | None = None):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    conf = {"url": url}
    if username is not None:
        conf["basic.auth.user.info"] = f"{username}:{password}"
    return SchemaRegistryClient(conf)


def avro_event_maker(client, topic: str, version: int = 1, headers: bool = True):
    """A record maker for `produce`: demo events in Avro (Confluent wire format, the schema registered by
    confluent-kafka's AvroSerializer under "<topic>-value"), the user id as a string key, two headers."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = DEMO_AVRO_V2 if version >= 2 else DEMO_AVRO_V1
    serialize = AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})
    context = SerializationContext(topic, MessageField.VALUE)

    def make(rng: random.Random, seq: int):
        user = rng.randrange(1, 5000)
        event = {
            "event_id": uuid.UUID(int=rng.getrandbits(128)).hex[:20],
            "user_id": user,
            "action": rng.choice(ACTIONS).upper(),
            "amount": round(rng.uniform(0, 500), 2),
            "event_time": dt.datetime.now(dt.UTC),
            "seq": seq,
        }
        if version >= 2:
            event["country"] = rng.choice(COUNTRIES)
        extra = [("source", b"offsetlake-demo"), ("seq", str(seq).encode())] if headers else None
        return str(user).encode(), serialize(event, context), extra

    return make


def transactional_producer(settings: KafkaSettings, transactional_id: str, **extra) -> Producer:
    """A transactional producer, initialised. A metadata request goes first: librdkafka 2.16 asks for the
    transaction coordinator only once a connection is up, and otherwise retries on a timer, which held
    `init_transactions` back (docs/development/measurements.md)."""
    producer = Producer(client_settings(settings, **{"transactional.id": transactional_id, "linger.ms": 5, **extra}))
    producer.list_topics(timeout=settings.timeout_seconds)
    # A broker just started may still be loading its transaction coordinator (COORDINATOR_LOAD_IN_PROGRESS,
    # retriable): librdkafka lets init_transactions be called again, for up to kafka.retry_seconds.
    retrying(
        f"producer {transactional_id}: cannot initialise transactions",
        lambda: producer.init_transactions(settings.timeout_seconds),
        settings.retry_seconds,
    )
    return producer


BAD_VALUES = (
    b'{"event_id": "broken',  # not JSON
    b'{"event_id": "e", "user_id": "not a number"}',  # wrong type
    b'{"action": "view"}',  # required fields missing
    b"\xff\xfe not utf-8",
)


def keyed(make_record, keys: int, tombstone_share: float = 0.0):
    """A record maker whose records are keyed 1..`keys` (a keyed topic: most records update a key, for an
    upsert pipeline), a `tombstone_share` of them tombstones (a null value: the key is deleted)."""

    def make(rng: random.Random, seq: int):
        _, value, *headers = make_record(rng, seq)
        key = str(rng.randint(1, keys)).encode()
        return (key, None if rng.random() < tombstone_share else value, *headers)

    return make


def with_bad_records(make_record, share: float):
    """A record maker that emits records the demo schema rejects, with probability `share`."""

    def make(rng: random.Random, seq: int):
        key, value, *headers = make_record(rng, seq)
        return (key, rng.choice(BAD_VALUES), *headers) if rng.random() < share else (key, value, *headers)

    return make


def _record(made: tuple) -> dict:
    """A record maker returns (key, value) or (key, value, headers)."""
    key, value, *headers = made
    return {"key": key, "value": value, **({"headers": headers[0]} if headers and headers[0] else {})}


def _send(producer: Producer, topic: str, record: dict, journal: Journal | None, transaction: str | None) -> None:
    if journal is None:
        producer.produce(topic, **record)
    else:
        producer.produce(topic, **record, on_delivery=journal.sent(topic, record, transaction))


def produce(
    settings: KafkaSettings,
    topic: str,
    count: int,
    *,
    transactional_share: float = 0.5,
    abort_share: float = 0.2,
    transaction_size: int = 50,
    seed: int | None = None,
    transactional_id: str | None = None,
    make_record=demo_event,
    bad_share: float = 0.0,
    journal: Journal | None = None,
) -> ProduceReport:
    """Write `count` committed records; transactional chunks are aborted with probability `abort_share`.
    `journal` is told of every record and of how each transaction ended."""
    rng = random.Random(seed)
    if bad_share:
        make_record = with_bad_records(make_record, bad_share)
    report = ProduceReport()
    idempotent = Producer(client_settings(settings, **{"enable.idempotence": True, "linger.ms": 5}))
    base_id = transactional_id or f"offsetlake-demo-{uuid.uuid4().hex[:8]}"
    transactional = transactional_producer(settings, base_id)
    try:
        seq = 0
        while report.committed < count:
            size = min(transaction_size, count - report.committed)
            if rng.random() >= transactional_share:
                for _ in range(size):
                    _send(idempotent, topic, _record(make_record(rng, seq)), journal, None)
                    seq += 1
                idempotent.flush(settings.timeout_seconds)
                report.committed += size
                continue
            abort = rng.random() < abort_share
            transactional.begin_transaction()
            transaction = f"{base_id}:{report.transactions}"
            for _ in range(size):
                _send(transactional, topic, _record(make_record(rng, seq)), journal, transaction)
                seq += 1
            unsent = transactional.flush(settings.timeout_seconds)  # aborted records must reach the log
            report.transactions += 1
            if abort:
                transactional.abort_transaction(settings.timeout_seconds)
                if journal is not None:
                    journal.ended(transaction, committed=False)
                report.aborted += size
                report.aborted_transactions += 1
                if unsent:
                    # The abort purged records the broker may hold without having answered; this producer
                    # would number the next transaction's records from them again, under the same epoch,
                    # and the broker would answer those as duplicates of the aborted ones.
                    transactional = transactional_producer(settings, f"{base_id}-{report.transactions}")
            else:
                transactional.commit_transaction(settings.timeout_seconds)
                if journal is not None:
                    journal.ended(transaction, committed=True)
                report.committed += size
    except KafkaException as err:
        raise KafkaError(f"producing to {topic!r} failed: {err.args[0].str() if err.args else err}") from err
    finally:
        idempotent.flush(5)
    return report
