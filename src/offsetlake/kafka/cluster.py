"""Driver-side Kafka access: metadata, offsets, consumer-group commits.

Everything here speaks the Kafka protocol through confluent-kafka, so it works
against Apache Kafka and any Kafka-protocol service. librdkafka's own log lines go to a
Python logger instead of stderr: a down broker otherwise prints a line a second.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _KErr
from confluent_kafka.admin import AdminClient, OffsetSpec

from offsetlake.config import KafkaSettings
from offsetlake.errors import KafkaError
from offsetlake.kafka.retries import (
    AUTH_FAILURE,
    TP,
    Stopped,
    _describe,
    client_settings,
    is_retriable,
    log,
    retrying,
    stale_leaders,
)

T = TypeVar("T")

GROUP_CALL_SLACK = 5

_REFUSED = re.compile(r"(Topic|Group|Cluster|Transactional Id) authorization failed")


def _operations(description) -> list[str] | None:
    """The operations a describe answer says this client may do; None if the broker did not say."""
    operations = getattr(description, "authorized_operations", None)
    return None if operations is None else [op.name for op in operations]


def _listed(operations: list[str]) -> str:
    return ", ".join(sorted(operations)) or "nothing"


class KafkaCluster:
    """The cluster one pipeline reads from, seen from the Spark driver."""

    def __init__(self, settings: KafkaSettings, stop: threading.Event | None = None):
        """`stop`: set by a stream's SIGTERM; it ends any wait for the broker with `Stopped`."""
        self.settings = settings
        self.stop = stop
        self.timeout = settings.timeout_seconds
        self._admin: AdminClient | None = None
        self._committers: dict[str, OffsetCommitter] = {}  # per consumer group: what mirrors its offsets
        self._broker_errors: deque[str] = deque(maxlen=20)  # the latest, for error messages

    def close(self) -> None:
        """Close the consumers kept for mirroring offsets. A cluster is used by one thread at a time: a run
        of `ingest` creates one, a stream keeps one per table across its rounds."""
        committers, self._committers = self._committers, {}
        for committer in committers.values():
            committer.close()

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(client_settings(self.settings, error_cb=self._remember))
        return self._admin

    @property
    def _socket_ms(self) -> int:
        return max(int(self.timeout * 1000), 1000)

    def _forget_stale_leaders(self, err: KafkaException) -> None:
        """The next try asks through a new admin client: it looks the leaders up again (STALE_LEADERS)."""
        if stale_leaders(err):
            self._admin = None

    def _remember(self, err) -> None:
        self._broker_errors.append(err.str())

    def _fail(self, what: str, err: Exception) -> KafkaError:
        where = f"Kafka at {self.settings.bootstrap_servers}"
        cause = self._connection_cause()
        if cause and AUTH_FAILURE.search(cause):
            return KafkaError(f"{where}: authentication failed: {cause}")
        return KafkaError(f"{where}: {what}: {_describe(err)}" + (f"; last connection error: {cause}" if cause else ""))

    def _login_refused(self) -> bool:
        cause = self._connection_cause()
        return bool(cause and AUTH_FAILURE.search(cause))

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

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """`call()` with retries on retriable errors for `kafka.retry_seconds`; then a one-line KafkaError."""
        try:
            return retrying(
                f"Kafka at {self.settings.bootstrap_servers}: {what}",
                call,
                self.settings.retry_seconds,
                hopeless=self._login_refused,
                before_retry=self._forget_stale_leaders,
                stop=self.stop,
            )
        except KafkaException as err:
            raise self._fail(what, err) from err

    def partitions(self, topics: Iterable[str]) -> list[TP]:
        """Every partition of the topics; an unknown topic is an error (never auto-created)."""
        topics = list(topics)

        def read() -> list[TP]:
            metadata = self.admin.list_topics(timeout=self.timeout)
            result: list[TP] = []
            for topic in topics:
                meta = metadata.topics.get(topic)
                if meta is None:
                    self._refused_or_unknown(topic)
                if meta.error is not None:
                    if is_retriable(KafkaException(meta.error)):
                        raise KafkaException(meta.error)  # a topic without a leader while a broker restarts
                    raise KafkaError(f"topic {topic!r} is not readable: {meta.error.str()}")
                result.extend((topic, p) for p in sorted(meta.partitions))
            return result

        return self._retrying("cannot read cluster metadata (is the broker reachable?)", read)

    def topic_names(self) -> list[str]:
        """Every topic this client may see: what a topic pattern is matched against
        (offsetlake.config.topic_tables, which leaves Kafka's internal topics out)."""

        def read() -> list[str]:
            return sorted(self.admin.list_topics(timeout=self.timeout).topics)

        return self._retrying("cannot read cluster metadata (is the broker reachable?)", read)

    def _refused_or_unknown(self, topic: str) -> NoReturn:
        """A topic missing from the cluster's metadata is unknown, or hidden from this client by the ACLs
        (no DESCRIBE): asked by name (DescribeTopicPartitions, which never creates a topic), the broker says
        which."""
        from confluent_kafka import TopicCollection

        where = f"Kafka at {self.settings.bootstrap_servers}"
        try:
            future = self.admin.describe_topics(TopicCollection([topic]), request_timeout=self.timeout)[topic]
            future.result()
        except KafkaException as err:
            kerr = err.args[0] if err.args else None
            if isinstance(kerr, _KErr) and kerr.code() == _KErr.TOPIC_AUTHORIZATION_FAILED:
                raise KafkaError(f"{where}: not authorized to DESCRIBE topic {topic!r}") from err
        raise KafkaError(f"unknown topic {topic!r} on {where}")

    def check_access(self, topics: Iterable[str], group: str) -> None:
        """Fail in one line if the broker's ACLs refuse this client READ on a topic or DESCRIBE on the
        pipeline's consumer group: a batch reads with the first and mirrors its offsets through the second,
        and both would otherwise fail only in Spark's tasks or after the commit. A broker that does not say
        what is allowed (no authorized operations in its answer) is taken at its word later."""
        from confluent_kafka import TopicCollection

        topics = list(topics)
        where = f"Kafka at {self.settings.bootstrap_servers}"

        def describe_topics() -> dict[str, list[str] | None]:
            futures = self.admin.describe_topics(
                TopicCollection(topics), include_authorized_operations=True, request_timeout=self.timeout
            )
            return {name: _operations(f.result()) for name, f in futures.items()}

        def describe_group() -> None:
            # Asked as a consumer asks for its committed offsets (OffsetFetch, which needs DESCRIBE on the
            # group), not through the admin API: librdkafka 2.x aborts the process when a coordinator-bound
            # admin request (DescribeConsumerGroups) meets a dropped connection (`rd_kafka_enq_once_del_
            # source_return: Assertion eonce->refcnt > 0`, librdkafka issue 4605, fix pending in PR 5397);
            # chaos-run ingests died so across broker restarts.
            consumer = self._group_consumer(group, error_cb=self._remember, **{"socket.timeout.ms": self._socket_ms})
            try:
                self._fetch_committed_or_refusal(consumer, TopicPartition(topics[0], 0))
            finally:
                consumer.close()

        described = self._refusing("cannot describe topics", describe_topics, f"DESCRIBE topics {topics}")
        for topic, allowed in described.items():
            if allowed is not None and "READ" not in allowed and "ALL" not in allowed:
                raise KafkaError(f"{where}: not authorized to READ topic {topic!r} (allowed: {_listed(allowed)})")
        refusal = f"DESCRIBE consumer group {group!r}"
        self._refusing(f"cannot describe consumer group {group}", describe_group, refusal)

    def _fetch_committed_or_refusal(self, consumer: Consumer, tp: TopicPartition) -> None:
        """Fetch `tp`'s committed offset until it answers; a refusal of the coordinator lookup is not the
        call's answer (it times out) but an event on the consumer's queue, so each short try looks there.
        A coordinator still away at the deadline is let be: the offset mirror asks later and says so."""
        deadline = time.monotonic() + self.timeout + GROUP_CALL_SLACK
        while True:
            try:
                consumer.committed([tp], timeout=min(1.0, self.timeout))
                return
            except KafkaException as err:
                if not is_retriable(err):
                    raise
            event = consumer.poll(0)
            if event is not None and event.error() is not None and not is_retriable(KafkaException(event.error())):
                raise KafkaException(event.error())
            if time.monotonic() > deadline:
                return

    def _refusing(self, what: str, call: Callable[[], T], refusal: str) -> T:
        """`_retrying`, where the broker's authorization refusal becomes "not authorized to `refusal`"."""
        try:
            return self._retrying(what, call)
        except KafkaError as err:
            if _REFUSED.search(str(err)):
                raise KafkaError(f"Kafka at {self.settings.bootstrap_servers}: not authorized to {refusal}") from err
            raise

    def _list_offsets(
        self, tps: list[TP], spec: OffsetSpec, isolation=IsolationLevel.READ_UNCOMMITTED, none_is_an_answer=False
    ) -> dict[TP, int]:
        """Each partition's offset for `spec`. A negative one is asked again unless `none_is_an_answer` (a
        timestamp past the last record): the first ListOffsets after a broker restarted can answer the
        latest offset as -1001 without an error, which a planner would take for an empty partition, and
        so does every ListOffsets through the same client for a partition whose leader's node died
        (docs/development/measurements.md); a new client (STALE_LEADERS) asks the new leader."""
        if not tps:
            return {}
        request = {TopicPartition(t, p): spec for t, p in tps}

        def list_offsets() -> dict[TP, int]:
            futures = self.admin.list_offsets(request, isolation_level=isolation, request_timeout=self.timeout)
            offsets = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            unknown = sorted(tp for tp, offset in offsets.items() if offset < 0)
            if unknown and not none_is_an_answer:
                raise KafkaException(_KErr(_KErr.OFFSET_NOT_AVAILABLE, f"the broker gave no offset for {unknown}"))
            return offsets

        return self._retrying("cannot list offsets", list_offsets)

    def end_offsets(self, tps: list[TP], isolation_level: str) -> dict[TP, int]:
        """LSO under read_committed (never past an open transaction), else the high watermark."""
        level = (
            IsolationLevel.READ_COMMITTED if isolation_level == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        )
        return self._list_offsets(tps, OffsetSpec.latest(), level)

    def start_offsets(self, tps: list[TP]) -> dict[TP, int]:
        """Log start offsets: anything below was deleted by retention or DeleteRecords."""
        return self._list_offsets(tps, OffsetSpec.earliest())

    def cleanup_policies(self, topics: list[str]) -> dict[str, str | None]:
        """Each topic's `cleanup.policy` (delete, compact or both); None where the broker does not say
        (a broker without DescribeConfigs, or no permission to describe): informational only."""
        from confluent_kafka.admin import ConfigResource, ResourceType

        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        policies: dict[str, str | None] = dict.fromkeys(topics)
        try:
            futures = self.admin.describe_configs(resources, request_timeout=self.timeout)
            for resource, future in futures.items():
                entry = future.result(timeout=self.timeout).get("cleanup.policy")
                policies[resource.name] = None if entry is None else entry.value
        except (KafkaException, TimeoutError, ValueError) as err:
            log.info("cannot describe the topics' cleanup.policy: %s", err)
        return policies

    def offsets_for_time(self, tps: list[TP], timestamp_ms: int) -> dict[TP, int]:
        return self._list_offsets(tps, OffsetSpec.for_timestamp(timestamp_ms), none_is_an_answer=True)

    def prepare_group_offsets(self, group: str) -> None:
        """Create `group`'s offset mirror now: its consumer looks the group's coordinator up in librdkafka's
        own threads as soon as it exists, so a batch that calls this before its Spark job finds the lookup
        done when it mirrors its offsets after the commit, instead of waiting for it then."""
        self._committer(group)

    def commit_group_offsets(self, group: str, offsets: dict[TP, int]) -> bool:
        """Mirror the ledger into the consumer group so lag tools see it. Informational only: a mirror that
        fails is logged and the next batch mirrors again.

        Through an OffsetCommitter per group, kept until `close` (a new one would look the group's
        coordinator up again at every batch); a try the broker does not answer in time is tried again
        through a new one, for `kafka.retry_seconds`. Not the admin client's alter_consumer_group_offsets:
        a coordinator-bound admin request aborts the process on a dropped connection (librdkafka issue
        4605; see check_access).

        The committer (and `group_offsets`' consumer) never assigns a partition, so it never fetches: fetch
        sizes do not apply. The planner only lists offsets (admin requests). Every consumer that fetches
        records, the batch's readers and audit's read of Kafka alike, is reader.RangeReader, sized in
        reader.py."""
        if not offsets:
            return True
        try:
            retrying(
                f"consumer group {group}: cannot mirror offsets",
                lambda: self._committer(group).commit(offsets),
                self.settings.retry_seconds,
                before_retry=lambda err: self._drop_unanswered(group),
                stop=self.stop,
            )
            return True
        except (KafkaException, Stopped) as err:
            failed = self._committers.pop(group, None)
            if failed is not None:
                failed.close()
            log.warning("could not mirror offsets to consumer group %s: %s", group, _describe(err))
            return False

    def _committer(self, group: str) -> OffsetCommitter:
        if group not in self._committers:
            # librdkafka waits for the group's coordinator up to session.timeout.ms (45 s by default) whatever
            # socket.timeout.ms says; this consumer never joins the group, so it means nothing else here.
            bounded = {"socket.timeout.ms": self._socket_ms, "session.timeout.ms": self._socket_ms}
            self._committers[group] = OffsetCommitter(
                lambda on_commit: self._group_consumer(group, on_commit=on_commit, **bounded),
                wait=self.timeout + GROUP_CALL_SLACK,
            )
        return self._committers[group]

    def _drop_unanswered(self, group: str) -> None:
        committer = self._committers.get(group)
        if committer is not None and committer.unanswered:
            del self._committers[group]
            committer.close()

    def _group_consumer(self, group: str, **extra) -> Consumer:
        """A consumer of `group` that reads or commits its offsets and never joins it (no subscription)."""
        return Consumer(client_settings(self.settings, **{"group.id": group, "enable.auto.commit": False, **extra}))

    def group_offsets(self, group: str, tps: list[TP]) -> dict[TP, int | None]:
        consumer = self._group_consumer(group)
        try:
            committed = self._retrying(
                f"cannot read offsets of consumer group {group}",
                lambda: consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=self.timeout),
            )
            return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in committed}
        finally:
            consumer.close()


# How long OffsetCommitter.commit polls at a time for its answer: briefly while a broker's answer is due (each
# poll lasts its whole timeout, so the pause is how late an answer is seen), then longer.
ANSWER_POLL_SHORT = 0.001
ANSWER_DUE_WITHIN = 0.1
ANSWER_POLL_LONG = 0.1


class OffsetCommitter:
    """A consumer of one group that commits its offsets and never joins it, each commit awaited for at most
    `wait` seconds. librdkafka never answers a commit whose request was out when the broker went away: a
    synchronous commit then waits until the broker is back, and so does closing the consumer that sent it
    (librdkafka issue 3740; a stream's round hung so, docs/development/measurements.md). So commits are
    asynchronous, and a committer whose commit went unanswered is released without a close."""

    def __init__(self, make: Callable[[Callable[[Any, list[TopicPartition]], None]], Consumer], wait: float):
        """`make(on_commit)`: the consumer, built with the callback its commits answer through."""
        answers: dict[frozenset[tuple[str, int, int]], KafkaException | None] = {}

        def on_commit(err: Any, partitions: list[TopicPartition]) -> None:  # no reference back to the consumer
            refused = [tp.error for tp in partitions or [] if tp.error is not None]
            error = err or (refused[0] if refused else None)
            answers[_sent(partitions or [])] = None if error is None else KafkaException(error)

        self.answers = answers  # by the offsets each answers for: a late answer to an earlier try is not this one's
        self.consumer: Consumer | None = make(on_commit)
        self.wait = wait
        self.unanswered = False

    def commit(self, offsets: dict[TP, int]) -> None:
        """Commit `offsets`: the broker's refusal is raised, and so is a timeout when no answer came in time."""
        assert self.consumer is not None and not self.unanswered, "a committer left unanswered is not used again"
        partitions = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        sent = _sent(partitions)
        self.answers.clear()
        self.consumer.commit(offsets=partitions, asynchronous=True)
        sent_at = time.monotonic()
        while sent not in self.answers:
            waited = time.monotonic() - sent_at
            if waited >= self.wait:
                self.unanswered = True
                raise KafkaException(_KErr(_KErr._TIMED_OUT, f"the offset commit had no answer in {self.wait:g} s"))
            # Serves on_commit. A consumer that never assigns a partition reads nothing, so poll() returns only
            # at its timeout, an answer served or not: short while a broker's answer is due (the first commit
            # of a group also looks its coordinator up), longer while it does not come.
            self.consumer.poll(ANSWER_POLL_SHORT if waited < ANSWER_DUE_WITHIN else ANSWER_POLL_LONG)
        refusal = self.answers[sent]
        if refusal is not None:
            raise refusal

    def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None and not self.unanswered:
            consumer.close()
        # Unanswered: dropping the last reference destroys the client without the consumer close that would
        # wait for the answer (confluent-kafka's Consumer deallocates with RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE).


def _sent(partitions: list[TopicPartition]) -> frozenset[tuple[str, int, int]]:
    return frozenset((tp.topic, tp.partition, tp.offset) for tp in partitions)


def topic_lister(settings: KafkaSettings) -> Callable[[], list[str]]:
    """The cluster's topic names, read when called: what a pipeline's topic patterns and tables per topic
    are resolved against (offsetlake.config.topic_tables); a pipeline that names its topics never calls it."""
    return lambda: KafkaCluster(settings).topic_names()
