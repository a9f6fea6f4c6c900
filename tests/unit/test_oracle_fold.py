"""The upsert oracle's fold (`oracle._fold`), on records written here: which record of a key wins, what a
tombstone does, and what the fold itself reports. Pure logic: the records are Python values, no broker."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa

import oracle
from offsetlake.config import parse_pipeline
from oracle_types import LINEAGE_TYPES

WHEN = dt.datetime(2026, 11, 26, tzinfo=dt.UTC)
SCHEMA = pa.schema([("id", pa.int64()), ("seq", pa.int64()), ("kafka_key", pa.string()), *LINEAGE_TYPES.items()])


def pipeline(**write):
    return parse_pipeline(
        {
            "name": "p",
            "topics": ["t"],
            "kafka": {"bootstrap_servers": "x:1"},
            "table": {"path": "/tmp/x"},
            "format": {
                "type": "json",
                "schema": [{"name": "id", "type": "long"}, {"name": "seq", "type": "long"}],
                "key": {"type": "string"},
            },
            "write": {"mode": "upsert", "key": ["kafka_key"], **write},
        },
        "p.yaml",
    )


def record(key: str, seq: int | None, value_id: int = 1) -> oracle.KafkaRecord:
    """A record of `key`; `seq` None: a tombstone."""
    value = None if seq is None else json.dumps({"id": value_id, "seq": seq}).encode()
    return oracle.KafkaRecord(key.encode(), value, [], WHEN)


def fold(cfg, records: dict, quarantine: dict | None = None) -> tuple[dict, oracle.Findings]:
    findings = oracle.Findings()
    folded = oracle._fold(findings, cfg, records, quarantine or {}, oracle.Decoder(cfg), SCHEMA)
    return {json.loads(k)[0]: (where, row and row["seq"]) for k, (where, row) in folded.items()}, findings


def test_the_last_record_of_a_key_in_offset_order_wins():
    folded, findings = fold(
        pipeline(), {("t", 0, 3): record("a", 3), ("t", 0, 1): record("a", 1), ("t", 0, 2): record("b", 2)}
    )
    assert folded == {"a": (("t", 0, 3), 3), "b": (("t", 0, 2), 2)} and findings.ok


def test_a_tombstone_deletes_its_key_and_a_later_record_brings_it_back():
    records = {("t", 0, 1): record("a", 1), ("t", 0, 2): record("a", None), ("t", 0, 3): record("b", 3)}
    folded, _ = fold(pipeline(), records)
    assert folded == {"a": (("t", 0, 2), None), "b": (("t", 0, 3), 3)}  # a deleted: its row None

    folded, _ = fold(pipeline(), {**records, ("t", 0, 4): record("a", 4)})
    assert folded["a"] == (("t", 0, 4), 4)


def test_deletes_ignore_skips_tombstones():
    records = {("t", 0, 1): record("a", 1), ("t", 0, 2): record("a", None)}
    folded, _ = fold(pipeline(deletes="ignore"), records)
    assert folded == {"a": (("t", 0, 1), 1)}


def test_with_order_by_the_greatest_value_wins_whatever_its_partition_or_offset():
    records = {("t", 0, 1): record("a", 9), ("t", 1, 5): record("a", 4), ("t", 1, 6): record("a", 10)}
    folded, findings = fold(pipeline(order_by="seq", deletes="ignore"), records)
    assert folded == {"a": (("t", 1, 6), 10)} and findings.ok

    folded, _ = fold(pipeline(order_by="seq", deletes="ignore"), {k: records[k] for k in list(records)[:2]})
    assert folded == {"a": (("t", 0, 1), 9)}  # the later offset with a smaller seq does not win


def test_quarantined_records_are_not_folded():
    records = {("t", 0, 1): record("a", 1), ("t", 0, 2): record("a", 2)}
    folded, _ = fold(pipeline(), records, quarantine={("t", 0, 2): [{}]})
    assert folded == {"a": (("t", 0, 1), 1)}


def test_the_fold_reports_a_key_in_two_partitions_without_order_by_and_an_undecodable_record():
    records = {
        ("t", 0, 1): record("a", 1),
        ("t", 1, 1): record("a", 2),
        ("t", 1, 2): oracle.KafkaRecord(b"b", b"not json", [], WHEN),
    }
    _, findings = fold(pipeline(), records)
    assert [w for w, _ in findings.kinds[oracle.KEY_IN_TWO_PLACES]] == [("t", 1, 1)]
    assert [w for w, _ in findings.kinds[oracle.BAD_NOT_QUARANTINED]] == [("t", 1, 2)]


def test_a_record_with_a_null_key_column_must_have_been_quarantined():
    _, findings = fold(pipeline(), {("t", 0, 1): oracle.KafkaRecord(None, b'{"id": 1, "seq": 1}', [], WHEN)})
    assert [w for w, _ in findings.kinds[oracle.BAD_NOT_QUARANTINED]] == [("t", 0, 1)]
