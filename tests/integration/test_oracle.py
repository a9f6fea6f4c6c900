"""The oracle proved: a real table, ingested from a real broker, corrupted in each way the oracle must
catch; each corruption must fail the check with a finding of its kind that names the offset."""

from __future__ import annotations

import random
import shutil

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import oracle
from offsetlake.batch import ingest
from offsetlake.table import query
from support import produce


@pytest.fixture
def ingested(spark, pipeline):
    """A JSON pipeline over 2 partitions: committed, aborted and bad records, ingested and caught up."""
    cfg, topic = pipeline(partitions=2)
    produce(cfg.kafka, topic, 600, transactional_share=0.6, abort_share=0.3, bad_share=0.05, seed=26)
    ingest(spark, cfg)
    assert oracle.check(cfg).ok
    return cfg, topic


def copy_of(cfg, tmp_path, name: str):
    """The pipeline with its table and quarantine copied, so each corruption starts from the real thing."""
    table, quarantine = tmp_path / name / "table", tmp_path / name / "quarantine"
    shutil.copytree(cfg.table_path, table)
    shutil.copytree(cfg.quarantine_path, quarantine)
    return cfg.model_copy(
        update={
            "table": cfg.table.model_copy(update={"path": str(table)}),
            "quarantine": cfg.quarantine.model_copy(update={"path": str(quarantine)}),
        }
    )


def at(where: tuple) -> str:
    return f"kafka_partition = {where[1]} AND kafka_offset = {where[2]}"


def rows_at(path: str, where: tuple) -> pa.Table:
    """The Delta table's own rows at an offset, in its own schema (for appending them again)."""
    table = DeltaTable(path).to_pyarrow_table()
    mask = pa.compute.and_(
        pa.compute.equal(table["kafka_partition"], where[1]), pa.compute.equal(table["kafka_offset"], where[2])
    )
    return table.filter(mask)


def swap_event_ids(cfg, good: list, **_) -> list:
    a, b = good[0], good[1]
    ids = {w: query(cfg.table_path, f"SELECT event_id FROM t WHERE {at(w)}").column(0)[0].as_py() for w in (a, b)}
    table = DeltaTable(cfg.table_path)
    table.update(predicate=at(a), updates={"event_id": f"'{ids[b]}'"})
    DeltaTable(cfg.table_path).update(predicate=at(b), updates={"event_id": f"'{ids[a]}'"})
    return [(oracle.WRONG_VALUE, a), (oracle.WRONG_VALUE, b)]


def change_a_field(cfg, good: list, **_) -> list:
    DeltaTable(cfg.table_path).update(predicate=at(good[2]), updates={"amount": "amount + 0.01"})
    return [(oracle.WRONG_VALUE, good[2])]


def shift_a_timestamp(cfg, good: list, **_) -> list:
    DeltaTable(cfg.table_path).update(
        predicate=at(good[3]), updates={"kafka_timestamp": "kafka_timestamp + INTERVAL '1 millisecond'"}
    )
    return [(oracle.WRONG_VALUE, good[3])]


def duplicate_a_row(cfg, good: list, **_) -> list:
    write_deltalake(cfg.table_path, rows_at(cfg.table_path, good[4]), mode="append")
    return [(oracle.DUPLICATED, good[4])]


def remove_a_row(cfg, good: list, **_) -> list:
    DeltaTable(cfg.table_path).delete(at(good[5]))
    return [(oracle.MISSING, good[5])]


def quarantine_a_good_record(cfg, good: list, kafka: dict, **_) -> list:
    where = good[6]
    DeltaTable(cfg.table_path).delete(at(where))
    write_deltalake(cfg.quarantine_path, quarantine_row(cfg, where, kafka[where]), mode="append")
    return [(oracle.GOOD_QUARANTINED, where)]


def quarantine_an_aborted_record(cfg, aborted: list, journaled: dict, **_) -> list:
    where = aborted[0]
    sent = journaled[where]
    record = oracle.KafkaRecord(sent.key, sent.value, sent.headers, oracle.EPOCH)
    write_deltalake(cfg.quarantine_path, quarantine_row(cfg, where, record), mode="append")
    return [(oracle.QUARANTINE_UNEXPECTED, where)]


def quarantine_twice(cfg, bad: list, **_) -> list:
    write_deltalake(cfg.quarantine_path, rows_at(cfg.quarantine_path, bad[0]), mode="append")
    return [(oracle.QUARANTINED_TWICE, bad[0])]


def quarantine_row(cfg, where: tuple, record) -> pa.Table:
    schema = DeltaTable(cfg.quarantine_path).to_pyarrow_table().schema
    row = {
        "kafka_topic": where[0],
        "kafka_partition": where[1],
        "kafka_offset": where[2],
        "kafka_timestamp": record.timestamp,
        "key": record.key,
        "value": record.value,
        "error": "made up",
    }
    return pa.Table.from_pylist([row], schema=schema)


CORRUPTIONS = [
    swap_event_ids,
    change_a_field,
    shift_a_timestamp,
    duplicate_a_row,
    remove_a_row,
    quarantine_a_good_record,
    quarantine_an_aborted_record,
    quarantine_twice,
]


def test_the_oracle_fails_each_corruption_naming_its_offset(ingested, tmp_path):
    cfg, topic = ingested
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    journaled = oracle.JOURNAL.of_topic(topic)
    good = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is None)
    bad = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is not None)
    aborted = sorted(w for w, s in journaled.items() if s.outcome == "aborted")
    assert len(good) > 100 and bad and aborted
    random.Random(26).shuffle(good)

    missed = []
    for corrupt in CORRUPTIONS:
        copy = copy_of(cfg, tmp_path, corrupt.__name__)
        expected = corrupt(copy, good=good, bad=bad, aborted=aborted, kafka=kafka, journaled=journaled)
        findings = oracle.check(copy)
        report = findings.report(per_kind=50)
        for kind, where in expected:
            named = [w for w, _ in findings.kinds.get(kind, [])]
            if where not in named or f"{where[0]}[{where[1]}]@{where[2]}" not in report:
                missed.append(f"{corrupt.__name__}: no {kind!r} naming {where}; found:\n{report}")
        with pytest.raises(AssertionError, match=rf"@{expected[0][1][2]}\b"):
            oracle.assert_exactly_once(copy)
    assert not missed, "\n".join(missed)


def test_the_oracle_fails_a_loss_that_read_committed_hides(ingested):
    """Producer-side truth: a record its producer committed that Kafka does not return (as if a broker or
    client bug dropped it under read_committed) fails the check, though the table matches Kafka."""
    cfg, topic = ingested
    journal = oracle.Journal()
    aborted = next(w for w, s in sorted(oracle.JOURNAL.of_topic(topic).items()) if s.outcome == "aborted")
    sent = oracle.JOURNAL.of_topic(topic)[aborted]
    lost = oracle.Sent(sent.key, sent.value, sent.headers, None, outcome="committed")
    journal.add(aborted, lost)  # the producer's record says committed; Kafka's read_committed skips it

    findings = oracle.check(cfg, journal=journal)

    assert [w for w, _ in findings.kinds[oracle.PRODUCER_LOST]] == [aborted]
