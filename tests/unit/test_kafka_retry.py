"""Which Kafka errors are retried, how long, and which fail at once (pure logic; the broker restart
itself is tests/integration/test_broker_restart.py)."""

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from offsetlake import kafka
from offsetlake.kafka import cluster as kafka_cluster
from offsetlake.kafka import is_retriable, retrying
from offsetlake.kafka import retries as kafka_retries


def failing(*codes):
    """A call that raises these errors in turn, then returns "ok"."""
    left = list(codes)

    def call():
        if left:
            raise KafkaException(KafkaError(left.pop(0)))
        return "ok"

    return call


@pytest.fixture
def waits(monkeypatch):
    slept = []
    monkeypatch.setattr(kafka_retries.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TRANSPORT,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._DESTROY_BROKER,  # a node left the metadata with a request out
        KafkaError.OFFSET_NOT_AVAILABLE,  # also what offsetlake raises for a listed offset of -1001
    ],
)
def test_what_a_broker_restart_causes_is_retried(code):
    assert is_retriable(KafkaException(KafkaError(code)))


def test_no_leader_known_while_the_broker_is_away_is_retried():
    # What list_offsets raises when the admin client's metadata has no leader (broker restarting).
    assert is_retriable(
        KafkaException(KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found"))
    )
    assert not is_retriable(KafkaException(KafkaError(KafkaError._NOENT, "no such consumer group")))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.OFFSET_OUT_OF_RANGE,
    ],
)
def test_what_cannot_get_better_is_not(code):
    assert not is_retriable(KafkaException(KafkaError(code)))
    assert not is_retriable(ValueError("not Kafka's"))


def test_retries_back_off_and_then_succeed(waits, caplog):
    call = failing(KafkaError._TRANSPORT, KafkaError.FENCED_LEADER_EPOCH, KafkaError._TRANSPORT)
    assert retrying("list offsets", call, retry_seconds=120) == "ok"
    assert len(waits) == 3 and waits[0] < waits[1] < waits[2]  # 0.5, 1, 2 s with +-20% jitter
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["list offsets"] * 3


def test_a_non_retriable_error_is_raised_at_once(waits):
    with pytest.raises(KafkaException):
        retrying("metadata", failing(KafkaError.TOPIC_AUTHORIZATION_FAILED), retry_seconds=120)
    assert waits == []


def test_no_retry_past_the_deadline_or_when_hopeless(waits):
    with pytest.raises(KafkaException):
        retrying("metadata", failing(KafkaError._TRANSPORT), retry_seconds=0)
    with pytest.raises(KafkaException):
        retrying("metadata", failing(KafkaError._TRANSPORT), retry_seconds=120, hopeless=lambda: True)
    assert waits == []


def test_a_stop_request_ends_the_wait_for_the_broker_at_once():
    import threading

    stop = threading.Event()
    stop.set()
    with pytest.raises(kafka.Stopped, match="^metadata: stopped while waiting for the broker$"):
        retrying("metadata", failing(KafkaError._TRANSPORT), retry_seconds=120, stop=stop)
    assert retrying("metadata", failing(), retry_seconds=120, stop=stop) == "ok"  # an answer is an answer


class _Listed:
    """What AdminClient.list_offsets hands back per partition: a future of a result with an offset."""

    def __init__(self, offset):
        self.offset = offset

    def result(self, timeout=None):
        return self


def test_a_listed_offset_of_minus_1001_is_asked_again_through_a_new_client_unless_none_is_an_answer(waits, monkeypatch):
    from confluent_kafka.admin import OffsetSpec

    from offsetlake.config import KafkaSettings

    answers = [[-1001, 7], [12, 7]]  # after a restart: no offset, and no error either; then the real one

    class Admin:
        def poll(self, timeout):  # asked why a connection failed (none here)
            return 0

        def list_offsets(self, request, **_):
            offsets = answers.pop(0) if answers else [-1, -1]
            return {tp: _Listed(o) for tp, o in zip(request, offsets, strict=True)}

    clients: list[Admin] = []
    monkeypatch.setattr(kafka_cluster, "AdminClient", lambda settings: clients.append(Admin()) or clients[-1])
    cluster = kafka.KafkaCluster(KafkaSettings(bootstrap_servers="127.0.0.1:9", retry_seconds=60))
    tps = [("t", 0), ("t", 1)]
    assert cluster.end_offsets(tps, "read_committed") == {("t", 0): 12, ("t", 1): 7} and len(waits) == 1
    assert len(clients) == 2  # the first client's leaders may be a dead node's: the retry asks through a new one
    # A timestamp past the last record has no offset: that is the answer, not a broker still starting.
    assert cluster._list_offsets(tps, OffsetSpec.latest(), none_is_an_answer=True) == {("t", 0): -1, ("t", 1): -1}


class AnsweringConsumer:
    """A consumer whose commit is answered (through on_commit) at its `answer_at`-th poll; None: never. Each
    poll lasts its timeout, as a real one's that reads nothing does, and is recorded."""

    def __init__(self, on_commit, answer_at: int | None):
        self.on_commit, self.answer_at, self.polls, self.sent = on_commit, answer_at, [], None

    def commit(self, offsets, asynchronous):
        assert asynchronous
        self.sent = offsets

    def poll(self, timeout):
        self.polls.append(timeout)
        time.sleep(timeout)
        if len(self.polls) == self.answer_at:
            self.on_commit(None, self.sent)


def committer_answering_at(poll: int | None, wait: float):
    """An OffsetCommitter on an AnsweringConsumer, and that consumer."""
    made: list[AnsweringConsumer] = []

    def make(on_commit):
        made.append(AnsweringConsumer(on_commit, poll))
        return made[0]

    committer = kafka_cluster.OffsetCommitter(make, wait)  # makes its consumer at once
    return committer, made[0]


def test_an_offset_commit_is_awaited_in_short_polls_first_then_longer_ones():
    """A consumer that assigns nothing returns from poll() only at its timeout, answered or not: the committer
    asks briefly first, so an answer that comes at once is not held for a long poll."""
    committer, consumer = committer_answering_at(3, wait=5)

    committer.commit({("t", 0): 7})

    assert consumer.polls == [kafka_cluster.ANSWER_POLL_SHORT] * 3


def test_an_offset_commit_never_answered_polls_at_most_the_longest_pause_and_times_out():
    committer, consumer = committer_answering_at(None, wait=0.5)

    with pytest.raises(KafkaException, match="no answer in 0.5 s"):
        committer.commit({("t", 0): 7})

    assert committer.unanswered
    short, long = kafka_cluster.ANSWER_POLL_SHORT, kafka_cluster.ANSWER_POLL_LONG
    assert consumer.polls == sorted(consumer.polls) and set(consumer.polls) == {short, long}
    assert sum(p for p in consumer.polls if p == short) <= kafka_cluster.ANSWER_DUE_WITHIN + short


def test_a_prepared_mirror_commits_through_the_consumer_it_created_before(monkeypatch):
    """A batch prepares its group's mirror before its Spark job, so that the consumer looks the group's
    coordinator up meanwhile: the commit after the job goes through that consumer, not a new one."""
    from offsetlake.config import KafkaSettings

    made: list[AnsweringConsumer] = []

    def group_consumer(self, group, on_commit, **extra):
        made.append(AnsweringConsumer(on_commit, answer_at=1))
        return made[-1]

    monkeypatch.setattr(kafka.KafkaCluster, "_group_consumer", group_consumer)
    cluster = kafka.KafkaCluster(KafkaSettings(bootstrap_servers="127.0.0.1:9"))

    cluster.prepare_group_offsets("orders")
    assert len(made) == 1 and made[0].sent is None  # created, nothing committed yet

    assert cluster.commit_group_offsets("orders", {("t", 0): 7})
    assert len(made) == 1 and [(tp.topic, tp.partition, tp.offset) for tp in made[0].sent] == [("t", 0, 7)]
