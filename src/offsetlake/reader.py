"""Read exactly one offset range [start, end) of one partition. Runs in Spark executors.

Offsets are not dense: transaction markers occupy offsets, aborted records are
skipped under read_committed and compacted topics have holes. So a range is
complete when the consumer's *position* reaches `end`, never when some number
of records has arrived; anything at or past `end` belongs to the next batch.
No group subscription and no commits: the Delta table is the only ledger.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError as _KErr, KafkaException, TopicPartition

from offsetlake.config import KafkaSettings
from offsetlake.errors import DataLossError, KafkaError
from offsetlake.kafka import client_settings, librdkafka_log

log = logging.getLogger("offsetlake.reader")

MESSAGE_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("kafka_topic", pa.string()),
    ("kafka_partition", pa.int32()),
    ("kafka_offset", pa.int64()),
    ("kafka_timestamp", pa.timestamp("ms", tz="UTC")),
])
# With format.include_headers: every header, in order, duplicates kept (Kafka allows them).
HEADERS_FIELD = pa.field("headers", pa.map_(pa.string(), pa.binary()))


def message_schema(headers: bool) -> pa.Schema:
    return MESSAGE_SCHEMA.append(HEADERS_FIELD) if headers else MESSAGE_SCHEMA
_LOST = {_KErr._AUTO_OFFSET_RESET, _KErr.OFFSET_OUT_OF_RANGE}
_FATAL = {_KErr.UNKNOWN_TOPIC_OR_PART, _KErr._UNKNOWN_TOPIC, _KErr._UNKNOWN_PARTITION,
          _KErr.TOPIC_AUTHORIZATION_FAILED, _KErr._AUTHENTICATION, _KErr.SASL_AUTHENTICATION_FAILED}


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] [{self.start}, {self.end})"


def reader_settings(settings: KafkaSettings, group: str) -> dict:
    return client_settings(
        settings,
        **{
            "group.id": group,  # required by librdkafka; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",  # a missing offset is data loss, never a silent jump
            "enable.partition.eof": True,
            "isolation.level": settings.isolation_level,
            "queued.max.messages.kbytes": 65536,
            "fetch.max.bytes": 52428800,
            # noida-db 0.2.3 ignores fetch.max.bytes and answers with the partition's whole tail
            # (a 140 MB response was measured for 1M records); librdkafka's 100 MB default then
            # rejects every response and the read stalls. Apache Kafka honours fetch.max.bytes.
            "receive.message.max.bytes": 1_000_000_000,
        },
    )


def read_range(settings: KafkaSettings, group: str, rng: OffsetRange, stall_seconds: float,
               chunk: int = 20_000, headers: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield the records of `rng` as Arrow batches (`message_schema(headers)`), in offset order."""
    if rng.size <= 0:
        return
    # In an executor nobody configured logging: librdkafka's own lines would reach stderr, one a second
    # per consumer while a broker is away. The reader logs each distinct error once instead (below).
    librdkafka_log.setLevel(logging.CRITICAL)
    consumer = Consumer(reader_settings(settings, group))
    # A broker restarting or a leader moving shows as transient errors that librdkafka retries on its
    # own; while they last, the read may wait up to kafka.retry_seconds instead of the stall limit.
    transient: set[str] = set()
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        position, last_progress = rng.start, time.monotonic()
        while position < rng.end:
            # consume() waits for num_messages or the timeout: asking for no more than the range can
            # still hold, with a short timeout, keeps the last call of a small range from idling.
            messages = consumer.consume(num_messages=min(chunk, rng.end - position), timeout=0.1)
            columns = _empty_columns(headers)
            for msg in messages:
                err = msg.error()
                if err is not None:
                    position = max(position, _handle_error(err, msg, rng, position))
                    if err.code() != _KErr._PARTITION_EOF and err.str() not in transient:
                        transient.add(err.str())
                        log.warning("read of %s: %s; waiting for the broker (up to %s s)", rng, err.str(),
                                    max(stall_seconds, settings.retry_seconds))
                    continue
                offset = msg.offset()
                if offset >= rng.end:
                    position = rng.end
                    break
                _append(columns, msg, offset)
                position = offset + 1
            if columns["kafka_offset"]:
                last_progress = time.monotonic()
                transient.clear()
                yield _to_batch(columns, rng, headers)
            if position < rng.end and not messages:
                # Markers and aborted records move the position without yielding anything.
                fetched = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
                if fetched > position:
                    position, last_progress = fetched, time.monotonic()
            limit = max(stall_seconds, settings.retry_seconds) if transient else stall_seconds
            if position < rng.end and time.monotonic() - last_progress > limit:
                raise KafkaError(f"read of {rng} stalled at offset {position} for {limit:.0f}s "
                                 f"(broker at {settings.bootstrap_servers} unreachable or topic truncated)")
    except KafkaException as err:
        raise KafkaError(f"read of {rng} failed: {err.args[0].str() if err.args else err}") from None
    finally:
        consumer.close()


def _handle_error(err, msg, rng: OffsetRange, position: int) -> int:
    code = err.code()
    if code == _KErr._PARTITION_EOF:
        return msg.offset()  # the end of what is readable now (LSO or high watermark)
    if code in _LOST:
        raise DataLossError(f"records lost: {rng.topic}[{rng.partition}] offsets from {position} are no "
                            f"longer in Kafka (retention or truncation) while reading {rng}")
    if code in _FATAL or err.fatal():
        raise KafkaError(f"read of {rng} failed: {err.str()}")
    return position  # transient (broker restart, leader change): librdkafka retries


def _empty_columns(headers: bool) -> dict[str, list]:
    columns = {"key": [], "value": [], "kafka_offset": [], "kafka_timestamp": []}
    if headers:
        columns["headers"] = []
    return columns


def _append(columns: dict[str, list], msg, offset: int) -> None:
    columns["key"].append(msg.key())
    columns["value"].append(msg.value())
    columns["kafka_offset"].append(offset)
    ts_type, ts = msg.timestamp()
    columns["kafka_timestamp"].append(ts if ts_type and ts >= 0 else None)
    if "headers" in columns:
        columns["headers"].append(msg.headers() or [])  # [(name, bytes | None)]


def _to_batch(columns: dict[str, list], rng: OffsetRange, headers: bool) -> pa.RecordBatch:
    n = len(columns["kafka_offset"])
    arrays = [
        pa.array(columns["key"], pa.binary()),
        pa.array(columns["value"], pa.binary()),
        pa.repeat(pa.scalar(rng.topic, pa.string()), n),
        pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
        pa.array(columns["kafka_offset"], pa.int64()),
        pa.array(columns["kafka_timestamp"], pa.timestamp("ms", tz="UTC")),
    ]
    if headers:
        arrays.append(pa.array(columns["headers"], HEADERS_FIELD.type))
    return pa.record_batch(arrays, schema=message_schema(headers))
