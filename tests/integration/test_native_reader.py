"""The native reader (offsetlake.read.native) returns what confluent-kafka's reader returns, record for record,
and what Kafka holds under read_committed (the oracle's own consumer), on the embedded Apache Kafka broker:
aborted transactions and their markers, null and empty keys and values, headers (repeated names, null
values, names outside ASCII), both timestamp types, ranges that start and end anywhere, small chunks. Its
failures are the confluent-kafka reader's: records gone from Kafka, a topic that does not exist."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from offsetlake.errors import DataLossError, KafkaError
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read.reader import read_range
from support import (
    JournaledProducer,
    create_topic,
    kafka_committed_records,
    kafka_settings,
    produce,
    unique,
    wait_for_markers,
)

ODD_RECORDS = [
    # (key, value, headers)
    (None, b'{"id": 1}', None),
    (b"", b"", [("h", b"1"), ("h", None), ("h", b"")]),
    (b"k", None, [("trace-\u00e9t\u00e9", b"\x00\xff")]),
    (None, None, None),
    (b"big", b"x" * 300_000, [("n", b"v" * 1000)]),
]


def _read(bootstrap: str, rng: OffsetRange, use_native: bool, headers: bool = True, chunk: int = 20_000):
    batches = list(read_range(kafka_settings(bootstrap), "test-native", rng, 10, chunk, headers, use_native))
    return pa.Table.from_batches(batches) if batches else None


def _high(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "isolation.level": "read_committed"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def mixed_topic(bootstrap):
    """Two partitions of committed, aborted and plain records, with odd records between them."""
    topic = unique("native")
    create_topic(bootstrap, topic, 2)
    settings = kafka_settings(bootstrap)
    produce(settings, topic, 1500, transactional_share=0.6, abort_share=0.3, seed=41)
    odd = JournaledProducer(bootstrap)
    for partition in (0, 1):
        for key, value, headers in ODD_RECORDS:
            odd.produce(topic, value, key, headers, partition=partition)
    odd.flush()
    produce(settings, topic, 1500, transactional_share=0.6, abort_share=0.3, seed=42)
    wait_for_markers({"bootstrap.servers": bootstrap}, topic)
    return topic


def test_the_native_reader_reads_what_kafka_holds_as_confluent_kafka_does(bootstrap, mixed_topic):
    committed = kafka_committed_records(bootstrap, mixed_topic, whole=True)
    for partition in (0, 1):
        end = _high(bootstrap, mixed_topic, partition)
        whole = OffsetRange(mixed_topic, partition, 0, end)
        native_table, python_table = _read(bootstrap, whole, True), _read(bootstrap, whole, False)
        assert native_table is not None and native_table.equals(python_table), partition
        assert native_table.schema.equals(python_table.schema, check_metadata=True)
        expected = {o: kv for (t, p, o), kv in committed.items() if p == partition}
        rows = native_table.to_pylist()
        assert [r["kafka_offset"] for r in rows] == sorted(expected)
        for row in rows:
            key, value, headers = expected[row["kafka_offset"]]
            assert (row["key"], row["value"], row["headers"] or None) == (key, value, headers or None)
            assert row["kafka_timestamp"] is not None
        seen = [(r["key"], r["value"], r["headers"] or None) for r in rows]
        for key, value, headers in ODD_RECORDS:
            assert (key, value, headers) in seen


@pytest.mark.parametrize("chunk", [1, 7, 20_000])
def test_ranges_that_start_and_end_anywhere_read_alike(bootstrap, mixed_topic, chunk):
    end = _high(bootstrap, mixed_topic, 0)
    for start, stop in [(0, 1), (3, end // 3), (end // 3, end // 2 + 1), (end - 9, end), (end - 1, end)]:
        rng = OffsetRange(mixed_topic, 0, start, stop)
        native_table = _read(bootstrap, rng, True, headers=False, chunk=chunk)
        python_table = _read(bootstrap, rng, False, headers=False, chunk=chunk)
        if python_table is None:  # only markers and aborted records in the range
            assert native_table is None, rng
            continue
        assert native_table is not None and native_table.equals(python_table), rng
        offsets = native_table.column("kafka_offset").to_pylist()
        assert offsets == sorted(offsets) and start <= offsets[0] and offsets[-1] < stop


def test_log_append_time_is_read_as_the_broker_stamped_it(bootstrap):
    topic = unique("native-append-time")
    create_topic(bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
    producer = JournaledProducer(bootstrap)
    for i in range(20):
        producer.produce(topic, b"v%d" % i, partition=0)
    producer.flush()
    rng = OffsetRange(topic, 0, 0, 20)
    native_table, python_table = _read(bootstrap, rng, True), _read(bootstrap, rng, False)
    assert native_table is not None and native_table.equals(python_table)
    assert native_table.column("kafka_timestamp").null_count == 0


def test_records_gone_from_kafka_fail_both_readers_alike(bootstrap):
    topic = unique("native-gone")
    create_topic(bootstrap, topic, 1)
    producer = JournaledProducer(bootstrap)
    for i in range(50):
        producer.produce(topic, b"v%d" % i, partition=0)
    producer.flush()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for deleted in admin.delete_records([TopicPartition(topic, 0, 30)]).values():
        deleted.result()
    for use_native in (True, False):
        with pytest.raises(DataLossError, match=rf"{topic}\[0\] offsets from 0 are no longer in Kafka"):
            _read(bootstrap, OffsetRange(topic, 0, 0, 50), use_native)


def test_a_missing_topic_fails_both_readers_alike(bootstrap):
    rng = OffsetRange(unique("native-missing"), 0, 0, 10)
    messages = []
    for use_native in (True, False):
        with pytest.raises(KafkaError, match=rf"read of {rng.topic}") as failed:
            _read(bootstrap, rng, use_native)
        messages.append(str(failed.value))
    assert messages[0] == messages[1]
