"""A broker restart is waited out, not failed on: Kafka calls retry retriable errors with backoff for
`kafka.retry_seconds`, and a stream stays up across the restart. Each test has a broker of its own
(the session's is shared), stopped and started again on the same port and data by its PID."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import oracle
from offsetlake.config import KafkaSettings
from offsetlake.errors import KafkaError
from offsetlake.kafka import KafkaCluster
from offsetlake_local import broker as embedded_broker
from offsetlake_local import processes
from support import (
    assert_exactly_once,
    freeze,
    new_pipeline,
    pipeline_commits,
    produce,
    stop_stream,
    stream_process,
    table_rows,
    wait_while_running,
)


def test_planning_waits_out_a_broker_restart(own_broker, tmp_path, caplog):
    # Each request gives up after 2 s (librdkafka waits that long on its own), the broker is away for 6.
    cfg, _ = new_pipeline(
        own_broker.bootstrap_servers,
        tmp_path / "pipelines",
        tmp_path / "lake",
        partitions=2,
        records=200,
        kafka={"retry_seconds": 120, "timeout_seconds": 2},
    )
    cluster = KafkaCluster(cfg.kafka)
    tps = cluster.partitions(cfg.topics)
    before = cluster.end_offsets(tps, "read_committed")

    caplog.set_level(logging.WARNING, logger="offsetlake.kafka")
    restart = own_broker.restart_in_background(down_seconds=6)
    try:
        fresh = KafkaCluster(cfg.kafka)  # asks while the broker is down: no metadata yet (a transport error)
        assert fresh.end_offsets(fresh.partitions(cfg.topics), "read_committed") == before
    finally:
        restart.join()
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries and all(cfg.kafka.bootstrap_servers in r for r in retries), caplog.text

    # A client that already knows the topic (a stream's) meets a leaderless partition instead: retried too.
    # librdkafka words it by timing ("No leaders found", "Failed to query partition leaders: Local: Timed
    # out", an answer without an offset): the answer after the retries is what counts.
    caplog.clear()
    restart = own_broker.restart_in_background(down_seconds=6)
    try:
        assert cluster.end_offsets(tps, "read_committed") == before
    finally:
        restart.join()
    assert any("cannot list offsets" in r.getMessage() for r in caplog.records), caplog.text


def test_a_read_waits_out_a_broker_away_longer_than_its_stall_limit(own_broker, tmp_path, caplog):
    """With the whole cluster away no message carries an error (librdkafka tells only error_cb): the read must
    still wait up to kafka.retry_seconds, not fail at its stall limit (a whole-cluster restart under a
    stream, found by the chaos harness when a restart took 40 s against a 30 s stall limit)."""
    import threading
    import time

    from offsetlake.protocol.ranges import OffsetRange
    from offsetlake.read.reader import read_range

    cfg, topic = new_pipeline(
        own_broker.bootstrap_servers,
        tmp_path / "pipelines",
        tmp_path / "lake",
        partitions=1,
        records=100,
        kafka={"retry_seconds": 120, "timeout_seconds": 2},
    )
    caplog.set_level(logging.WARNING, logger="offsetlake.read.reader")
    stall_seconds = 3.0  # the read waits at offset 100 for records that come only after the outage
    rows = []

    def outage_then_records() -> None:
        while not rows:  # the read has its first hundred records: it now waits for the rest
            time.sleep(0.1)
        own_broker.stop()
        time.sleep(3 * stall_seconds)  # away three stall limits long
        own_broker.start()
        produce(cfg.kafka, topic, 50, transactional_share=0.0, seed=3)

    outage = threading.Thread(target=outage_then_records)
    outage.start()
    try:
        for batch in read_range(cfg.kafka, "test-read", OffsetRange(topic, 0, 0, 150), stall_seconds):
            rows.extend(batch.column("kafka_offset").to_pylist())
    finally:
        outage.join()
    kafka = oracle.read_committed(own_broker.bootstrap_servers, topic, {0: 150})  # offsets 150 holds: markers
    assert rows == sorted(offset for _, _, offset in kafka)
    assert "Connection refused; waiting for the broker (up to 120 s)" in caplog.text


def test_an_offset_mirror_the_broker_never_answers_ends_and_the_next_one_lands(own_broker, tmp_path, caplog):
    """The broker goes away with the mirror's commit out (frozen, then killed: the request is in flight, never
    answered). librdkafka never answers such a commit, and a stream's round hung in it until the broker came
    back; the mirror now gives up in its bounds, and once the broker is back the next mirror lands."""
    cfg, topic = new_pipeline(
        own_broker.bootstrap_servers,
        tmp_path / "pipelines",
        tmp_path / "lake",
        partitions=2,
        kafka={"retry_seconds": 2, "timeout_seconds": 2},
    )
    cluster = KafkaCluster(cfg.kafka)  # kept, as a stream keeps it: its committer has found the coordinator
    assert cluster.commit_group_offsets(cfg.consumer_group, {(topic, 0): 1, (topic, 1): 1})

    caplog.set_level(logging.WARNING, logger="offsetlake.kafka")
    outcome: list[bool] = []
    freeze(own_broker.current.pid)  # every thread stopped before the commit goes out
    mirror = threading.Thread(
        target=lambda: outcome.append(cluster.commit_group_offsets(cfg.consumer_group, {(topic, 0): 2, (topic, 1): 2})),
        daemon=True,  # were it to hang, the test fails rather than waits with it
    )
    mirror.start()
    time.sleep(1)  # the commit is out, to a broker that reads nothing (not yet out, it meets a dead broker: False too)
    processes.kill(own_broker.current.pid)
    mirror.join(timeout=60)  # a bound for a hang, far above the mirror's own (timeout and retry seconds)
    assert not mirror.is_alive(), "the offset mirror waited for an answer that never comes"
    assert outcome == [False]
    assert "could not mirror offsets" in caplog.text

    own_broker.start()
    assert cluster.commit_group_offsets(cfg.consumer_group, {(topic, 0): 3, (topic, 1): 4})
    cluster.close()
    # What the broker holds for the group, read by a client of its own.
    group = KafkaCluster(cfg.kafka).group_offsets(cfg.consumer_group, [(topic, 0), (topic, 1)])
    assert group == {(topic, 0): 3, (topic, 1): 4}


def test_what_cannot_get_better_fails_at_once(bootstrap, caplog):
    caplog.set_level(logging.WARNING, logger="offsetlake.kafka")
    patient = KafkaCluster(KafkaSettings(bootstrap_servers=bootstrap, timeout_seconds=5, retry_seconds=120))
    with pytest.raises(KafkaError, match="unknown topic 'no-such-topic'"):
        patient.partitions(["no-such-topic"])

    nobody = KafkaCluster(
        KafkaSettings(bootstrap_servers=f"127.0.0.1:{embedded_broker.free_port()}", timeout_seconds=2, retry_seconds=0)
    )
    with pytest.raises(KafkaError) as err:
        nobody.partitions(["t"])
    assert "cannot read cluster metadata" in str(err.value) and "\n" not in str(err.value)
    assert "retrying in" not in caplog.text


def test_a_stream_stays_up_across_a_broker_restart(own_broker, tmp_path):
    pipelines = tmp_path / "pipelines"
    cfg, topic = new_pipeline(
        own_broker.bootstrap_servers,
        pipelines,
        tmp_path / "lake",
        partitions=2,
        records=300,
        kafka={"retry_seconds": 120, "timeout_seconds": 2},
    )
    said = tmp_path / "stream.stderr"
    job = stream_process(cfg, pipelines, stderr=said)
    try:
        wait_while_running(lambda: table_rows(cfg) == 300, job)
        own_broker.stop()
        # The broker stays away until the stream has met its absence and said it waits it out: between
        # batches its planning retries ("retrying in"), within one its read waits ("waiting for the broker").
        waits = ("retrying in", "waiting for the broker")
        wait_while_running(lambda: any(w in said.read_text() for w in waits), job, timeout=180)
        own_broker.start()
        produce(cfg.kafka, topic, 200, seed=7)
        wait_while_running(lambda: table_rows(cfg) == 500, job)  # committed again, after the restart
        assert job.poll() is None, "the stream exited"

        # Told to stop while it waits for a broker that is away, it stops then, cleanly: not after
        # retry_seconds, with the broker's absence as its error.
        retries = said.read_text().count("retrying in")
        own_broker.stop()
        wait_while_running(lambda: said.read_text().count("retrying in") > retries, job, timeout=180)
    finally:
        out, _ = stop_stream(job, timeout=300, stderr=said)  # a batch in flight may wait retry_seconds (120 s)
    assert job.returncode == 0, said.read_text()[-3000:]
    assert "stopped while waiting for the broker" in said.read_text() and "stream stopped after" in out
    own_broker.start()  # the oracle asks Kafka
    assert len(pipeline_commits(cfg)) >= 2
    assert_exactly_once(cfg)
