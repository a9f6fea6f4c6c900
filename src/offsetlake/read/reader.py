"""Read exactly one offset range [start, end) of one partition. Runs in Spark executors.

Offsets are not dense: transaction markers occupy offsets, aborted records are
skipped under read_committed and compacted topics have holes. So a range is
complete when the consumer's *position* reaches `end`, never when some number
of records has arrived; anything at or past `end` belongs to the next batch.
No group subscription and no commits: the Delta table is the only ledger.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka import KafkaError as _KErr

from offsetlake.config import KafkaSettings
from offsetlake.errors import DataLossError, KafkaError
from offsetlake.kafka import client_settings, librdkafka_log
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read import native
from offsetlake.read.native import NativeChunk, NativeConsumer, NativeOpenError, NativeReadError
from offsetlake.spark.allocator import keep_freed_memory

log = logging.getLogger("offsetlake.read.reader")

MESSAGE_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("kafka_topic", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("ms", tz="UTC")),
    ]
)
# With format.include_headers: every header, in order, duplicates kept (Kafka allows them).
HEADERS_FIELD = pa.field("headers", pa.map_(pa.string(), pa.binary()))


def message_schema(headers: bool) -> pa.Schema:
    return MESSAGE_SCHEMA.append(HEADERS_FIELD) if headers else MESSAGE_SCHEMA


_LOST = {_KErr._AUTO_OFFSET_RESET, _KErr.OFFSET_OUT_OF_RANGE}
_AFTER_MS = re.compile(r" \(after \d+ms in state \w+\)")
_FATAL = {
    _KErr.UNKNOWN_TOPIC_OR_PART,
    _KErr._UNKNOWN_TOPIC,
    _KErr._UNKNOWN_PARTITION,
    _KErr.TOPIC_AUTHORIZATION_FAILED,
    _KErr._AUTHENTICATION,
    _KErr.SASL_AUTHENTICATION_FAILED,
}


# ---- fetch sizing ------------------------------------------------------------------------------------
# A reader reads one partition, so its per-partition limit is its whole fetch. librdkafka's default
# `max.partition.fetch.bytes` is 1 MiB: on Apache Kafka, which honours it, a reader then gets ~1 MiB per round
# trip, and a fetch's round trip, not decoding, bounds a reader (docs/development/measurements.md).
# 16 MiB: as fast as 50 MiB on Apache Kafka, and a worker's peak no longer grows with the backlog
# (docs/development/measurements.md).
FETCH_BYTES = 16 * 1024 * 1024  # one response: fetch.max.bytes = max.partition.fetch.bytes
# librdkafka keeps fetching ahead while a partition's queue holds less than this (and fewer than
# queued.min.messages); a fetch in flight may overshoot it by one response. So what one reader holds in
# librdkafka is at most QUEUE_BYTES + FETCH_BYTES, whatever the backlog.
QUEUE_BYTES = 16 * 1024 * 1024
# Once its queue holds more than QUEUE_BYTES, librdkafka waits fetch.queue.backoff.ms before it looks again
# (1,000 ms by default): a reader that drains its queue in a tenth of that then sits idle
# (docs/development/measurements.md). The queue's bound stands: the fetcher still fetches only below it.
FETCH_QUEUE_BACKOFF_MS = 10
# The largest response librdkafka accepts (it must exceed fetch.max.bytes by 512 at least). A response never
# exceeds FETCH_BYTES, plus one record batch, which the broker sends whole when it alone is larger (a
# topic's max.message.bytes bounds that): room for a batch of up to 64 MiB. A bound, not a buffer.
RECEIVE_BYTES = FETCH_BYTES + 64 * 1024 * 1024
READ_BATCH_RECORDS = 20_000  # the most records of one batch a reader gives


def reader_memory_bound(chunk_records: int, record_bytes: int) -> int:
    """What one reader holds at most, in bytes, on a broker that honours fetch limits: librdkafka's queue,
    one fetch response in flight, and what a task holds of its range as Arrow (`record_bytes` each, lineage
    columns included): one chunk (`chunk_records`, tasks.CHUNK_RECORDS) and the batch after it. A task holds
    two readers' librdkafka buffers at once (it fetches the next range while writing the current one's last
    chunk), so a task's bound is this plus QUEUE_BYTES + FETCH_BYTES."""
    return QUEUE_BYTES + FETCH_BYTES + (chunk_records + READ_BATCH_RECORDS) * record_bytes


def reader_settings(settings: KafkaSettings, group: str, **extra: Any) -> dict:
    return client_settings(
        settings,
        **extra,
        **{
            "group.id": group,  # required by librdkafka; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",  # a missing offset is data loss, never a silent jump
            "enable.partition.eof": True,
            "isolation.level": settings.isolation_level,
            "queued.max.messages.kbytes": QUEUE_BYTES // 1024,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            "fetch.max.bytes": FETCH_BYTES,
            "max.partition.fetch.bytes": FETCH_BYTES,
            "receive.message.max.bytes": RECEIVE_BYTES,
        },
    )


def read_range(
    settings: KafkaSettings,
    group: str,
    rng: OffsetRange,
    stall_seconds: float,
    chunk: int = READ_BATCH_RECORDS,
    headers: bool = False,
    use_native: bool | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of `rng` as Arrow batches (`message_schema(headers)`), in offset order.
    `use_native`: read with the native reader (offsetlake.read.native), through confluent-kafka, or (None)
    with the native one wherever it is available."""
    with RangeReader(settings, group, rng, stall_seconds, chunk, headers, use_native) as reader:
        yield from reader


class RangeReader:
    """The reader of one range, fetching from the moment it is made: librdkafka's threads fetch and parse
    while the caller does other work (a task converts and writes one range while the next is fetched).
    Iterate it once for the batches; close it (or use it as a context manager) in any case."""

    def __init__(
        self,
        settings: KafkaSettings,
        group: str,
        rng: OffsetRange,
        stall_seconds: float,
        chunk: int = READ_BATCH_RECORDS,
        headers: bool = False,
        use_native: bool | None = None,
    ):
        self.settings, self.rng, self.stall_seconds, self.chunk, self.headers = (
            settings,
            rng,
            stall_seconds,
            chunk,
            headers,
        )
        self._consumer: Consumer | NativeConsumer | None = None
        if rng.size <= 0:
            return
        # In an executor nobody configured logging: librdkafka's own lines would reach stderr, one a second
        # per consumer while a broker is away. The reader logs each distinct error once instead (below).
        librdkafka_log.setLevel(logging.CRITICAL)
        keep_freed_memory()  # before the first consumer's threads: they then allocate from the one heap
        # A whole cluster away shows in no message: librdkafka reports it (all brokers down, connections
        # refused) only to error_cb, which runs inside consume(). Those reports count as transient errors.
        self._client_errors: list[str] = []
        client = reader_settings(settings, group, error_cb=self._client_error)
        if use_native is None:
            use_native = native.usable(client)
        elif use_native and not native.usable(client):
            raise KafkaError(f"read of {rng}: the native reader cannot read here (see offsetlake.read.native)")
        if use_native:
            try:
                self._consumer = NativeConsumer(client, rng.topic, rng.partition, rng.start)
            except NativeOpenError as err:
                raise KafkaError(f"read of {rng} failed: {err}") from err
            return
        self._consumer = Consumer(client)
        try:
            self._consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        except KafkaException as err:
            self.close()
            raise _read_failed(rng, err) from err

    def _client_error(self, err) -> None:
        # "Connect to ... failed: Connection refused (after 1ms in state CONNECT)": one error, whatever the ms.
        self._client_errors.append(_AFTER_MS.sub("", err.str()))

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._consumer is None:
            return
        try:
            yield from self._batches(self._consumer)
        except KafkaException as err:
            raise _read_failed(self.rng, err) from err
        finally:
            self.close()

    def _waiting(self, error: str, transient: set[str]) -> None:
        """A transient error: remembered (the read may wait up to kafka.retry_seconds), logged once."""
        if error not in transient:
            transient.add(error)
            limit = max(self.stall_seconds, self.settings.retry_seconds)
            log.warning("read of %s: %s; waiting for the broker (up to %s s)", self.rng, error, limit)

    def _batches(self, consumer: Consumer | NativeConsumer) -> Iterator[pa.RecordBatch]:
        rng, settings, stall_seconds = self.rng, self.settings, self.stall_seconds
        take: Callable[[int], _Taken] = (
            functools.partial(self._take_native, consumer)
            if isinstance(consumer, NativeConsumer)
            else functools.partial(self._take, consumer)
        )
        # A broker restarting or a leader moving shows as transient errors that librdkafka retries on its
        # own; while they last, the read may wait up to kafka.retry_seconds instead of the stall limit.
        transient: set[str] = set()
        position, last_progress = rng.start, time.monotonic()
        while position < rng.end:
            # consume() waits for num_messages or the timeout: asking for no more than the range can
            # still hold, with a short timeout, keeps the last call of a small range from idling.
            taken = take(min(self.chunk, rng.end - position))
            for err, offset in taken.errors:  # rare: the readable end, a broker away
                position = max(position, _handle_error(err, offset, rng, position))
                if err.code() != _KErr._PARTITION_EOF:
                    self._waiting(err.str(), transient)
            while self._client_errors:  # the cluster, not this partition: a broker away, all of them
                self._waiting(self._client_errors.pop(0), transient)
            if taken.received:
                if taken.cut:  # the rest belongs to the next batch
                    position = rng.end
                elif taken.last_offset is not None:
                    position = max(position, taken.last_offset + 1)
                if taken.batch is not None:
                    last_progress = time.monotonic()
                    transient.clear()
                    yield taken.batch
            elif position < rng.end:
                # Markers and aborted records move the position without yielding anything.
                fetched = _position(consumer, rng)
                if fetched > position:
                    position, last_progress = fetched, time.monotonic()
            limit = max(stall_seconds, settings.retry_seconds) if transient else stall_seconds
            if position < rng.end and time.monotonic() - last_progress > limit:
                raise KafkaError(
                    f"read of {rng} stalled at offset {position} for {limit:.0f}s "
                    f"(broker at {settings.bootstrap_servers} unreachable or topic truncated)"
                )

    def _take(self, consumer: Consumer, wanted: int) -> _Taken:
        rng = self.rng
        messages = consumer.consume(num_messages=wanted, timeout=CONSUME_TIMEOUT_MS / 1000)
        errors: list[tuple[_KErr, int]] = []
        if any(m.error() is not None for m in messages):
            errors = [(cast(_KErr, m.error()), cast(int, m.offset())) for m in messages if m.error() is not None]
            messages = [m for m in messages if m.error() is None]
        if not messages:
            return _Taken(errors, False, False, None, None)
        # One column at a time, not one record at a time: the per-record Python work is what bounds a
        # reader (offsets ascend within a partition, so `end` cuts the list once).
        offsets = cast(list[int], list(map(Message.offset, messages)))  # never None once consumed
        cut = bisect.bisect_left(offsets, rng.end)
        messages, offsets, was_cut = messages[:cut], offsets[:cut], cut < len(offsets)
        if not offsets:
            return _Taken(errors, True, was_cut, None, None)
        return _Taken(errors, True, was_cut, offsets[-1], _to_batch(messages, offsets, rng, self.headers))

    def _take_native(self, consumer: NativeConsumer, wanted: int) -> _Taken:
        rng = self.rng
        try:
            chunk = consumer.consume(wanted, CONSUME_TIMEOUT_MS, rng.end, self.headers)
        except NativeReadError as err:
            raise KafkaError(f"read of {rng} failed: {err}") from err
        self._client_errors.extend(_AFTER_MS.sub("", error) for error in consumer.take_client_errors())
        errors = [(_KErr(code, text), offset) for code, offset, text in chunk.errors]
        if not chunk.length:
            return _Taken(errors, chunk.cut, chunk.cut, None, None)
        return _Taken(errors, True, chunk.cut, chunk.last_offset, _native_batch(chunk, rng, self.headers))


class _Taken(NamedTuple):
    """What one consume gave a reader: the messages' errors with their offsets, whether any message that is
    not an error came, whether one was at or past the range's end, and the rest as a batch."""

    errors: list[tuple[_KErr, int]]
    received: bool
    cut: bool
    last_offset: int | None
    batch: pa.RecordBatch | None


CONSUME_TIMEOUT_MS = 100


def _position(consumer: Consumer | NativeConsumer, rng: OffsetRange) -> int:
    if isinstance(consumer, NativeConsumer):
        return consumer.position()
    return consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset


def _read_failed(rng: OffsetRange, err: KafkaException) -> KafkaError:
    return KafkaError(f"read of {rng} failed: {err.args[0].str() if err.args else err}")


def _handle_error(err, offset: int, rng: OffsetRange, position: int) -> int:
    code = err.code()
    if code == _KErr._PARTITION_EOF:
        return offset  # the end of what is readable now (LSO or high watermark)
    if code in _LOST:
        raise DataLossError(
            f"records lost: {rng.topic}[{rng.partition}] offsets from {position} are no "
            f"longer in Kafka (retention or truncation) while reading {rng}"
        )
    if code in _FATAL or err.fatal():
        raise KafkaError(f"read of {rng} failed: {err.str()}")
    return position  # transient (broker restart, leader change): librdkafka retries


def _to_batch(messages: list, offsets: list[int], rng: OffsetRange, headers: bool) -> pa.RecordBatch:
    # Message's methods mapped over the list, the timestamps' (type, ms) pairs straight into numpy: no Python
    # bytecode runs per message here.
    n = len(offsets)
    keys = list(map(Message.key, messages))
    stamps = np.fromiter(itertools.chain.from_iterable(map(Message.timestamp, messages)), np.int64, count=2 * n)
    kinds, times = stamps[0::2], np.ascontiguousarray(stamps[1::2])
    missing = (kinds == TIMESTAMP_NOT_AVAILABLE) | (times < 0)
    return _message_batch(
        rng,
        pa.nulls(n, pa.binary()) if keys.count(None) == n else pa.array(keys, pa.binary()),
        pa.array(list(map(Message.value, messages)), pa.binary()),
        pa.array(offsets, pa.int64()),
        pa.array(times, _TIMESTAMP, mask=missing if missing.any() else None),
        # every header, in order: [(name, bytes | None)]
        pa.array([m.headers() or [] for m in messages], HEADERS_FIELD.type) if headers else None,
    )


def _native_batch(chunk: NativeChunk, rng: OffsetRange, headers: bool) -> pa.RecordBatch:
    """The same batch as _to_batch, from the native reader's columns (no copy)."""
    return _message_batch(
        rng,
        chunk.keys(),
        chunk.values(),
        chunk.offsets(),
        chunk.timestamps(_TIMESTAMP),
        chunk.headers(HEADERS_FIELD.type) if headers else None,
    )


_TIMESTAMP = MESSAGE_SCHEMA.field("kafka_timestamp").type


def _message_batch(
    rng: OffsetRange,
    keys: pa.Array,
    values: pa.Array,
    offsets: pa.Array,
    timestamps: pa.Array,
    headers: pa.Array | None,
) -> pa.RecordBatch:
    """A range's messages as `message_schema`: their columns, and the range's topic and partition."""
    n = len(offsets)
    arrays = [
        keys,
        values,
        pa.repeat(pa.scalar(rng.topic, pa.string()), n),
        pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
        offsets,
        timestamps,
    ]
    if headers is not None:
        arrays.append(headers)
    return pa.record_batch(arrays, schema=message_schema(headers is not None))
