"""A reader's messages to one Arrow batch (`reader._to_batch`), column by column: every value, null key,
null value, header and timestamp kind as librdkafka hands them over."""

from __future__ import annotations

import datetime as dt

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message

from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read.reader import _to_batch, message_schema

RANGE = OffsetRange("orders", 3, 100, 200)


def message(offset: int, key, value, timestamp, headers=None) -> Message:
    return Message(
        topic="orders", partition=3, offset=offset, key=key, value=value, timestamp=timestamp, headers=headers
    )


def test_each_message_is_one_row_with_its_key_value_offset_and_timestamp():
    messages = [
        message(100, b"k1", b"v1", (TIMESTAMP_CREATE_TIME, 1_795_000_000_123)),
        message(101, None, None, (TIMESTAMP_LOG_APPEND_TIME, 0)),  # a tombstone without a key, at the epoch
        message(105, b"", b"", (TIMESTAMP_NOT_AVAILABLE, -1)),  # offsets skip markers and aborted records
        message(106, b"k4", b"v4", (TIMESTAMP_CREATE_TIME, -5)),  # a negative time: none
    ]
    batch = _to_batch(messages, [100, 101, 105, 106], RANGE, headers=False)
    assert batch.schema == message_schema(False)
    assert batch.to_pylist() == [
        {
            "key": b"k1",
            "value": b"v1",
            "kafka_topic": "orders",
            "kafka_partition": 3,
            "kafka_offset": 100,
            "kafka_timestamp": dt.datetime(2026, 11, 18, 11, 6, 40, 123000, tzinfo=dt.UTC),
        },
        {
            "key": None,
            "value": None,
            "kafka_topic": "orders",
            "kafka_partition": 3,
            "kafka_offset": 101,
            "kafka_timestamp": dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        },
        {
            "key": b"",
            "value": b"",
            "kafka_topic": "orders",
            "kafka_partition": 3,
            "kafka_offset": 105,
            "kafka_timestamp": None,
        },
        {
            "key": b"k4",
            "value": b"v4",
            "kafka_topic": "orders",
            "kafka_partition": 3,
            "kafka_offset": 106,
            "kafka_timestamp": None,
        },
    ]


def test_no_keys_at_all_make_a_null_key_column_and_headers_keep_order_and_duplicates():
    messages = [
        message(100, None, b"v", (TIMESTAMP_CREATE_TIME, 1), [("h", b"1"), ("h", None), ("a", b"2")]),
        message(101, None, b"w", (TIMESTAMP_CREATE_TIME, 2)),
    ]
    batch = _to_batch(messages, [100, 101], RANGE, headers=True)
    assert batch.schema == message_schema(True)
    assert batch.column("key").null_count == 2
    assert batch.column("headers").to_pylist() == [[("h", b"1"), ("h", None), ("a", b"2")], []]
