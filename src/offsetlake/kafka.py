"""Driver-side Kafka access: metadata, offsets, consumer-group commits.

Everything here speaks the Kafka protocol through confluent-kafka, so it works
the same against noida-db and Apache Kafka. librdkafka's own log lines go to a
Python logger instead of stderr: a down broker otherwise prints a line a second.
"""
from __future__ import annotations

import logging
import re
from collections import deque
from typing import Iterable

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from offsetlake.config import KafkaSettings
from offsetlake.errors import KafkaError

log = logging.getLogger("offsetlake.kafka")
librdkafka_log = logging.getLogger("offsetlake.librdkafka")

TP = tuple[str, int]  # (topic, partition)
AUTH_FAILURE = re.compile(r"SASL|SSL|authenticat|handshake", re.IGNORECASE)


def client_settings(settings: KafkaSettings, **extra) -> dict:
    """Settings for any client offsetlake creates: the pipeline's plus ours (ours win)."""
    return {**settings.client_config(), "logger": librdkafka_log, **extra}


def _describe(err: Exception) -> str:
    if isinstance(err, KafkaException) and err.args:
        kerr = err.args[0]
        return getattr(kerr, "str", lambda: str(kerr))()
    return str(err)


class KafkaCluster:
    """The cluster one pipeline reads from, seen from the Spark driver."""

    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.timeout = settings.timeout_seconds
        self._admin: AdminClient | None = None
        self._broker_errors: deque[str] = deque(maxlen=20)  # the latest, for error messages

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(client_settings(self.settings, error_cb=self._remember))
        return self._admin

    def _remember(self, err) -> None:
        self._broker_errors.append(err.str())

    def _fail(self, what: str, err: Exception) -> KafkaError:
        where = f"Kafka at {self.settings.bootstrap_servers}"
        cause = self._connection_cause()
        if cause and AUTH_FAILURE.search(cause):
            return KafkaError(f"{where}: authentication failed: {cause}")
        return KafkaError(f"{where}: {what}: {_describe(err)}" + (f"; last connection error: {cause}" if cause else ""))

    def _connection_cause(self) -> str | None:
        """librdkafka reports why it could not connect (refused, SASL, SSL) only through error_cb."""
        if self._admin is None:
            return None
        self._admin.poll(0.2)
        specific = [e for e in self._broker_errors if "brokers are down" not in e]
        if not specific:
            return None
        # "sasl_plaintext://host:port/bootstrap: SASL authentication error: ... (after 0ms in state AUTH_REQ)"
        return re.sub(r"\s*\(after \d+ms in state [A-Z_]+.*\)$", "", specific[-1].split("/bootstrap: ", 1)[-1])

    def partitions(self, topics: Iterable[str]) -> list[TP]:
        """Every partition of the topics; an unknown topic is an error (never auto-created)."""
        try:
            metadata = self.admin.list_topics(timeout=self.timeout)
        except KafkaException as err:
            raise self._fail("cannot read cluster metadata (is the broker reachable?)", err) from None
        result: list[TP] = []
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None:
                raise KafkaError(f"unknown topic {topic!r} on Kafka at {self.settings.bootstrap_servers}")
            if meta.error is not None:
                raise KafkaError(f"topic {topic!r} is not readable: {meta.error.str()}")
            result.extend((topic, p) for p in sorted(meta.partitions))
        return result

    def _list_offsets(self, tps: list[TP], spec: OffsetSpec, isolation=IsolationLevel.READ_UNCOMMITTED) -> dict[TP, int]:
        if not tps:
            return {}
        request = {TopicPartition(t, p): spec for t, p in tps}
        try:
            futures = self.admin.list_offsets(request, isolation_level=isolation, request_timeout=self.timeout)
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
        except KafkaException as err:
            raise self._fail("cannot list offsets", err) from None

    def end_offsets(self, tps: list[TP], isolation_level: str) -> dict[TP, int]:
        """LSO under read_committed (never past an open transaction), else the high watermark."""
        level = IsolationLevel.READ_COMMITTED if isolation_level == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        return self._list_offsets(tps, OffsetSpec.latest(), level)

    def start_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """Log start offsets: anything below was deleted by retention or DeleteRecords."""
        return self._list_offsets(tps, OffsetSpec.earliest())

    def offsets_for_time(self, tps: list[TP], timestamp_ms: int) -> dict[TP, int]:
        return self._list_offsets(tps, OffsetSpec.for_timestamp(timestamp_ms))

    def commit_group_offsets(self, group: str, offsets: dict[TP, int]) -> bool:
        """Mirror the ledger into the consumer group so lag tools see it. Informational only."""
        if not offsets:
            return True
        consumer = None
        try:
            consumer = Consumer(client_settings(self.settings, **{"group.id": group, "enable.auto.commit": False}))
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
            return True
        except KafkaException as err:
            log.warning("could not mirror offsets to consumer group %s: %s", group, _describe(err))
            return False
        finally:
            if consumer is not None:
                consumer.close()

    def group_offsets(self, group: str, tps: list[TP]) -> dict[TP, int | None]:
        consumer = Consumer(client_settings(self.settings, **{"group.id": group, "enable.auto.commit": False}))
        try:
            committed = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=self.timeout)
            return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in committed}
        except KafkaException as err:
            raise self._fail(f"cannot read offsets of consumer group {group}", err) from None
        finally:
            consumer.close()
