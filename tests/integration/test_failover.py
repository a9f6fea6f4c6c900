"""Failover on a three-node Apache Kafka cluster (replication factor 3, min.insync.replicas 2): a node
SIGKILLed while a batch reads and while a stream runs, and a rolling restart of all three. Leaders move to
the nodes left; nothing is lost or duplicated (the oracle checks the table row by row against Kafka and the
producers' journal), and the stream stays up. And a transaction its producer abandoned stops holding back
the LSO once Kafka times it out.

The cluster is the session's (conftest.cluster); a test that kills a node starts it again before it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient

from offsetlake.errors import TableError
from offsetlake.kafka import KafkaCluster
from offsetlake_local import broker as embedded_broker
from offsetlake_local import processes
from support import (
    JournaledProducer,
    assert_exactly_once,
    create_topic,
    ingest_process,
    ledger_offsets,
    load,
    new_pipeline,
    pipeline_commits,
    produce,
    stop_stream,
    stream_process,
    table_rows,
    unique,
    wait_for_fault,
    wait_while_running,
    write_pipeline,
)

pytestmark = pytest.mark.slow
PATIENT = {"retry_seconds": 120, "timeout_seconds": 5}


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """{partition: the node that leads it}, as the cluster's metadata says now."""
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic]
    return {p: m.leader for p, m in meta.partitions.items()}


def busiest_leader(bootstrap: str, topic: str) -> int:
    led = list(leaders(bootstrap, topic).values())
    return max(set(led), key=led.count)


def wait_until_led_by_others(bootstrap: str, topic: str, gone: int, timeout: float = 60) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        now = leaders(bootstrap, topic)
        if all(leader not in (gone, -1) for leader in now.values()):
            return now
        assert time.monotonic() < deadline, f"node {gone} still leads or no leader: {now}"
        time.sleep(0.2)


def test_a_batch_reads_on_while_a_node_dies(cluster, tmp_path):
    pipelines = tmp_path / "pipelines"
    cfg, topic = new_pipeline(
        cluster.bootstrap_servers,
        pipelines,
        tmp_path / "lake",
        partitions=3,
        records=6000,
        kafka=PATIENT,
        batch={"max_records_per_task": 500},
    )
    victim = busiest_leader(cluster.bootstrap_servers, topic)
    faults = tmp_path / "faults"
    faults.mkdir()
    job = ingest_process(
        cfg, pipelines, env={"OFFSETLAKE_FAULT": "after_plan:pause", "OFFSETLAKE_FAULT_DIR": str(faults)}
    )
    try:
        wait_for_fault(faults / "after_plan.reached", job)  # planned against all three nodes
        cluster.kill(victim)
        (faults / "after_plan.release").touch()  # every range is read with the victim gone
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err[-3000:]
        moved = wait_until_led_by_others(cluster.bootstrap_servers, topic, victim)
        assert victim not in moved.values()
        assert_exactly_once(cfg)
    finally:
        if job.poll() is None:
            job.kill()
        cluster.start_node(victim)


@pytest.mark.long
def test_a_stream_stays_up_through_a_dead_node_and_a_rolling_restart(cluster, tmp_path):
    pipelines = tmp_path / "pipelines"
    cfg, topic = new_pipeline(
        cluster.bootstrap_servers, pipelines, tmp_path / "lake", partitions=3, records=500, kafka=PATIENT
    )
    writer = ContinuousWriter(cluster.bootstrap_servers, topic)
    job = stream_process(cfg, pipelines)
    try:
        wait_while_running(lambda: table_rows(cfg) >= 500, job)
        writer.start()  # the producers write all along, as in production (acks=all)

        victim = busiest_leader(cluster.bootstrap_servers, topic)
        cluster.kill(victim)
        commits = len(pipeline_commits(cfg))
        wait_while_running(lambda: len(pipeline_commits(cfg)) >= commits + 2, job)  # committing on two nodes
        cluster.start_node(victim)

        for node in [n.node_id for n in cluster.nodes]:  # a rolling restart: one node at a time
            cluster.stop_node(node)
            before = len(pipeline_commits(cfg))
            wait_while_running(lambda: len(pipeline_commits(cfg)) > before, job)  # noqa: B023 - waited on at once
            cluster.start_node(node)
        assert job.poll() is None, "the stream exited"

        writer.stop()
        lso = sum(KafkaCluster(cfg.kafka).end_offsets([(topic, p) for p in range(3)], "read_committed").values())
        wait_while_running(lambda: sum(ledger_ends(cfg).values()) >= lso, job)
    finally:
        writer.stop()
        try:
            out, err = stop_stream(job)
        finally:
            for node in cluster.nodes:  # whatever happened, the cluster is whole for the next test
                if not processes.runs(node.pid, embedded_broker.MARKER):
                    cluster.start_node(node.node_id)
    assert job.returncode == 0, err[-3000:]
    assert writer.sent > 0 and writer.errors == 0, (writer.sent, writer.errors)
    assert_exactly_once(cfg)


def test_an_abandoned_transaction_stops_holding_back_the_lso(bootstrap, pipelines_dir, lake, spark):
    """A producer killed inside a transaction leaves it open; Kafka aborts it after the producer's
    transaction.timeout.ms (3 s here), the LSO moves on, and ingest reads what was committed after it."""
    from offsetlake.batch import ingest

    topic = unique("t")
    create_topic(bootstrap, topic, 1)
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake)
    cfg = load(pipelines_dir, name)
    abandoner = subprocess.Popen(
        [sys.executable, "-c", ABANDON, bootstrap, topic], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert abandoner.stdout.readline().strip() == "open"
    finally:
        abandoner.kill()  # SIGKILL: no abort reaches the broker
        abandoner.wait()
    produce(cfg.kafka, topic, 200, settle=False, transactional_share=1.0, abort_share=0.0, seed=3)
    cluster = KafkaCluster(cfg.kafka)
    tps = [(topic, 0)]
    assert cluster.end_offsets(tps, "read_committed")[(topic, 0)] == 0  # held back by the open transaction

    deadline = time.monotonic() + 30
    while cluster.end_offsets(tps, "read_committed") != cluster.end_offsets(tps, "read_uncommitted"):
        assert time.monotonic() < deadline, "Kafka never aborted the abandoned transaction"
        time.sleep(0.5)
    ingest(spark, cfg)
    assert assert_exactly_once(cfg) == 200  # the 200 committed after it; none of the 50 abandoned


ABANDON = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "abandoned-" + sys.argv[2],
                  "transaction.timeout.ms": 3000})
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(50):
        p.produce(sys.argv[2], value=b'{"event_id": "never"}')
    p.flush(10)
    print("open", flush=True)
    time.sleep(600)
    """
)


class ContinuousWriter:
    """Idempotent writes (acks=all) in a thread until stopped, every one told to the oracle's journal."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.producer = JournaledProducer(bootstrap, **{"linger.ms": 5, "message.timeout.ms": 120_000})
        self.sent = self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=180)

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            for _ in range(20):
                value = f'{{"event_id": "w{seq}", "user_id": {seq % 97}, "seq": {seq}}}'.encode()
                self.producer.produce(self.topic, value=value, key=str(seq % 97).encode())
                seq += 1
            try:
                self.producer.flush(120)
                self.sent += 20
            except AssertionError:
                self.errors += 1
            self._stop.wait(0.05)


def ledger_ends(cfg) -> dict:
    try:
        return ledger_offsets(cfg)
    except TableError:
        return {}
