"""The oracle's pure parts: how a producer's record becomes committed, aborted or in doubt, and how a
decoded value is put in the form a column reads back in (the rest is proved in integration/test_oracle.py)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from offsetlake_local.producer import BAD_VALUES
from oracle import BAD_REASON, Journal, coerce


class Delivered:
    """What librdkafka hands a delivery callback: where the record went."""

    def __init__(self, partition: int, offset: int):
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


def test_a_record_is_committed_aborted_or_in_doubt_as_its_producer_saw_it():
    journal = Journal()
    journal.sent("t", {"key": b"k", "value": b"alone"}, None)(None, Delivered(0, 0))
    journal.sent("t", {"value": b"kept"}, "tx1")(None, Delivered(0, 1))
    journal.sent("t", {"value": b"dropped"}, "tx2")(None, Delivered(1, 0))
    journal.sent("t", {"value": b"unsure"}, "tx3")(None, Delivered(1, 1))
    journal.sent("t", {"value": b"never written"}, None)("broker gone", None)
    journal.ended("tx1", committed=True)
    journal.ended("tx2", committed=False)

    outcomes = {where: (sent.value, sent.outcome) for where, sent in journal.of_topic("t").items()}

    assert outcomes == {
        ("t", 0, 0): (b"alone", "committed"),
        ("t", 0, 1): (b"kept", "committed"),
        ("t", 1, 0): (b"dropped", "aborted"),
        ("t", 1, 1): (b"unsure", "in doubt"),
    }


def test_a_record_acknowledged_without_an_offset_is_kept_aside_to_be_placed_by_the_check():
    """librdkafka acknowledges a retried write the broker already held with offset -1 (None in Python)."""
    journal = Journal()
    journal.sent("t", {"value": b"retried"}, "tx1")(None, Delivered(0, None))
    journal.sent("t", {"value": b"placed"}, "tx1")(None, Delivered(0, 7))
    journal.ended("tx1", committed=True)

    assert list(journal.of_topic("t")) == [("t", 0, 7)]
    assert [(s.value, s.outcome) for s in journal.unplaced("t")] == [(b"retried", "committed")]
    assert journal.unplaced("other") == []


def test_the_demo_producers_bad_values_carry_their_reason_and_headers_keep_their_order():
    journal = Journal()
    journal.sent("t", {"value": BAD_VALUES[1], "headers": [("b", "2"), ("a", b"1")]}, None)(None, Delivered(0, 0))
    journal.sent("t", {"value": b"{}"}, None, bad="made bad by hand")(None, Delivered(0, 1))

    sent = journal.of_topic("t")

    assert sent[("t", 0, 0)].bad == BAD_REASON[BAD_VALUES[1]] == "field 'user_id': expected an integer"
    assert sent[("t", 0, 0)].headers == [("b", b"2"), ("a", b"1")]
    assert sent[("t", 0, 1)].bad == "made bad by hand"


def test_decoded_values_take_the_form_their_column_reads_back_in():
    utc = dt.UTC
    stamp = pa.timestamp("us", tz="UTC")
    assert coerce("2026-11-23T10:00:07.5Z", stamp) == dt.datetime(2026, 11, 23, 10, 0, 7, 500000, tzinfo=utc)
    assert coerce("2026-11-23T10:00:07", stamp) == dt.datetime(2026, 11, 23, 10, 0, 7, tzinfo=utc)  # naive: UTC
    assert coerce(1_700_000_000_123, stamp) == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc)
    assert coerce("2026-11-23", pa.date32()) == dt.date(2026, 11, 23)
    assert coerce("aGk=", pa.binary()) == b"hi"
    assert coerce(0.1, pa.float32()) != 0.1 and abs(coerce(0.1, pa.float32()) - 0.1) < 1e-7
    assert coerce(3, pa.float64()) == 3.0
    point = pa.struct([("lat", pa.float64()), ("lon", pa.float64())])
    assert coerce({"lat": 1}, point) == {"lat": 1.0, "lon": None}
    assert coerce({"b": 2, "a": 1}, pa.map_(pa.string(), pa.int64())) == [("b", 2), ("a", 1)]
    assert coerce([{"lat": 1, "lon": 2}], pa.list_(point)) == [{"lat": 1.0, "lon": 2.0}]
    assert coerce(None, pa.string()) is None
