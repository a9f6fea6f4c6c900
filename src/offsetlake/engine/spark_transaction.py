"""delta-spark's optimistic transaction, driven from Python: the one place offsetlake calls Delta's JVM API.

A commit on the delta-spark engine is one `OptimisticTransaction` of the table's `DeltaLog`, started at the
newest version. Before anything is written the transaction reads the ledger's application ids
(its read set, `readTxn`): Delta's conflict checker then fails the commit with `ConcurrentTransactionException` if
another commit set any of them after that version -- a duplicate run or a zombie that got there first --,
and lets through commits that did not (another pipeline's, a user's OPTIMIZE). The commit carries the
data files, the ledger's `txn` actions (`SetTransaction`) and `userMetadata` (on the `WRITE` operation)
at once, so the rows and the offsets land together or not at all.

The actions are built from their Delta-log JSON (`Action.fromJson`): the same text the Delta protocol
defines, whatever the Scala constructors of the delta-spark release.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from deltalake import Transaction

from offsetlake.errors import TableError
from offsetlake.storage.location import Location

# delta-spark's exceptions for a commit another commit made impossible: deciding again is safe.
CONFLICTS = (
    "ConcurrentTransactionException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


def check_on_classpath(spark: Any) -> None:
    """Fail in one line when the session has no delta-spark jars."""
    from py4j.java_gateway import JavaClass

    if not isinstance(spark._jvm.org.apache.spark.sql.delta.DeltaLog, JavaClass):
        raise TableError(
            "table.engine delta-spark: delta-spark is not in the Spark session; add its package the way Spark "
            "takes any (spark-submit --packages io.delta:delta-spark_<spark line>_2.13:<version>, or "
            "spark.jars.packages in spark-defaults.conf)"
        )


def start(spark: Any, uri: str) -> Any:
    """A transaction on the table at `uri` (a DeltaLog path), at its newest version."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    return log.startTransaction()


def read_app_ids(txn: Any, txns: Iterable[Transaction]) -> None:
    """Make each ledger application id part of what the transaction read, so a commit that set one since
    fails this one (see the module docstring).

    The ids go straight into the transaction's read set (`readTxn`, what `txnVersion` adds them to):
    `txnVersion` would also return each id's version, which costs a reconstruction of the snapshot's whole
    state (a Spark job over the log) on every batch, and offsetlake has read the ledger already (with
    delta-rs, from the snapshot of this version). A delta-spark without that accessor gets `txnVersion`."""
    from py4j.protocol import Py4JError

    try:
        read = txn.readTxn()
        for app in txns:
            read.addOne(app.app_id)
    except Py4JError:
        for app in txns:
            txn.txnVersion(app.app_id)


def set_transactions(spark: Any, txns: Iterable[Transaction]) -> list[Any]:
    """The ledger as delta-spark `SetTransaction` actions."""
    now = int(time.time() * 1000)
    return [
        action(spark, {"txn": {"appId": app.app_id, "version": app.version, "lastUpdated": app.last_updated or now}})
        for app in txns
    ]


def action(spark: Any, json_action: dict[str, Any]) -> Any:
    return spark._jvm.org.apache.spark.sql.delta.actions.Action.fromJson(json.dumps(json_action))


def as_list(seq: Any) -> list[Any]:
    """A Scala Seq from the JVM as a Python list of its (JVM) elements."""
    return [seq.apply(i) for i in range(seq.size())]


def commit(spark: Any, txn: Any, actions: Sequence[Any], user_metadata: str, location: Location) -> int:
    """Commit `actions` in `txn` as a `WRITE` carrying `user_metadata`; the version it landed as."""
    jvm = spark._jvm
    seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(list(actions)).toSeq()
    with log_lock(location):
        return int(txn.commit(seq, write_operation(spark, user_metadata)))


LOCK_FILE = ".offsetlake-commit.lock"


@contextmanager
def log_lock(location: Location) -> Iterator[None]:
    """The table's commits by offsetlake's delta-spark writers, one at a time across processes and hosts.

    delta-spark writes a log entry on a file system with its `LocalLogStore` (the `HDFSLogStore` on HDFS
    makes an atomic rename): it checks the entry is not there, then renames its file onto it, and a rename
    onto an existing file replaces it. It keeps two writers apart only inside one JVM, so two jobs -- a
    zombie and its retry, a batch and the maintenance DAG's OPTIMIZE -- could both write one version and
    the first would vanish. A POSIX lock on a file in the log (NFS carries those) around each commit closes
    that gap for offsetlake's own writers; delta-rs' commits need none (it renames without replacing)."""
    if location.is_object_store:  # refused on this engine (delta_spark.refuse_object_store)
        yield
        return
    log_dir = Path(location.uri.removeprefix("file://")) / "_delta_log"
    if not log_dir.is_dir():  # no table yet: its creation is retried on a clash (DeltaSpark.open)
        yield
        return
    with open(log_dir / LOCK_FILE, "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)


def write_operation(spark: Any, user_metadata: str) -> Any:
    """`DeltaOperations.Write(Append, userMetadata = …)`, its other fields unset: found by reflection, since
    the number of its fields changes between delta-spark releases."""
    jvm = spark._jvm
    cls = jvm.py4j.reflection.ReflectionUtil.classForName("org.apache.spark.sql.delta.DeltaOperations$Write")
    constructor = cls.getConstructors()[0]
    count = len(constructor.getParameterTypes())
    args = spark.sparkContext._gateway.new_array(jvm.java.lang.Object, count)
    for i in range(1, count):
        args[i] = jvm.scala.Option.empty()
    args[0] = jvm.org.apache.spark.sql.SaveMode.Append
    args[3] = jvm.scala.Some(user_metadata)  # Write(mode, partitionBy, predicate, userMetadata, …)
    return constructor.newInstance(args)


def conflict_of(err: BaseException) -> str | None:
    """The name of delta-spark's conflict exception `err` carries, if it is one."""
    text = str(err)
    return next((name for name in CONFLICTS if name in text), None)


def files_of(txn: Any) -> list[Any]:
    """The table's data files (`AddFile`s) at the transaction's version, read as a whole by the transaction:
    any file another commit adds or removes meanwhile then fails this one."""
    return as_list(txn.filterFiles())


def checkpoint(spark: Any, uri: str) -> int:
    """A checkpoint of the table's newest version written by delta-spark, which then removes the commit files
    past the table's log retention (`delta.logRetentionDuration`) the checkpoint covers; its version."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    snapshot = log.startTransaction().snapshot()  # the newest version, read now
    log.checkpoint(snapshot, spark._jvm.scala.Option.empty())
    return int(snapshot.version())
