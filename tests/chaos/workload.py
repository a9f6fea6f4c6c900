"""The chaos harness's producers: Kafka traffic that keeps coming while jobs are killed.

Two threads write the demo events (1% of them records the schema rejects):
one mixes idempotent writes with short transactions, some aborted after their
records reached the log; the other holds transactions open for seconds, so the
last stable offset stalls behind them, then commits or aborts them.

Every record is told to a journal (the oracle's producer-side truth): where
the broker put it, and whether its transaction committed or aborted. A
transaction whose end raised, or that was open while the broker restarted
(noida-db aborts it, and a later commit_transaction still succeeds), stays
"in doubt": only Kafka decides it; so does any record whose life overlaps a
broker restart (the journal's outage windows: noida-db may lose what it
acknowledged in the moment around its SIGTERM).

Both survive a broker restart: on any error the transactional producer is
abandoned and a new one starts under a fresh transactional id. A fresh id is
also taken after every abort, and after every broker restart (noida-db aborts
open transactions when it restarts): noida-db 0.2.3 lists every aborted
transaction of a partition in each fetch, so a standard client reading from
mid-log would drop later records of an aborting producer id. Apache Kafka
does not; without this the harness would report the broker's losses as ours.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import KafkaException, Producer

from offsetlake.config import KafkaSettings
from offsetlake.kafka import client_settings
from offsetlake.local.producer import Journal, demo_event, with_bad_records

# Avro mode: the first records use schema 1 only, so the table is created without the field schema 2
# adds; after them both versions mix and the column arrives mid-run, in the commit of its first record.
EVOLVE_AT_SEQ = 1500

TOMBSTONE_SHARE = 0.05
CHUNK = 20
TIMEOUT = 10
# A fatal producer error after a broker restart can reach us as a SystemError chained to the
# KafkaException: confluent-kafka runs the log callback while that error is still pending
# (confluent-kafka-python issues #729 and #865). Either way the producer is replaced.
PRODUCER_ERRORS = (KafkaException, SystemError)
# The producers stop writing before a broker restart and the broker is left this long to keep what it
# acknowledged: noida-db loses records acknowledged around its SIGTERM and hands their offsets out again
# after it is back (measured, 200-fault upsert run, seed 2911: the table had read key 96 at p0@16050, and
# after the restart Kafka returned there a record produced during the outage), which no Apache Kafka
# broker with acks=all does. The jobs still run through every restart; open transactions still span it.
SETTLE_BEFORE_RESTART = 1.0
# ... and some time after it is back: records a transaction committed 1.2-1.3 s after noida-db answered
# again were gone later, their offsets reused (measured twice, seed 2911). The jobs run meanwhile.
SETTLE_AFTER_RESTART = 3.0
QUIESCE_TIMEOUT = 30


class Workload:
    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        seed: int,
        journal: Journal,
        pause_seconds: float = 0.1,
        registry_url: str | None = None,
        keys: int | None = None,
    ):
        self.settings, self.topic, self.pause, self.journal = settings, topic, pause_seconds, journal
        self.registry_url = registry_url  # avro mode: demo events in Avro through this registry
        self.keys = keys  # upsert mode: records keyed 1..keys, one in twenty a tombstone
        self.stop_event = threading.Event()
        self.counts: Counter = Counter()
        self._generation = itertools.count()
        self._epoch = 0  # bumped on broker restart: every transactional producer starts afresh
        self._makers = threading.local()  # one record maker (and serializer) per producing thread
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._gate = threading.Event()  # set: the producers may write
        self._gate.set()
        self._writing = 0  # producer threads between their first write and its acknowledgement
        self._idle = threading.Condition(self._lock)
        self._threads = [
            threading.Thread(target=self._mixed, args=(random.Random(seed),), daemon=True, name="chaos-mixed"),
            threading.Thread(target=self._long_open, args=(random.Random(seed + 1),), daemon=True, name="chaos-open"),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Finish: the open transaction is committed or aborted, nothing is left pending."""
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=60)

    def broker_stopping(self) -> None:
        """Called before the broker is stopped: the producers finish what they are writing and wait (see
        SETTLE_BEFORE_RESTART). A transaction open now may be aborted by the broker, even if its producer's
        commit_transaction succeeds later (noida-db), so its commit is in doubt."""
        self._quiesce()
        self.journal.broker_stopping()
        with self._lock:
            self._epoch += 1

    def broker_restarted(self) -> None:
        with self._lock:
            self._epoch += 1
        self.journal.broker_back()
        opening = threading.Timer(SETTLE_AFTER_RESTART, self._gate.set)
        opening.daemon = True
        opening.start()

    def _quiesce(self) -> None:
        self._gate.clear()
        deadline = time.monotonic() + QUIESCE_TIMEOUT
        with self._idle:
            while self._writing and time.monotonic() < deadline:
                self._idle.wait(0.1)
            if self._writing:
                self.counts["restarts with a producer still writing"] += 1
        time.sleep(SETTLE_BEFORE_RESTART)

    @contextmanager
    def _producing(self) -> Iterator[None]:
        """Around writes and their acknowledgements (and commits or aborts): not while a restart is near."""
        while not self._gate.wait(0.1):
            if self.stop_event.is_set():
                break
        with self._lock:
            self._writing += 1
        try:
            yield
        finally:
            with self._idle:
                self._writing -= 1
                self._idle.notify_all()

    def _send(self, producer: Producer, rng: random.Random, transaction: str | None) -> None:
        """Produce the next record, told to the journal (as part of `transaction`, or on its own)."""
        make = getattr(self._makers, "make", None)
        if make is None:
            make = self._makers.make = with_bad_records(self._maker(), 0.01)
        key, value, *headers = make(rng, next(self._seq))
        if self.keys:  # the default partitioner keeps each key to one partition, as upsert mode expects
            key = str(rng.randint(1, self.keys)).encode()
            value = None if rng.random() < TOMBSTONE_SHARE else value
        record = {"key": key, "value": value, **({"headers": headers[0]} if headers and headers[0] else {})}
        producer.produce(self.topic, **record, on_delivery=self.journal.sent(self.topic, record, transaction))

    def _maker(self):
        if self.registry_url is None:
            return demo_event
        from offsetlake.local.producer import avro_event_maker, registry_client

        client = registry_client(self.registry_url)
        v1, v2 = avro_event_maker(client, self.topic, 1), avro_event_maker(client, self.topic, 2)
        return lambda rng, seq: (v2 if seq >= EVOLVE_AT_SEQ and rng.random() < 0.5 else v1)(rng, seq)

    def _transactional(self) -> tuple[Producer, int]:
        with self._lock:
            epoch = self._epoch
        producer = Producer(
            client_settings(
                self.settings,
                **{
                    "transactional.id": f"chaos-{uuid.uuid4().hex[:8]}-{next(self._generation)}",
                    "transaction.timeout.ms": 60_000,
                    "linger.ms": 5,
                },
            )
        )
        producer.init_transactions(TIMEOUT)
        return producer, epoch

    def _fresh(self, epoch: int) -> bool:
        with self._lock:
            return epoch == self._epoch

    def _transaction(self, rng: random.Random, state: dict, size: int, hold: float, abort: bool) -> None:
        """One transaction on state['producer'], renewed after an abort, an error or a broker restart."""
        try:
            if state.get("producer") is None or not self._fresh(state["epoch"]):
                state["producer"], state["epoch"] = self._transactional()
            producer = state["producer"]
            with self._producing():
                producer.begin_transaction()
                transaction = uuid.uuid4().hex
                for _ in range(size):
                    self._send(producer, rng, transaction)
                producer.flush(TIMEOUT)  # the records reach the log whether we commit or abort
            if hold:  # open, not writing: a broker restart may come meanwhile
                self.stop_event.wait(hold)
            with self._producing():
                if abort or not self._fresh(state["epoch"]):
                    producer.abort_transaction(TIMEOUT)
                    self.journal.ended(transaction, committed=False)
                    self.counts["transactions aborted"] += 1
                    state["producer"] = None
                else:
                    producer.commit_transaction(TIMEOUT)
                    if self._fresh(state["epoch"]):
                        self.journal.ended(transaction, committed=True)
                        self.counts["transactions committed"] += 1
                    else:  # the broker restarted while it was open: it may have aborted it (Kafka decides)
                        self.counts["transactions in doubt (broker restarted)"] += 1
        except PRODUCER_ERRORS:
            self.counts["producer errors (broker away)"] += 1
            self._abandon(state.get("producer"))
            state["producer"] = None
            self.stop_event.wait(0.5)

    def _abandon(self, producer: Producer | None) -> None:
        """Abort what the producer may have left open before dropping it: noida-db 0.2.3 never times a
        transaction out (transaction.timeout.ms is ignored; measured: the LSO stayed behind an abandoned
        transaction for as long as we watched), so an open one would hold the LSO, and every ingest would
        find nothing to do, until the next broker restart. Apache Kafka aborts it after the timeout."""
        if producer is None:
            return
        try:
            producer.abort_transaction(TIMEOUT)
        except PRODUCER_ERRORS:  # nothing open, or the broker away: a restart aborts what is open
            self.counts["abandoned producers not aborted"] += 1

    def _idempotent(self) -> Producer:
        return Producer(client_settings(self.settings, **{"enable.idempotence": True, "linger.ms": 5}))

    def _mixed(self, rng: random.Random) -> None:
        idempotent = self._idempotent()
        state: dict = {}
        while not self.stop_event.is_set():
            if rng.random() < 0.5:
                try:
                    with self._producing():
                        for _ in range(CHUNK):
                            self._send(idempotent, rng, None)
                        idempotent.flush(TIMEOUT)  # acknowledged before a restart may come
                    self.counts["idempotent chunks"] += 1
                except BufferError:
                    idempotent.poll(1)
                except PRODUCER_ERRORS:  # fatal idempotence error after a restart: start a new producer
                    self.counts["producer errors (broker away)"] += 1
                    idempotent = self._idempotent()
            else:
                self._transaction(rng, state, CHUNK, 0, abort=rng.random() < 0.25)
            self.stop_event.wait(self.pause)
        idempotent.flush(30)

    def _long_open(self, rng: random.Random) -> None:
        state: dict = {}
        while not self.stop_event.is_set():
            self._transaction(rng, state, rng.randint(5, 30), rng.uniform(1, 6), abort=rng.random() < 0.3)
            self.stop_event.wait(rng.uniform(0.5, 3))
