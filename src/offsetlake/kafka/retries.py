"""Kafka's retriable errors and the retry policy every driver-side call and every reader uses, and the
librdkafka settings every client offsetlake creates starts from."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError as _KErr
from confluent_kafka import KafkaException

from offsetlake.config import KafkaSettings

log = logging.getLogger("offsetlake.kafka")
librdkafka_log = logging.getLogger("offsetlake.librdkafka")

TP = tuple[str, int]  # (topic, partition)
AUTH_FAILURE = re.compile(r"SASL|SSL|authenticat|handshake", re.IGNORECASE)


T = TypeVar("T")

# Errors a broker restart, a leader election or a rolling upgrade cause, which the next try may not
# meet. librdkafka marks some retriable itself; these it leaves unmarked in admin and group results.
RETRIABLE = {
    _KErr._TRANSPORT,
    _KErr._ALL_BROKERS_DOWN,
    _KErr._TIMED_OUT,
    _KErr.REQUEST_TIMED_OUT,
    _KErr._WAIT_COORD,
    _KErr.LEADER_NOT_AVAILABLE,
    _KErr.NOT_LEADER_FOR_PARTITION,
    _KErr.FENCED_LEADER_EPOCH,
    _KErr.UNKNOWN_LEADER_EPOCH,
    _KErr.COORDINATOR_LOAD_IN_PROGRESS,
    _KErr.COORDINATOR_NOT_AVAILABLE,
    _KErr.NOT_COORDINATOR,
    _KErr.NOT_ENOUGH_REPLICAS,
    _KErr.BROKER_NOT_AVAILABLE,
    _KErr.REPLICA_NOT_AVAILABLE,
    _KErr.OFFSET_NOT_AVAILABLE,
    _KErr.NETWORK_EXCEPTION,
    _KErr._TIMED_OUT_QUEUE,
    # "Broker handle destroyed without termination": the node left the cluster's metadata while a request
    # to it was out (a 200-fault chaos run's stream died of it in DescribeTopics while a node restarted).
    _KErr._DESTROY_BROKER,
}
FIRST_WAIT, LONGEST_WAIT = 0.5, 10.0  # seconds between tries: doubling, with jitter


def is_retriable(err: Exception) -> bool:
    """A KafkaException the next try may not meet. Never an authentication or authorization failure,
    an unknown topic or a fatal error: those fail at once."""
    kerr = err.args[0] if isinstance(err, KafkaException) and err.args else None
    if not isinstance(kerr, _KErr) or kerr.fatal():
        return False
    return kerr.retriable() or kerr.code() in RETRIABLE or _no_leader_yet(kerr)


def _no_leader_yet(kerr: _KErr) -> bool:
    """An admin request made while the broker is away: librdkafka's cached metadata knows no leader,
    and list_offsets fails with _NOENT "Failed to query partition leaders: No leaders found" (seen in
    chaos). A partition always has a leader again once its broker is back."""
    return kerr.code() == _KErr._NOENT and "leader" in (kerr.str() or "").lower()


class Stopped(Exception):
    """A wait for the broker ended by a stop request (a stream's SIGTERM): nothing was in flight."""


def retrying(
    what: str,
    call: Callable[[], T],
    retry_seconds: float,
    hopeless: Callable[[], bool] = lambda: False,
    before_retry: Callable[[KafkaException], None] = lambda err: None,
    stop: threading.Event | None = None,
) -> T:
    """`call()`, tried again on retriable Kafka errors, waiting 0.5 s, 1 s, 2 s... (at most 10 s, with
    jitter) until `retry_seconds` have passed; then, at once for any other error, or when `hopeless()`
    says the cause will not go away (a refused login surfaces as a mere transport error), it raises.
    Each retry is logged once, with the error and the wait; `before_retry(err)` runs before each.
    `stop` (a stream's SIGTERM) ends a wait at once with `Stopped`: waiting out a broker is pointless then."""
    deadline = time.monotonic() + retry_seconds
    wait = FIRST_WAIT
    while True:
        try:
            return call()
        except KafkaException as err:
            left = deadline - time.monotonic()
            if not is_retriable(err) or left <= 0 or hopeless():
                raise
            pause = min(wait * random.uniform(0.8, 1.2), left)
            log.warning("%s: %s; retrying in %.1f s (for %.0f s more)", what, _describe(err), pause, left)
            if stop is None:
                time.sleep(pause)
            elif stop.wait(pause):
                raise Stopped(f"{what}: stopped while waiting for the broker") from err
            before_retry(err)
            wait = min(wait * 2, LONGEST_WAIT)


# Answers that say the client's picture of the partitions' leaders is out of date (a broker restarted, a
# leader moved). An admin client does not refresh it by itself for ListOffsets, so every retry through the
# same client meets the same answer (docs/development/measurements.md); a new client asks for the leaders
# afresh.
STALE_LEADERS = {
    _KErr.OFFSET_NOT_AVAILABLE,  # and a listed offset of -1001: its leader's node died (see _list_offsets)
    _KErr.FENCED_LEADER_EPOCH,
    _KErr.UNKNOWN_LEADER_EPOCH,
    _KErr.NOT_LEADER_FOR_PARTITION,
    _KErr.LEADER_NOT_AVAILABLE,
}


def stale_leaders(err: KafkaException) -> bool:
    kerr = err.args[0] if err.args else None
    return isinstance(kerr, _KErr) and (kerr.code() in STALE_LEADERS or _no_leader_yet(kerr))


# librdkafka defaults offsetlake changes; a pipeline's `kafka.client` can set them otherwise.
# reconnect.backoff.ms: a new client's first request (a metadata lookup, a group coordinator) goes out on the
# bootstrap connection, which librdkafka (2.5 and later) closes as soon as metadata names the brokers; the
# request is then sent again once a broker may be connected to, and librdkafka holds that back for half of
# reconnect.backoff.ms. Every client offsetlake creates is new (one per batch, one per offset range), so the
# default held each of them back (docs/development/measurements.md). Reconnecting after a broker goes away
# still backs off exponentially, up to reconnect.backoff.max.ms.
CLIENT_DEFAULTS = {"reconnect.backoff.ms": 10}


def client_settings(settings: KafkaSettings, **extra: Any) -> dict[str, Any]:
    """Settings for any client offsetlake creates: CLIENT_DEFAULTS, then the pipeline's, then ours (ours win)."""
    return {**CLIENT_DEFAULTS, **settings.client_config(), "logger": librdkafka_log, **extra}


def _describe(err: Exception) -> str:
    if isinstance(err, KafkaException) and err.args:
        kerr = err.args[0]
        return getattr(kerr, "str", lambda: str(kerr))()
    return str(err)


# Seconds a consumer-group call waits beyond its requests' own timeout (socket.timeout.ms), so the request
# fails first and the call hears it (see KafkaCluster.check_access).
