"""The oracle proved: a real table, ingested from a real broker, corrupted in each way the oracle must
catch; each corruption must fail the check with a finding of its kind that names the offset."""

from __future__ import annotations

import datetime as dt
import json
import random
import shutil
from dataclasses import dataclass

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import oracle
from offsetlake.batch import ingest
from offsetlake.table import query
from offsetlake_local.producer import avro_event_maker, demo_event, registry_client
from support import new_pipeline, produce

KEY_AND_HEADERS = {"key": {"type": "string"}, "include_headers": True}


def with_headers(make):
    """A record maker whose records carry two headers, one of them twice in a row (Kafka allows it)."""

    def made(rng, seq):
        key, value = make(rng, seq)[:2]
        return key, value, [("source", b"oracle-test"), ("seq", str(seq).encode()), ("seq", None)]

    return made


@dataclass
class Ingested:
    """A real table and quarantine, and what the producers recorded, by outcome."""

    cfg: object
    topic: str
    kafka: dict
    journaled: dict
    good: list  # committed, made good (shuffled)
    bad: list  # committed, made bad
    aborted: list


@pytest.fixture(scope="module", params=["json", "avro"])
def ingested(request, spark, bootstrap, schema_registry, tmp_path_factory) -> Ingested:
    """A pipeline over 2 partitions with a key and headers, in JSON or in Avro through the registry:
    committed, aborted and bad records, ingested and caught up. One per module: each test corrupts a copy."""
    base = tmp_path_factory.mktemp(f"oracle-{request.param}")
    if request.param == "json":
        fmt, make = KEY_AND_HEADERS, with_headers(demo_event)
    else:
        user, password = schema_registry.user, schema_registry.password
        registry = {"url": schema_registry.url, "username": user, "password": password}
        fmt = {"type": "avro", "schema": [], "registry": registry, **KEY_AND_HEADERS}
        make = None
    cfg, topic = new_pipeline(bootstrap, base / "pipelines", base / "lake", partitions=2, format=fmt)
    if make is None:
        make = avro_event_maker(registry_client(schema_registry.url, user, password), topic, 1)
    produce(cfg.kafka, topic, 600, transactional_share=0.6, abort_share=0.3, bad_share=0.05, seed=26, make_record=make)
    ingest(spark, cfg)
    assert oracle.check(cfg).ok, oracle.check(cfg).report()
    journaled = oracle.JOURNAL.of_topic(topic)
    good = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is None)
    bad = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is not None)
    aborted = sorted(w for w, s in journaled.items() if s.outcome == "aborted")
    assert len(good) > 100 and len(bad) >= 5 and len(aborted) >= 2
    random.Random(26).shuffle(good)
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    return Ingested(cfg, topic, kafka, journaled, good, bad, aborted)


def copy_of(cfg, tmp_path, name: str):
    """The pipeline with its table and quarantine copied, so each corruption starts from the real thing."""
    table, quarantine = tmp_path / name / "table", tmp_path / name / "quarantine"
    shutil.copytree(cfg.table_path, table)
    if DeltaTable.is_deltatable(cfg.quarantine_path):  # none before a first bad record
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
    ids = {w: query(cfg.table_location, f"SELECT event_id FROM t WHERE {at(w)}").column(0)[0].as_py() for w in (a, b)}
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


def row_for_an_aborted_record(cfg, good: list, aborted: list, **_) -> list:
    """A row made in the table's own shape for an offset Kafka skips under read_committed."""
    row = rows_at(cfg.table_path, good[7]).to_pylist()[0]
    row.update(kafka_partition=aborted[1][1], kafka_offset=aborted[1][2])
    schema = DeltaTable(cfg.table_path).to_pyarrow_table().schema
    write_deltalake(cfg.table_path, pa.Table.from_pylist([row], schema=schema), mode="append")
    return [(oracle.UNEXPECTED, aborted[1])]


def in_the_table_and_the_quarantine(cfg, good: list, kafka: dict, **_) -> list:
    where = good[8]
    write_deltalake(cfg.quarantine_path, quarantine_row(cfg, where, kafka[where]), mode="append")
    return [(oracle.BOTH, where)]


def change_a_header(cfg, good: list, **_) -> list:
    """A header's value changed: the record's headers, in order, are the row's."""
    where = good[9]
    rewrite(
        cfg.table_path,
        where,
        lambda row: {**row, "kafka_headers": [("source", b"elsewhere"), *row["kafka_headers"][1:]]},
    )
    return [(oracle.WRONG_VALUE, where)]


def drop_a_repeated_header(cfg, good: list, **_) -> list:
    """The second of two headers of one name gone (a map of headers would keep only one)."""
    where = good[10]
    rewrite(cfg.table_path, where, lambda row: {**row, "kafka_headers": row["kafka_headers"][:-1]})
    return [(oracle.WRONG_VALUE, where)]


def change_a_key(cfg, good: list, **_) -> list:
    where = good[11]
    rewrite(cfg.table_path, where, lambda row: {**row, "kafka_key": row["kafka_key"] + "0"})
    return [(oracle.WRONG_VALUE, where)]


def rewrite(path: str, where: tuple, change) -> None:
    """The row at `where` deleted and written again with `change(row)` applied."""
    row = rows_at(path, where)
    schema = row.schema
    changed = change(row.to_pylist()[0])
    DeltaTable(path).delete(at(where))
    write_deltalake(path, pa.Table.from_pylist([changed], schema=schema), mode="append")


def quarantine_row_unlike_its_record(cfg, bad: list, **_) -> list:
    rewrite(cfg.quarantine_path, bad[1], lambda row: {**row, "value": b"not what Kafka holds"})
    return [(oracle.QUARANTINE_WRONG, bad[1])]


def quarantine_reason_made_up(cfg, bad: list, **_) -> list:
    rewrite(cfg.quarantine_path, bad[2], lambda row: {**row, "error": "made up"})
    return [(oracle.QUARANTINE_WRONG, bad[2])]


def quarantine_headers_unlike_the_records(cfg, bad: list, **_) -> list:
    rewrite(cfg.quarantine_path, bad[4], lambda row: {**row, "kafka_headers": [("source", b"elsewhere")]})
    return [(oracle.QUARANTINE_WRONG, bad[4])]


def bad_record_not_quarantined(cfg, bad: list, **_) -> list:
    DeltaTable(cfg.quarantine_path).delete(at(bad[3]))
    return [(oracle.MISSING, bad[3]), (oracle.BAD_NOT_QUARANTINED, bad[3])]


def _table_rows(cfg) -> list[tuple[tuple, dict]]:
    rows = DeltaTable(cfg.table_path).to_pyarrow_table().to_pylist()
    return [((r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]), r) for r in rows]


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
    if "kafka_headers" in schema.names:
        row["kafka_headers"] = list(record.headers)
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
    row_for_an_aborted_record,
    in_the_table_and_the_quarantine,
    quarantine_row_unlike_its_record,
    quarantine_reason_made_up,
    quarantine_headers_unlike_the_records,
    bad_record_not_quarantined,
    change_a_header,
    drop_a_repeated_header,
    change_a_key,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda corrupt: corrupt.__name__)
def test_the_oracle_fails_each_corruption_naming_its_offset(ingested, tmp_path, corrupt):
    """One corruption of a copy of the real table: a finding of its kind naming the offset, in the report and
    in the failure of `assert_exactly_once`."""
    copy = copy_of(ingested.cfg, tmp_path, corrupt.__name__)
    i = ingested
    expected = corrupt(copy, good=i.good, bad=i.bad, aborted=i.aborted, kafka=i.kafka, journaled=i.journaled)

    findings = oracle.check(copy)

    report = findings.report(per_kind=50)
    for kind, where in expected:
        named = [w for w, _ in findings.kinds.get(kind, [])]
        assert where in named and f"{where[0]}[{where[1]}]@{where[2]}" in report, (
            f"no {kind!r} naming {where}:\n{report}"
        )
    with pytest.raises(AssertionError, match=rf"@{expected[0][1][2]}\b"):
        oracle.assert_exactly_once(copy)


def test_the_oracle_fails_a_loss_that_read_committed_hides(ingested):
    """Producer-side truth: a record its producer committed that Kafka does not return (as if a broker or
    client bug dropped it under read_committed) fails the check, though the table matches Kafka."""
    cfg, topic = ingested.cfg, ingested.topic
    journal = oracle.Journal()
    aborted = next(w for w, s in sorted(oracle.JOURNAL.of_topic(topic).items()) if s.outcome == "aborted")
    sent = oracle.JOURNAL.of_topic(topic)[aborted]
    lost = oracle.Sent(sent.key, sent.value, sent.headers, None, outcome="committed")
    journal.add(aborted, lost)  # the producer's record says committed; Kafka's read_committed skips it

    findings = oracle.check(cfg, journal=journal)

    assert [w for w, _ in findings.kinds[oracle.PRODUCER_LOST]] == [aborted]
    assert findings.disagreement(oracle.PRODUCER_LOST) == oracle.KAFKA_VS_PRODUCERS


def test_the_oracle_fails_kafka_returning_what_the_producers_aborted_or_did_not_send(ingested):
    """The other two ways Kafka can disagree with its producers: a record they aborted comes back, a record
    comes back unlike what they sent. Neither is the table's doing, and the report says so."""
    cfg, topic = ingested.cfg, ingested.topic
    committed = sorted(w for w, s in oracle.JOURNAL.of_topic(topic).items() if s.outcome == "committed")
    first, second = committed[0], committed[1]
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    journal = oracle.Journal()
    record = kafka[first]
    journal.add(first, oracle.Sent(record.key, record.value, list(record.headers), None, outcome="aborted"))
    other = kafka[second]
    journal.add(second, oracle.Sent(other.key, b"something else", list(other.headers), None, outcome="committed"))

    findings = oracle.check(cfg, journal=journal)

    assert [w for w, _ in findings.kinds[oracle.PRODUCER_ABORTED]] == [first]
    assert [w for w, _ in findings.kinds[oracle.PRODUCER_DIFFERS]] == [second]
    assert findings.count_of(oracle.KAFKA_VS_PRODUCERS) == 2 and findings.count_of(oracle.TABLE_VS_KAFKA) == 0
    assert oracle.KAFKA_VS_PRODUCERS in findings.report()


def test_what_the_oracle_leaves_out_is_counted_and_fails_past_its_bound(ingested, tmp_path):
    """A quarantine row ahead of the ledger is left out only when asked, counted, and past its bound (0
    unless set) the check fails; records in doubt likewise."""
    cfg, topic = ingested.cfg, ingested.topic
    copy = copy_of(cfg, tmp_path, "ahead")
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    ledger = oracle.ledger_offsets(copy)
    # As a job killed between its two commits leaves it: partition 0's last record quarantined, the table
    # and the ledger not yet there.
    last = max(w for w in kafka if w[1] == 0 and w[2] < ledger[(topic, 0)] and w in dict(_table_rows(copy)))
    write_deltalake(copy.quarantine_path, quarantine_row(copy, last, kafka[last]), mode="append")
    DeltaTable(copy.table_path).delete(at(last))
    below = {**ledger, (topic, 0): last[2]}

    strict = oracle.check(copy, below, quarantine_ahead=True)
    assert strict.left_out[oracle.QUARANTINE_AHEAD] == 1 and strict.over_bounds() and not any(strict.kinds.values())
    assert "past their bounds" in strict.report()
    allowed = oracle.check(copy, below, quarantine_ahead=True, bounds={oracle.QUARANTINE_AHEAD: 1})
    assert allowed.left_out[oracle.QUARANTINE_AHEAD] == 1 and allowed.ok, allowed.report()

    journal = oracle.Journal()
    record = kafka[last]
    journal.add(last, oracle.Sent(record.key, record.value, list(record.headers), None, outcome="in doubt"))
    doubt = oracle.check(cfg, journal=journal)
    assert doubt.left_out[oracle.IN_DOUBT] == 1 and not doubt.ok


def _retyped(table: pa.Table, name: str, arrow_type: pa.DataType) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.set_column(index, pa.field(name, arrow_type), table.column(name).cast(arrow_type))


TYPE_DEFECTS = {
    # a double column written as float32: 0.1 would read back as 0.10000000149
    "amount": lambda t: _retyped(t, "amount", pa.float32()),
    "event_time": lambda t: _retyped(t, "event_time", pa.string()),  # a timestamp written as text
    # A Delta timestamp is an instant (read back in UTC, whatever zone it was written with): the zone defect
    # a Delta table can hold is a timestamp without one (timestamp_ntz), wall-clock time of no zone.
    "kafka_timestamp": lambda t: _retyped(t, "kafka_timestamp", pa.timestamp("us")),
    "user_id": lambda t: t.drop_columns(["user_id"]),  # a declared column missing
    "seq": lambda t: _retyped(t, "seq", pa.float64()),  # a long written as a double: 1 is not 1.0
}


@pytest.mark.parametrize("column", sorted(TYPE_DEFECTS))
def test_the_oracle_fails_a_column_of_another_type_than_the_pipelines(ingested, tmp_path, column):
    """Each type defect, rewritten into a copy of the real table: a finding naming the column, whatever the
    values read back as (the oracle derives the types from the pipeline file, not from the table)."""
    cfg = ingested.cfg
    copy = copy_of(cfg, tmp_path, f"type-{column}")
    table = DeltaTable(copy.table_path).to_pyarrow_table()
    write_deltalake(copy.table_path, TYPE_DEFECTS[column](table), mode="overwrite", schema_mode="overwrite")

    findings = oracle.check(copy)

    named = [where[0] for where, _ in findings.kinds.get(oracle.SCHEMA, [])]
    assert named == [column], findings.report()
    with pytest.raises(AssertionError, match=rf"{column}\["):
        oracle.assert_exactly_once(copy)


QUARANTINE_DEFECTS = {
    "kafka_partition": lambda t: _retyped(t, "kafka_partition", pa.int64()),  # an int32 written as a long
    "kafka_timestamp": lambda t: _retyped(t, "kafka_timestamp", pa.timestamp("us")),  # no zone: not an instant
    "note": lambda t: t.append_column("note", pa.nulls(t.num_rows, pa.string())),  # a column nobody documents
}


@pytest.mark.parametrize("column", sorted(QUARANTINE_DEFECTS))
def test_the_oracle_fails_a_quarantine_of_another_shape_than_the_documented_one(ingested, tmp_path, column):
    """The quarantine table's own columns are checked against the docs' list of them (not against the table
    offsetlake made): each defect, rewritten into a copy, is a schema finding naming the column."""
    copy = copy_of(ingested.cfg, tmp_path, f"quarantine-{column}")
    quarantine = DeltaTable(copy.quarantine_path).to_pyarrow_table()
    write_deltalake(
        copy.quarantine_path, QUARANTINE_DEFECTS[column](quarantine), mode="overwrite", schema_mode="overwrite"
    )

    findings = oracle.check(copy)

    named = [where[0] for where, _ in findings.kinds.get(oracle.SCHEMA, [])]
    assert named == [f"quarantine.{column}"], findings.report()


def test_the_oracle_judges_each_row_too_without_the_producers_word(ingested, tmp_path):
    """A bad record made a row (its quarantine row gone; a row of the table's shape at its offset) is found
    by the oracle's judge, with no journal to say the record was made bad, whatever the row's values."""
    cfg, kafka = ingested.cfg, ingested.kafka
    copy = copy_of(cfg, tmp_path, "bad-row")
    where = ingested.bad[-1]
    DeltaTable(copy.quarantine_path).delete(at(where))
    row = rows_at(copy.table_path, ingested.good[12]).to_pylist()[0]
    row.update(kafka_partition=where[1], kafka_offset=where[2], kafka_timestamp=kafka[where].timestamp)
    schema = DeltaTable(copy.table_path).to_pyarrow_table().schema
    write_deltalake(copy.table_path, pa.Table.from_pylist([row], schema=schema), mode="append")

    findings = oracle.check(copy, journal=oracle.Journal())

    assert [w for w, _ in findings.kinds.get(oracle.BAD_NOT_QUARANTINED, [])] == [where], findings.report()


def test_values_are_compared_with_their_types():
    assert oracle.same([("a", b"x")], [("a", b"x")]) and oracle.same({"n": 1}, {"n": 1})
    assert not oracle.same(True, 1) and not oracle.same(1, 1.0) and not oracle.same(0.1, 0.10000000149011612)
    utc = dt.datetime(2026, 11, 26, 12, tzinfo=dt.UTC)
    assert not oracle.same(utc, utc.astimezone(dt.timezone(dt.timedelta(hours=5))))  # the same instant elsewhere
    assert oracle.coerce("12.50", pa.float64()) == "12.50"  # a string is not made a number
    # A timestamp written with an offset is an instant: a UTC column holds it in UTC, a zone-less one its
    # wall-clock reading in UTC.
    offset = "2026-11-26T17:00:00+05:00"
    assert oracle.same(oracle.coerce(offset, pa.timestamp("us", tz="UTC")), utc)
    assert oracle.same(oracle.coerce(offset, pa.timestamp("us")), utc.replace(tzinfo=None))
    assert not oracle.same(oracle.coerce(offset, pa.timestamp("us", tz="UTC")), utc + dt.timedelta(hours=5))
    assert oracle.coerce(3, pa.float64()) == 3.0 and isinstance(oracle.coerce(3, pa.float64()), float)


def test_the_oracle_judges_the_quarantine_itself_without_the_producers_word(ingested, tmp_path):
    """With no journal at all, a good record quarantined and a bad one quarantined for a reason that is not
    its defect are still found: the oracle reads each quarantined record against the declared fields."""
    cfg, topic = ingested.cfg, ingested.topic
    kafka = oracle.read_committed(cfg.kafka.bootstrap_servers, topic)
    journaled = oracle.JOURNAL.of_topic(topic)
    good = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is None)
    bad = sorted(w for w, s in journaled.items() if s.outcome == "committed" and s.bad is not None)
    copy = copy_of(cfg, tmp_path, "judged")
    quarantine_a_good_record(copy, good=good[10:], kafka=kafka)
    quarantine_reason_made_up(copy, bad=[None, None, bad[0]])

    findings = oracle.check(copy, journal=oracle.Journal())

    assert [w for w, _ in findings.kinds.get(oracle.GOOD_QUARANTINED, [])] == [good[16]], findings.report()
    assert [w for w, _ in findings.kinds.get(oracle.QUARANTINE_WRONG, [])] == [bad[0]], findings.report()


def test_a_timestamp_written_with_an_offset_is_its_instant_in_the_table_and_to_the_oracle(spark, bootstrap, tmp_path):
    """JSON timestamps written with offsets (+05:00, -03:30) land as their UTC instants; the oracle finds the
    table right, and a copy holding the wall-clock reading instead (5 hours off) wrong, naming the offset."""
    cfg, topic = new_pipeline(bootstrap, tmp_path / "pipelines", tmp_path / "lake", partitions=1)
    zones = ["+05:00", "-03:30"]

    def offset_event(rng, seq):
        value = {"event_id": f"e{seq}", "user_id": seq, "event_time": f"2026-11-26T17:00:00{zones[seq % 2]}"}
        return str(seq).encode(), json.dumps(value).encode()

    produce(cfg.kafka, topic, 4, transactional_share=0, abort_share=0, seed=27, make_record=offset_event)
    ingest(spark, cfg)
    rows = DeltaTable(cfg.table_path).to_pyarrow_table().sort_by("kafka_offset").to_pylist()
    seventeen = dt.datetime(2026, 11, 26, 17, tzinfo=dt.UTC)
    assert [r["event_time"] for r in rows] == [
        seventeen - dt.timedelta(hours=5),
        seventeen + dt.timedelta(hours=3.5),
    ] * 2
    findings = oracle.check(cfg)
    assert findings.ok, findings.report()

    copy = copy_of(cfg, tmp_path, "wall-clock")
    where = (topic, 0, rows[0]["kafka_offset"])
    DeltaTable(copy.table_path).update(predicate=at(where), updates={"event_time": "event_time + INTERVAL '5 hours'"})
    findings = oracle.check(copy)
    assert [w for w, _ in findings.kinds.get(oracle.WRONG_VALUE, [])] == [where], findings.report()
