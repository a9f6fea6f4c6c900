"""The ledger's application ids go into a delta-spark transaction's read set; a delta-spark without the
accessor gets them through `txnVersion`, which puts them in the same set (and costs a state rebuild)."""

from __future__ import annotations

from deltalake import Transaction
from py4j.protocol import Py4JError

from offsetlake.engine.spark_transaction import read_app_ids


class ReadSet(list):
    def addOne(self, app_id):  # noqa: N802 - Scala's ArrayBuffer, as py4j shows it
        self.append(app_id)
        return self


class Txn:
    """An OptimisticTransaction as py4j shows it: `readTxn()` is its read set of application ids."""

    def __init__(self, accessor: bool):
        self.accessor, self.read, self.asked = accessor, ReadSet(), []

    def readTxn(self):  # noqa: N802
        if not self.accessor:
            raise Py4JError("An error occurred while calling o12.readTxn: method readTxn does not exist")
        return self.read

    def txnVersion(self, app_id):  # noqa: N802
        self.asked.append(app_id)
        self.read.addOne(app_id)
        return -1


LEDGER = [
    Transaction("offsetlake-p", 3),
    Transaction("offsetlake-p/events/0", 3),
    Transaction("offsetlake-p/events/1", 3),
]


def test_the_ids_go_into_the_read_set_without_asking_their_versions():
    txn = Txn(accessor=True)
    read_app_ids(txn, LEDGER)
    assert txn.read == [t.app_id for t in LEDGER]
    assert txn.asked == []


def test_a_delta_spark_without_the_accessor_is_asked_for_each_version():
    txn = Txn(accessor=False)
    read_app_ids(txn, LEDGER)
    assert txn.asked == txn.read == [t.app_id for t in LEDGER]
