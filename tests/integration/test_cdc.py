"""Change data capture end to end: PostgreSQL -> Debezium's PostgreSQL connector in a Kafka Connect worker
-> Apache Kafka -> offsetlake upsert pipelines -> Delta, with the source database as the oracle
(tests/source_db.py): after a random workload, each Delta table equals `SELECT *` of its source table.

The chain is real: PostgreSQL from the machine's package with logical decoding (pgoutput), Connect's
standalone worker and Debezium 3.6.1.Final from Maven Central (poms/kafka-connect.xml), the session's
broker. One PostgreSQL server per session; each test its own schema, connector, worker and topics.
"""

from __future__ import annotations

import base64
import functools
import json
import random
import signal
from collections import Counter

import pytest
from deltalake.exceptions import TableNotFoundError

from hosts import wait_for
from offsetlake import faults
from offsetlake.batch import ingest
from offsetlake.config.topic_tables import for_topic
from offsetlake.operations.fold import audit_upsert
from offsetlake_local import connect
from offsetlake_local.shop import KEYS
from oracle import read_committed
from source_db import TOASTABLE, Shop, assert_table_is_source
from support import (
    ingest_process,
    load,
    pipeline_commits,
    stop_stream,
    stream_process,
    unique,
    write_per_topic_pipeline,
    write_pipeline,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def source_db():
    """One PostgreSQL server with logical decoding for the session's capture tests."""
    from hosts import start_postgres
    from offsetlake_local.postgres import LOGICAL_DECODING

    server = start_postgres(settings=LOGICAL_DECODING)
    yield server
    server.stop()


def connector(source_db, prefix: str, schema: str, **settings: str) -> dict[str, str]:
    """Debezium's configuration capturing `schema` (heartbeats into its heartbeat table) into topics
    `<prefix>.<schema>.<table>`."""
    return connect.debezium_postgres(
        "127.0.0.1",
        source_db.port,
        source_db.user,
        source_db.database,
        prefix,
        [schema],
        heartbeat_table=f"{schema}.heartbeat",
        **settings,
    )


def start_worker(source_db, work, bootstrap: str, connectors: dict[str, dict], **options) -> connect.ConnectWorker:
    """A Connect worker running `connectors`, each one's publication made first (as the how-to makes it)."""
    for config in connectors.values():
        connect.create_publication(source_db, config)
    return connect.start(work, bootstrap, connectors, **options)


def capture(source_db, bootstrap: str, work, schema: str, schemas_enable: bool) -> connect.ConnectWorker:
    """A Connect worker running Debezium on `schema`, into topics `<schema>.<schema>.<table>`."""
    config = connector(source_db, schema, schema)
    return start_worker(source_db, work, bootstrap, {schema: config}, schemas_enable=schemas_enable)


def table_pipelines(bootstrap: str, pipelines_dir, lake, shop: Shop, prefix: str) -> dict:
    """One upsert pipeline per source table, its columns from the events' Connect schemas."""
    pipelines = {}
    for table in shop.tables():
        name = write_pipeline(
            pipelines_dir,
            bootstrap,
            [f"{prefix}.{shop.schema}.{table}"],
            lake,
            name=f"{shop.schema}_{table}",
            format={"type": "connect_json", "schema": [], "envelope": "debezium"},
            write={"mode": "upsert", "key": KEYS.get(table, ["id"]), "order_by": "_debezium_position"},
        )
        pipelines[table] = load(pipelines_dir, name)
    return pipelines


def test_a_captured_database_lands_typed_and_equal_to_its_source(
    spark, source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    shop = Shop(source_db, unique("shop").lower(), seed=40)
    shop.create()
    worker = capture(source_db, bootstrap, tmp_path / "connect", shop.schema, schemas_enable=True)
    try:
        pipelines = table_pipelines(bootstrap, pipelines_dir, lake, shop, shop.schema)
        for round_ in range(3):
            shop.run(20)
            if round_ == 1:  # mid-batch: the events before it are dropped, those after applied
                shop.add_column()
                shop.truncate("orders")
            shop.run(20)
            shop.wait_captured(connect.slot_name(shop.schema))
            for cfg in pipelines.values():
                ingest(spark, cfg)
        for table, cfg in pipelines.items():
            assert_table_is_source(cfg.table_path, shop.rows(table), shop.types(table))
            report = audit_upsert(cfg)  # offsetlake's own fold of Kafka agrees, TRUNCATE and TOAST included
            assert report.ok, report.format()
        left_out = placeholders_sent(bootstrap, pipelines["customers"].topics[0])
        assert all(left_out[c] for c in TOASTABLE), f"no TOASTed value left out in some column: {left_out}"
        for table in ("customers", "parcels"):  # keyed on id, and on (region, id)
            moved_without = key_change_placeholders(bootstrap, pipelines[table].topics[0])
            assert moved_without > 0, f"{table}: no key change left a TOASTed value out: the carrying was not tested"
            commits = pipeline_commits(pipelines[table])
            carried, left_null = sum(c.meta.carried_over for c in commits), sum(c.meta.left_null for c in commits)
            # No kill and no truncate of these tables here: every such value carried once, none left null.
            assert left_null == 0 and carried == moved_without, (table, carried, left_null, moved_without)
            print(f"{table}: values the key changes' creates lacked {moved_without}, carried over {carried}")
        print(f"placeholders sent {dict(left_out)}")
    finally:
        worker.stop()


def test_a_table_created_while_the_stream_runs_is_captured_and_lands_equal_to_its_source(
    source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    """The connector's publication holds every table of the schema, those created later included
    (connect.create_publication), and a stream over a topic pattern gives each new topic its table at its
    next round: a table created while Debezium and the stream run, then changed, lands equal to its source.
    The stream's small batches are read by its driver (batch.driver_reads_up_to), a larger one by a Spark job."""
    shop = Shop(source_db, unique("shop").lower(), seed=44)
    shop.create()
    worker = capture(source_db, bootstrap, tmp_path / "connect", shop.schema, schemas_enable=True)
    said = tmp_path / "stream.err"
    stream = None
    try:
        name = write_per_topic_pipeline(
            pipelines_dir,
            bootstrap,
            f"{shop.schema}.{shop.schema}",
            lake,
            format={"type": "connect_json", "schema": [], "envelope": "debezium"},
            write={"mode": "upsert", "key": ["id"], "keys": KEYS, "order_by": "_debezium_position"},
            batch={"driver_reads_up_to": 40},
        )
        cfg = load(pipelines_dir, name)
        stream = stream_process(cfg, pipelines_dir, stderr=said)
        shop.run(10)
        shop.add_table("refunds")
        shop.run(30)
        shop.wait_captured(connect.slot_name(shop.schema))
        for table in shop.tables():
            table_cfg = for_topic(cfg, f"{shop.schema}.{shop.schema}.{table}")
            lands = functools.partial(_lands_as_source, table_cfg, shop, table)
            wait_for(lands, f"{table} equal to its source", 180, stream, said)
    finally:
        if stream is not None:
            stop_stream(stream, stderr=said)
        worker.stop()
    assert shop.later_tables == ["refunds"] and len(shop.rows("refunds")) >= 10
    for table in shop.tables():
        table_cfg = for_topic(cfg, f"{shop.schema}.{shop.schema}.{table}")
        assert_table_is_source(table_cfg.table_path, shop.rows(table), shop.types(table))


def test_a_batch_that_ends_between_a_key_changes_delete_and_its_create_loses_no_value(
    spark, source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    """A primary-key change is two events, the old key's delete and then the new key's create, which lacks the
    TOASTed values the change left alone; a batch may end between them (a stream's batch, cut where Kafka's
    end was). One record per batch cuts every change there: each moved row keeps every value, a value
    updated just before the move in the same transaction included."""
    shop = Shop(source_db, unique("shop").lower(), seed=45)
    shop.create(customers=4, orders=0, parcels=0)
    rng = random.Random(45)
    where = f'"{shop.schema}".customers'

    def large() -> str:  # random, so PostgreSQL stores it out of line (source_db.LARGE_BYTES' reasoning)
        return rng.randbytes(1500).hex()

    def move(old: int, new: int) -> tuple[str, tuple]:
        return f"UPDATE {where} SET id = %s WHERE id = %s", (new, old)

    shop.transaction(
        [
            (f"UPDATE {where} SET note = %s, photo = %s WHERE id = %s", (large(), rng.randbytes(3000), i))
            for i in range(1, 5)
        ]
    )
    worker = capture(source_db, bootstrap, tmp_path / "connect", shop.schema, schemas_enable=True)
    try:
        topic = f"{shop.schema}.{shop.schema}.customers"
        name = write_pipeline(
            pipelines_dir,
            bootstrap,
            [topic],
            lake,
            format={"type": "connect_json", "schema": [], "envelope": "debezium"},
            write={"mode": "upsert", "key": ["id"], "order_by": "_debezium_position"},
            batch={"max_records_per_batch": 1},
        )
        cfg = load(pipelines_dir, name)
        wait_for(lambda: _end_offset(bootstrap, topic) >= 4, "the snapshot's four rows in Kafka", 120)
        shop.transaction([(f"UPDATE {where} SET note = %s WHERE id = 1", (large(),)), move(1, 101)])
        shop.transaction([move(2, 102)])
        shop.transaction([move(102, 103)])  # moved twice
        shop.transaction([move(4, 104), (f"INSERT INTO {where} (id, name) VALUES (4, 'again')", ())])  # old key again
        shop.wait_captured(connect.slot_name(shop.schema))
        results = ingest(spark, cfg)
    finally:
        worker.stop()
    assert all(r.status in ("committed", "up_to_date") for r in results), [r.summary() for r in results]
    assert_table_is_source(cfg.table_path, shop.rows("customers"), shop.types("customers"))
    moved_without = key_change_placeholders(bootstrap, topic)
    commits = pipeline_commits(cfg)
    carried, left_null = sum(c.meta.carried_over for c in commits), sum(c.meta.left_null for c in commits)
    assert moved_without >= 8 and left_null == 0 and carried == moved_without, (carried, left_null, moved_without)
    records = read_committed(bootstrap, topic).values()
    moves = [r for r in records if r.value and "__debezium.newkey" in dict(r.headers)]  # a delete, not its tombstone
    committed = [r for r in results if r.status == "committed"]
    assert len(moves) == 4 and len(committed) == len(records), "each key change's delete a batch of its own"
    report = audit_upsert(cfg)  # offsetlake's own fold of Kafka applies each delete with its create too
    assert report.ok, report.format()


def test_a_publication_that_lists_tables_is_set_to_the_whole_schema(source_db):
    """An earlier demo's publication, as Debezium's `filtered` mode made it (a list of the tables then), is
    set to the schema, so a table created later is published; made again, nothing changes."""
    schema = unique("pub").lower()
    config = connector(source_db, schema, schema)
    source_db.execute(
        f'CREATE SCHEMA "{schema}"',
        f'CREATE TABLE "{schema}".a (id bigint PRIMARY KEY)',
        f'CREATE PUBLICATION {config["publication.name"]} FOR TABLE "{schema}".a',
    )
    connect.create_publication(source_db, config)
    connect.create_publication(source_db, config)
    source_db.execute(f'CREATE TABLE "{schema}".later (id bigint PRIMARY KEY)')
    conn = source_db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (config["publication.name"],))
            published = sorted(row[0] for row in cur.fetchall())
    finally:
        conn.close()
    assert published == ["a", "later"]


def _lands_as_source(cfg, shop: Shop, table: str) -> bool:
    try:
        assert_table_is_source(cfg.table_path, shop.rows(table), shop.types(table))
    except (AssertionError, TableNotFoundError):  # not yet: the stream's next round may bring it
        return False
    return True


UNAVAILABLE = "__debezium_unavailable_value"  # the connector's unavailable.value.placeholder, its default
# How Debezium's PostgreSQL connector writes it in each column type (JSON converter; bytea as base64).
SENT_FOR = {
    "note": UNAVAILABLE,
    "photo": base64.b64encode(UNAVAILABLE.encode()).decode(),
    "tags": [UNAVAILABLE],
    "codes": list(UNAVAILABLE.encode()),
    "memo": UNAVAILABLE,  # parcels'
    "scan": base64.b64encode(UNAVAILABLE.encode()).decode(),
    "labels": [UNAVAILABLE],
    "bins": list(UNAVAILABLE.encode()),
}


def key_change_placeholders(bootstrap: str, topic: str) -> int:
    """How many values the creates of primary-key changes (those with Debezium's old-key header) hold the
    placeholder for, read from Kafka by the test's own consumer and parser."""
    found = 0
    for record in read_committed(bootstrap, topic).values():
        names = {name for name, _ in record.headers}
        after = json.loads(record.value)["payload"]["after"] if record.value else None
        if after and "__debezium.oldkey" in names:
            found += sum(after.get(column) == sent for column, sent in SENT_FOR.items())
    return found


def placeholders_sent(bootstrap: str, topic: str) -> Counter:
    """Per column: how many events in Kafka carry the connector's placeholder for a large value it left out
    (an update leaving a TOASTed value alone), read from Kafka by the test's own consumer and parser."""
    found: Counter = Counter()
    for record in read_committed(bootstrap, topic).values():
        after = json.loads(record.value)["payload"]["after"] if record.value else None
        for column, sent in SENT_FOR.items():
            found[column] += bool(after) and after.get(column) == sent
    return found


def test_kills_of_offsetlake_and_of_the_connect_worker_change_nothing(
    spark, source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    """Debezium is at least once: a Connect worker SIGKILLed mid-workload re-sends, when started again, what
    it sent since its offsets' last flush. offsetlake jobs SIGKILLed at a fault point leave their batch to
    the next run. Neither may change what the tables end as."""
    rng = random.Random(41)
    shop = Shop(source_db, unique("shop").lower(), seed=41)
    shop.create()
    work = tmp_path / "connect"
    worker = capture(source_db, bootstrap, work, shop.schema, schemas_enable=True)
    try:
        pipelines = table_pipelines(bootstrap, pipelines_dir, lake, shop, shop.schema)
        topic = f"{shop.schema}.{shop.schema}.customers"
        # Killed before its first flush, the worker would take a new snapshot when started again (its own
        # test below: test_a_worker_that_lost_its_offsets_snapshots_again_...).
        wait_for(lambda: (work / "offsets").is_file(), "the worker's first offset flush", 60)
        sent = _end_offset(bootstrap, topic)
        shop.run(15)
        wait_for(lambda: _end_offset(bootstrap, topic) > sent, "the workload's events in Kafka", 60)
        worker.kill()  # its last events are in Kafka, its offsets for them (flushed every 5 s) are not
        shop.run(15)
        shop.truncate("customers")
        shop.run(5)
        worker = connect.start(work, bootstrap)
        shop.wait_captured(connect.slot_name(shop.schema))
        for cfg, point in zip(pipelines.values(), rng.sample(faults.POINTS, len(pipelines))):
            job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": f"{point}:exit"})
            job.communicate(timeout=300)
            assert job.returncode == -signal.SIGKILL, f"the job was not killed at {point}"
            ingest(spark, cfg)
        for table, cfg in pipelines.items():
            assert_table_is_source(cfg.table_path, shop.rows(table), shop.types(table))
        resent = _events(bootstrap, topic)
        assert len(resent) > len(set(resent)), "no event was sent twice: the worker's kills tested nothing"
    finally:
        worker.stop()


# The orders table's row as a pipeline declares it when the JSON converter sends no schemas (numeric(10, 3),
# timestamptz as Debezium's ZonedTimestamp text): tests/source_db.py's ORDER_TYPES, written out by hand.
ORDERS_DECLARED = [
    {"name": "id", "type": "long", "required": True},
    {"name": "customer_id", "type": "long"},
    {"name": "amount", "type": "decimal(10,3)"},
    {"name": "placed", "type": "timestamp"},
    {"name": "status", "type": "string"},
]


def test_without_schemas_each_decimal_handling_mode_lands_as_the_declared_decimal(
    spark, source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    """`schemas.enable=false`: the pipeline declares the row's types. One connector per decimal.handling.mode
    (base64 of the unscaled bytes, text, a double) captures the same tables; each orders table equals the
    source's, its amounts the declared decimal(10,3)."""
    shop = Shop(source_db, unique("shop").lower(), seed=42)
    shop.create()
    modes = {mode: f"{shop.schema}_{mode}" for mode in ("precise", "string", "double")}  # mode: topic prefix
    connectors = {
        prefix: connector(source_db, prefix, shop.schema, **{"decimal.handling.mode": mode})
        for mode, prefix in modes.items()
    }
    worker = start_worker(source_db, tmp_path / "connect", bootstrap, connectors, schemas_enable=False)
    try:
        pipelines = {}
        for mode, prefix in modes.items():
            name = write_pipeline(
                pipelines_dir,
                bootstrap,
                [f"{prefix}.{shop.schema}.orders"],
                lake,
                name=f"orders_{mode}",
                format={
                    "type": "json",
                    "schema": ORDERS_DECLARED,
                    "envelope": "debezium",
                    "debezium": {"decimal_handling_mode": mode},
                },
                write={"mode": "upsert", "key": ["id"], "order_by": "_debezium_position"},
            )
            pipelines[mode] = load(pipelines_dir, name)
        for _ in range(2):
            shop.run(25)
            for prefix in modes.values():
                shop.wait_captured(connect.slot_name(prefix))
            for cfg in pipelines.values():
                ingest(spark, cfg)
        source = shop.rows("orders")
        assert any(row["amount"] is not None and row["amount"] < 0 for row in source.values())  # signed bytes
        for cfg in pipelines.values():
            assert_table_is_source(cfg.table_path, source, shop.types("orders"))
    finally:
        worker.stop()


def test_a_worker_that_lost_its_offsets_snapshots_again_and_the_rows_deleted_meanwhile_go(
    spark, source_db, bootstrap, pipelines_dir, lake, tmp_path
):
    """A Connect worker SIGKILLed before its first offset flush takes a new snapshot when started again,
    and sends no delete for a row deleted while it was down. The new snapshot's end deletes every row it
    did not read (`format.debezium.snapshot: replace`): the tables end equal to the source."""
    shop = Shop(source_db, unique("shop").lower(), seed=43)
    shop.create()
    work = tmp_path / "connect"
    config = {shop.schema: connector(source_db, shop.schema, shop.schema)}
    worker = start_worker(source_db, work, bootstrap, config, schemas_enable=True, flush_interval_ms=3_600_000)
    try:
        pipelines = table_pipelines(bootstrap, pipelines_dir, lake, shop, shop.schema)
        topics = {table: cfg.topics[0] for table, cfg in pipelines.items()}
        wait_for(lambda: all(_end_offset(bootstrap, t) >= 20 for t in topics.values()), "the first snapshot", 90)
        shop.run(10)
        for cfg in pipelines.values():
            ingest(spark, cfg)
        before = {table: set(shop.rows(table)) for table in topics}
        assert not (work / "offsets").exists(), "the worker flushed its offsets: it would not snapshot again"
        worker.kill()
        shop.run(30)  # while no worker captures: deletes, updates, inserts, key changes
        gone = {table: before[table] - set(shop.rows(table)) for table in topics}
        settings = work / connect.WORKER_CONFIG  # started again, the worker flushes its offsets every 2 s
        settings.write_text(
            settings.read_text().replace("offset.flush.interval.ms=3600000", "offset.flush.interval.ms=2000")
        )
        worker = connect.start(work, bootstrap)
        shop.run(10)
        shop.wait_captured(connect.slot_name(shop.schema))
        for cfg in pipelines.values():
            ingest(spark, cfg)
        for table, cfg in pipelines.items():
            assert_table_is_source(cfg.table_path, shop.rows(table), shop.types(table))
            report = audit_upsert(cfg)
            assert report.ok, report.format()
        assert all(len(_snapshot_ends(bootstrap, t)) == 2 for t in topics.values()), "not two snapshots"
        assert sum(map(len, gone.values())) > 0, "no row was deleted while the worker was down: nothing tested"
    finally:
        worker.stop()


def _snapshot_ends(bootstrap: str, topic: str) -> list[int]:
    """The source positions of the events that end a snapshot of the topic's table (the test's own reading
    of Debezium's `source.snapshot`)."""
    ends = []
    for record in read_committed(bootstrap, topic).values():
        event = json.loads(record.value)["payload"] if record.value else None
        if event and event["op"] == "r" and event["source"].get("snapshot") in ("last_in_data_collection", "last"):
            ends.append(event["source"]["lsn"])
    return ends


def _end_offset(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g")})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:  # not created yet: Connect creates it with its first event
            return 0
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def _events(bootstrap: str, topic: str) -> list[tuple]:
    """(source LSN, op) of every change event in the topic: an event sent twice appears twice."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        events = []
        while len(events) < high:
            message = consumer.poll(5)
            assert message is not None and not message.error(), f"{topic}: no record at {len(events)} of {high}"
            events.append(message)
        values = [json.loads(m.value())["payload"] for m in events if m.value() is not None]
        return [(v["source"]["lsn"], v["op"], json.dumps(v["after"], sort_keys=True)) for v in values]
    finally:
        consumer.close()
