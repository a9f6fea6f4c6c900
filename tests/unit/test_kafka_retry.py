"""Which Kafka errors are retried, how long, and which fail at once (pure logic; the broker restart
itself is tests/integration/test_broker_restart.py)."""

import pytest
from confluent_kafka import KafkaError, KafkaException

from offsetlake import kafka
from offsetlake.kafka import is_retriable, retrying


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
    monkeypatch.setattr(kafka.time, "sleep", slept.append)
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
