"""Kafka security settings reach every client the platform creates, and secrets stay out of text.

Fast unit test: the confluent-kafka client classes are replaced by a recorder
that keeps the settings each client would have been built with.
"""

import pytest

from offsetlake import kafka
from offsetlake.config import parse_pipeline
from offsetlake.kafka import cluster as kafka_cluster
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.read import reader, tasks
from offsetlake_local import producer

SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "offsetlake",
    "sasl.password": "${OFFSETLAKE_TEST_KAFKA_PASSWORD}",
    "ssl.ca.location": "/etc/ssl/kafka-ca.pem",
    "ssl.endpoint.identification.algorithm": "https",
}
SECRET = "s3cr3t-Pa55"


class Built(Exception):
    """Raised by the recorder once it has the settings: no network is touched."""


@pytest.fixture
def cfg(monkeypatch):
    monkeypatch.setenv("OFFSETLAKE_TEST_KAFKA_PASSWORD", SECRET)
    return parse_pipeline(
        {
            "name": "secure",
            "topics": ["orders"],
            "table": {"path": "/lake/orders"},
            "kafka": {"bootstrap_servers": "kafka-1:9093", "client": SECURITY},
            "format": {"type": "raw"},
        },
        "secure.yaml",
    )


@pytest.fixture
def built(monkeypatch):
    seen: dict[str, dict] = {}

    def recorder(name):
        def make(settings, *args, **kwargs):
            seen[name] = settings
            raise Built(name)

        return make

    monkeypatch.setattr(kafka_cluster, "AdminClient", recorder("planner (admin)"))
    monkeypatch.setattr(kafka_cluster, "Consumer", recorder("group offsets"))
    monkeypatch.setattr(reader, "Consumer", recorder("reader"))
    monkeypatch.setattr(reader, "NativeConsumer", recorder("reader"))
    monkeypatch.setattr(producer, "Producer", recorder("producer"))
    monkeypatch.setattr(producer, "AdminClient", recorder("topic admin"))
    return seen


def client_calls(cfg) -> dict:
    """A call that builds each kind of client offsetlake creates, by the recorder's name for it."""
    cluster = kafka.KafkaCluster(cfg.kafka)
    return {
        "planner (admin)": lambda: cluster.partitions(cfg.topics),
        "group offsets": lambda: cluster.commit_group_offsets(cfg.consumer_group, {("orders", 0): 10}),
        "reader": lambda: list(reader.read_range(cfg.kafka, "g", OffsetRange("orders", 0, 0, 10), 5)),
        "producer": lambda: producer.produce(cfg.kafka, "orders", 1),
        "topic admin": lambda: producer.ensure_topic(cfg.kafka, "orders", 1),
    }


def test_security_settings_reach_every_client(cfg, built):
    cluster = kafka.KafkaCluster(cfg.kafka)
    for name, call in client_calls(cfg).items():
        with pytest.raises(Built):
            call()
        settings = built[name]
        for key, value in SECURITY.items():
            expected = SECRET if key == "sasl.password" else value
            assert settings.get(key) == expected, f"{name}: {key} is {settings.get(key)!r}"
        assert settings["bootstrap.servers"] == "kafka-1:9093"
    # group offsets are read as well as written
    with pytest.raises(Built):
        cluster.group_offsets(cfg.consumer_group, [("orders", 0)])
    assert built["group offsets"]["sasl.password"] == SECRET


def test_the_reader_keeps_its_own_protocol_settings(cfg, built):
    with pytest.raises(Built):
        list(reader.read_range(cfg.kafka, "g", OffsetRange("orders", 0, 0, 10), 5))
    settings = built["reader"]
    assert settings["isolation.level"] == "read_committed"
    assert settings["enable.auto.commit"] is False and settings["auto.offset.reset"] == "error"


def test_secrets_are_redacted_from_the_config_repr(cfg):
    text = repr(cfg) + str(cfg) + repr(cfg.kafka)
    assert SECRET not in text
    assert "sasl.username" in text  # not a secret: shown


def test_the_reader_fetches_in_large_responses_with_bounded_memory(cfg, built):
    """On a broker that honours fetch limits (Apache Kafka), one reader of one partition asks for large
    responses (librdkafka's 1 MiB per partition made a reader ~4x slower there), and what it holds stays
    bounded: librdkafka's queue, one response in flight, one chunk of the range as Arrow."""
    with pytest.raises(Built):
        list(reader.read_range(cfg.kafka, "g", OffsetRange("orders", 0, 0, 10), 5))
    settings = built["reader"]
    MiB = 1024 * 1024
    per_partition, per_fetch = settings["max.partition.fetch.bytes"], settings["fetch.max.bytes"]
    assert per_partition == per_fetch >= 16 * MiB  # a reader reads one partition: its share is the whole fetch
    assert settings["receive.message.max.bytes"] >= per_fetch + 512  # librdkafka's own rule
    queue = settings["queued.max.messages.kbytes"] * 1024
    assert queue + per_fetch <= 32 * MiB  # what librdkafka holds for one reader, whatever the backlog
    assert settings["fetch.queue.backoff.ms"] <= 50  # a full queue is looked at again soon, not after 1 s
    # The bound the docs state (docs/speed.md), for the bench's ~110 B records (plus the lineage columns, ~30 B a
    # row in Arrow): 32 MiB of librdkafka + a chunk and a batch as Arrow, whatever max_records_per_task is.
    bound = reader.reader_memory_bound(tasks.CHUNK_RECORDS, 140)
    assert bound == queue + per_fetch + 70_000 * 140
    assert bound < 45 * MiB


def test_a_pipeline_cannot_shrink_the_readers_fetches_by_accident(monkeypatch, built):
    """The reader's fetch sizing wins over the pipeline's client settings (they are the protocol's)."""
    cfg = parse_pipeline(
        {
            "name": "p",
            "topics": ["orders"],
            "table": {"path": "/lake/p"},
            "format": {"type": "raw"},
            "kafka": {"bootstrap_servers": "k:9092", "client": {"max.partition.fetch.bytes": 1048576}},
        },
        "p.yaml",
    )
    with pytest.raises(Built):
        list(reader.read_range(cfg.kafka, "g", OffsetRange("orders", 0, 0, 10), 5))
    assert built["reader"]["max.partition.fetch.bytes"] == reader.FETCH_BYTES


def test_the_offset_mirror_gives_up_on_a_missing_coordinator_within_kafka_timeout_seconds(cfg, built):
    """librdkafka waits for a group's coordinator up to session.timeout.ms (45 s by default; a stream's
    round waited with it when the broker went away right after a batch): the mirror's consumer has both
    its request and its coordinator waits bounded by kafka.timeout_seconds."""
    cluster = kafka.KafkaCluster(cfg.kafka)
    with pytest.raises(Built):
        cluster.commit_group_offsets(cfg.consumer_group, {("orders", 0): 10})
    settings = built["group offsets"]
    expected = int(cfg.kafka.timeout_seconds * 1000)
    assert settings["session.timeout.ms"] == settings["socket.timeout.ms"] == expected


def test_new_clients_do_not_wait_half_the_default_reconnect_backoff(cfg, built):
    """Every client offsetlake creates is new, and librdkafka holds its first request back for half of
    reconnect.backoff.ms once it drops the bootstrap connection (kafka.CLIENT_DEFAULTS): offsetlake's 10 ms
    reaches each client, and a pipeline that sets its own keeps it."""
    for name, call in client_calls(cfg).items():
        with pytest.raises(Built):
            call()
        assert built[name]["reconnect.backoff.ms"] == 10, name
    own = cfg.kafka.model_copy(update={"client": {**cfg.kafka.client, "reconnect.backoff.ms": 250}})
    with pytest.raises(Built):
        kafka.KafkaCluster(own).partitions(cfg.topics)
    assert built["planner (admin)"]["reconnect.backoff.ms"] == 250


def test_the_offset_mirror_keeps_its_consumer_until_a_commit_fails_or_the_cluster_closes(cfg, monkeypatch):
    """A stream mirrors every batch's offsets: through one consumer per group, kept by its cluster (a new one
    would look the group's coordinator up again each time), and a new one after a mirror that failed. A
    commit the broker never answers is given up after kafka.timeout_seconds and the slack, and its consumer
    is released without a close (closing it would wait for the answer)."""
    from confluent_kafka import KafkaError as Code
    from confluent_kafka import TopicPartition

    made = []

    class Consumer:
        answer = "accepted"  # or "refused", "never", or "late" (only an earlier commit's answer comes)

        def __init__(self, settings):
            self.settings, self.commits, self.out, self.closed = settings, [], [], False
            made.append(self)

        def commit(self, offsets, asynchronous):
            assert asynchronous is True
            self.out.append(offsets)

        def poll(self, timeout):
            if not self.out or Consumer.answer == "never":
                return None
            offsets = self.out.pop()
            if Consumer.answer == "late":
                self.settings["on_commit"](None, [TopicPartition("orders", 0, 12)])
            elif Consumer.answer == "refused":
                self.settings["on_commit"](Code(Code.GROUP_AUTHORIZATION_FAILED), offsets)
            else:
                self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])
                self.settings["on_commit"](None, offsets)
            return None

        def close(self):
            self.closed = True

    monkeypatch.setattr(kafka_cluster, "Consumer", Consumer)
    monkeypatch.setattr(kafka_cluster, "GROUP_CALL_SLACK", 0)
    cluster = kafka.KafkaCluster(cfg.kafka.model_copy(update={"timeout_seconds": 1, "retry_seconds": 0}))

    assert cluster.commit_group_offsets("g", {("orders", 0): 10})
    assert cluster.commit_group_offsets("g", {("orders", 0): 12})
    assert len(made) == 1 and made[0].commits == [[("orders", 0, 10)], [("orders", 0, 12)]]
    assert made[0].settings["group.id"] == "g" and not made[0].closed

    Consumer.answer = "refused"
    assert not cluster.commit_group_offsets("g", {("orders", 0): 14})
    assert made[0].closed  # dropped: the next mirror starts with a new consumer
    Consumer.answer = "never"
    assert not cluster.commit_group_offsets("g", {("orders", 0): 14})
    assert len(made) == 2 and not made[1].closed  # released, not closed
    Consumer.answer = "late"
    assert not cluster.commit_group_offsets("g", {("orders", 0): 14})  # not this commit's answer
    Consumer.answer = "accepted"
    assert cluster.commit_group_offsets("g", {("orders", 0): 14})
    assert len(made) == 4 and made[3].commits == [[("orders", 0, 14)]]

    cluster.close()
    assert made[3].closed
