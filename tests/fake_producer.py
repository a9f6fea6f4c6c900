"""A stand-in for confluent-kafka's transactional producer, for fast unit tests of the code that drives one:
it answers as librdkafka does while the cluster is away (its flush gives up with `unsent` records still
held), and the transaction's end then returns."""

from __future__ import annotations


class AwayProducer:
    def __init__(self, unsent: int = 0):
        self.unsent, self.produced, self.ended = unsent, 0, []

    def begin_transaction(self):
        pass

    def produce(self, *args, **kwargs):
        self.produced += 1

    def poll(self, timeout=0):
        return 0

    def flush(self, timeout=None):
        return self.unsent

    def abort_transaction(self, timeout):
        self.ended.append("abort")

    def commit_transaction(self, timeout):
        self.ended.append("commit")
