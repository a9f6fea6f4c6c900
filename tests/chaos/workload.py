"""The chaos harness's producers: Kafka traffic that keeps coming while jobs are killed and brokers restart.

Two threads write the demo events (1% of them records the schema rejects):
one mixes idempotent writes with short transactions, some aborted after their
records reached the log; the other holds transactions open for seconds, so the
last stable offset stalls behind them, then commits or aborts them.

Every record is told to a journal (the oracle's producer-side truth): where
the broker put it, and whether its transaction committed or aborted. They keep
writing through every broker restart, as producers do in production: Apache
Kafka with acks=all keeps what it acknowledged, so a record acknowledged (or a
transaction whose commit returned) that Kafka does not return is a finding.
Only a transaction whose end raised stays "in doubt" in the journal: Kafka
alone knows whether it committed. A producer that met an error is dropped (after
an abort where it can still abort), and so is one whose transaction ended with records
its flush left unsent; a new one starts under a fresh transactional id:
Kafka aborts what it left open after `transaction.timeout.ms`, and the LSO
moves on (the harness's check before its final ingest waits for that).
"""

from __future__ import annotations

import itertools
import random
import threading
import uuid
from collections import Counter

from confluent_kafka import KafkaException, Producer

from offsetlake.config import KafkaSettings
from offsetlake.kafka import client_settings
from offsetlake_local.producer import Journal, demo_event, transactional_producer, with_bad_records

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
# An abandoned transaction holds the LSO back until Kafka aborts it: at most this long (plus the broker's
# abort check, every second on the embedded broker). Longer than any hold below and a broker's restart.
TRANSACTION_TIMEOUT_MS = 15_000


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
        self._makers = threading.local()  # one record maker (and serializer) per producing thread
        self._seq = itertools.count()
        self._threads = [
            threading.Thread(target=self._mixed, args=(random.Random(seed),), daemon=True, name="chaos-mixed"),
            threading.Thread(target=self._long_open, args=(random.Random(seed + 1),), daemon=True, name="chaos-open"),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stopped_threads(self) -> list[str]:
        """The producing threads that ended before `stop` asked them to (an exception nobody caught)."""
        return [t.name for t in self._threads if not t.is_alive() and not self.stop_event.is_set()]

    def stop(self) -> None:
        """Finish: the open transaction is committed or aborted, nothing is left pending."""
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=60)
            if t.is_alive():
                raise RuntimeError(f"the producer thread {t.name} did not finish within 60 s of being stopped")

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
        from offsetlake_local.producer import avro_event_maker, registry_client

        client = registry_client(self.registry_url)
        v1, v2 = avro_event_maker(client, self.topic, 1), avro_event_maker(client, self.topic, 2)
        return lambda rng, seq: (v2 if seq >= EVOLVE_AT_SEQ and rng.random() < 0.5 else v1)(rng, seq)

    def _transactional(self) -> Producer:
        transactional_id = f"chaos-{uuid.uuid4().hex[:8]}-{next(self._generation)}"
        return transactional_producer(
            self.settings, transactional_id, **{"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
        )

    def _transaction(self, rng: random.Random, state: dict, size: int, hold: float, abort: bool) -> None:
        """One transaction on state['producer']; a producer that failed is dropped and a new one started."""
        transaction = uuid.uuid4().hex
        ending = False
        try:
            if state.get("producer") is None:
                state["producer"] = self._transactional()
            producer = state["producer"]
            producer.begin_transaction()
            for _ in range(size):
                self._send(producer, rng, transaction)
            unsent = producer.flush(TIMEOUT)  # the records reach the log whether we commit or abort
            if hold:  # open, not writing: a broker restart may come meanwhile
                self.stop_event.wait(hold)
            ending = True
            if abort:
                producer.abort_transaction(TIMEOUT)
                self.journal.ended(transaction, committed=False)
                self.counts["transactions aborted"] += 1
            else:
                producer.commit_transaction(TIMEOUT)
                self.journal.ended(transaction, committed=True)
                self.counts["transactions committed"] += 1
            if unsent:
                self._drop_after_unsent(state)
        except PRODUCER_ERRORS as err:
            self.counts["producer errors"] += 1
            self._after_error(state, transaction, err, ending)

    def _drop_after_unsent(self, state: dict) -> None:
        """The producer of a transaction whose records were still unsent when its flush gave up (the cluster
        away) is replaced once the transaction ended. Its abort purges the records librdkafka still holds,
        though the broker may have written one of their batches without its answer arriving, and the
        producer's next transaction numbers its records from that batch's sequence again, under the same
        epoch: the broker answers them as duplicates with the offsets of the aborted batch, and the new
        records are never written (seed 9, 2026-11-29: a whole-cluster restart; five records of a committed
        transaction "delivered" at p0@63-67, which hold the aborted batch written 21 s before)."""
        state["producer"] = None
        self.counts["producers replaced after records left unsent"] += 1

    def _after_error(self, state: dict, transaction: str, err: Exception, ending: bool) -> None:
        """Before its end was asked for, a transaction the producer can still abort is aborted (so it is
        aborted for sure). A failed commit or abort leaves its outcome to Kafka: "in doubt" in the journal.
        Either way the producer is dropped and the next transaction starts under a new transactional id:
        librdkafka 2.16 goes on after an abortable error with the same producer epoch and sequence numbers
        again, and the broker answers a resent sequence with the offsets of the batch it already holds
        (seed 4242, a whole-cluster restart: three records of a new transaction were "delivered" at
        p2@2570-2572, the aborted batch written 18 s before, and its commit lost them)."""
        producer = state.get("producer")
        state["producer"] = None
        kafka_error = err.args[0] if err.args and hasattr(err.args[0], "txn_requires_abort") else None
        if producer is not None and not ending and kafka_error is not None and kafka_error.txn_requires_abort():
            try:
                producer.abort_transaction(TIMEOUT)
                self.journal.ended(transaction, committed=False)
                self.counts["transactions aborted after an error"] += 1
                return
            except PRODUCER_ERRORS:
                pass
        self.counts["transactions left to Kafka (in doubt)"] += 1
        self.stop_event.wait(0.5)

    def _idempotent(self) -> Producer:
        return Producer(client_settings(self.settings, **{"enable.idempotence": True, "linger.ms": 5}))

    def _mixed(self, rng: random.Random) -> None:
        idempotent = self._idempotent()
        state: dict = {}
        while not self.stop_event.is_set():
            if rng.random() < 0.5:
                try:
                    for _ in range(CHUNK):
                        self._send(idempotent, rng, None)
                    idempotent.flush(TIMEOUT)
                    self.counts["idempotent chunks"] += 1
                except BufferError:
                    idempotent.poll(1)
                except PRODUCER_ERRORS:  # a fatal idempotence error: counted, and a new producer
                    self.counts["idempotent producer errors"] += 1
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
