"""An upsert batch's MERGE on the delta-spark engine, written inside offsetlake's own transaction.

delta-spark's MERGE command commits in a transaction of its own, which can carry one application id
(`spark.databricks.delta.write.txnAppId`), and the ledger needs one per partition besides the pipeline's.
So the batch's MERGE is planned here and written through the transaction that commits the ledger
(`spark_transaction`), copy-on-write as Delta's own MERGE does without deletion vectors: the files
holding a key of the batch (every file, after a TRUNCATE or a snapshot's end) are read at the
transaction's version, joined with the batch's rows on the key, and written again with the rows
updated, deleted and inserted as `protocol.upsert.Merge` says; the old files are removed in the same
commit. The transaction reads the whole table, so a commit that changed any file since fails it, and
the batch is decided again.

A backfill's replacement of the rows of some offset ranges is written the same way (`replace_ranges`).

The clauses are `Merge`'s own SQL (its DataFusion dialect made Spark's by `spark_sql`), so both engines
apply one definition of an upsert.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from offsetlake.config import DELETED_COLUMN
from offsetlake.engine import spark_transaction
from offsetlake.protocol.ranges import OffsetRange
from offsetlake.protocol.upsert import Merge, quoted_column

# A string literal (kept whole, so nothing inside one is rewritten), or DataFusion's cast of an integer.
_LITERAL_OR_ARROW_CAST = re.compile(r"'(?:[^']|'')*'|arrow_cast\((-?\d+), 'Int(32|64)'\)")


@dataclass
class Rewrite:
    """What the MERGE commits: its actions (the files it removes, and those written in their place) and its
    counts."""

    actions: list[Any]  # delta-spark RemoveFile and AddFile actions
    merged: dict[str, int]  # a MERGE's rows inserted, updated, deleted; a replacement's rows removed, files


def rewrite(spark: Any, txn: Any, uri: str, merge: Merge) -> Rewrite:
    """The MERGE of `merge` into the table at the transaction's version, its files written by the transaction
    (see the module docstring)."""
    from pyspark.sql import functions as F

    files = spark_transaction.files_of(txn)
    if merge.source.num_rows == 0:  # nothing to join: a batch of tombstones of absent keys, or a TRUNCATE
        removed = files if merge.truncate else []
        return Rewrite(_removes(removed), {"inserted": 0, "updated": 0, "deleted": _rows_in(removed)})
    target, tracking = tracked(spark, txn, uri)
    target = target.select("*", F.col("_metadata.file_name").alias("__file"), F.lit(True).alias("__t"))
    source = spark.createDataFrame(merge.source).withColumn("__s", F.lit(True))
    t, s = target.alias("t"), source.alias("s")
    join = F.expr(spark_sql(merge.predicate()))
    touched = set(_touched_files(merge, t, s, join))
    rewritten = [f for f in files if _file_name(f) in touched]
    joined = t.where(F.col("__file").isin(sorted(touched))).alias("t").join(s, join, "full_outer")
    columns = [c for c in target.columns if c not in ("__file", "__t", *tracking)]
    kinds = {f.name: f.dataType.simpleString() for f in target.schema.fields}
    joined = joined.withColumn("__outcome", F.expr(_outcome(merge))).persist()  # counted, then written: one join
    try:
        counted = joined.groupBy("__outcome").count().collect()
        rows = joined.where(F.col("__outcome").isin("kept", "updated", "inserted")).select(
            *[F.expr(f"CAST(({value}) AS {kinds[c]})").alias(c) for c, value in _values(merge, columns).items()],
            *_kept_row_tracking(target, tracking),
        )
        written = spark_transaction.as_list(txn.writeFiles(rows._jdf))
    finally:
        joined.unpersist()
    tally = {row["__outcome"]: int(row["count"]) for row in counted}
    merged = {k: tally.get(k, 0) for k in ("inserted", "updated", "deleted")}
    return Rewrite([*_removes(rewritten), *written], merged)


def replace_ranges(spark: Any, txn: Any, uri: str, ranges: Sequence[OffsetRange], new_rows: Any) -> Rewrite:
    """A backfill's change in the transaction: the rows of `ranges` removed -- the files holding any written
    again without them, read at the transaction's version so that deletion vectors apply -- and `new_rows`
    (a DataFrame, or None) written beside them. Its counts: the rows removed and the files rewritten."""
    from pyspark.sql import functions as F

    in_ranges = F.expr(_in_ranges_sql(ranges))
    target, _ = tracked(spark, txn, uri)  # a kept row keeps its row id and commit version
    target = target.select("*", F.col("_metadata.file_name").alias("__file"))
    hits = target.where(in_ranges).groupBy("__file").count().collect()
    touched = {row["__file"]: int(row["count"]) for row in hits}
    kept = target.where(F.col("__file").isin(sorted(touched)) & ~in_ranges).drop("__file")
    rows = kept if new_rows is None else kept.unionByName(new_rows, allowMissingColumns=True)
    written = spark_transaction.as_list(txn.writeFiles(rows._jdf))
    rewritten = [f for f in spark_transaction.files_of(txn) if _file_name(f) in touched]
    return Rewrite([*_removes(rewritten), *written], {"removed": sum(touched.values()), "files": len(rewritten)})


def _in_ranges_sql(ranges: Sequence[OffsetRange]) -> str:
    """Spark SQL that holds for a row of one of `ranges` (its lineage columns). A topic's name is letters,
    digits, '.', '_' and '-' (Kafka's rule): nothing in it to escape."""
    return " OR ".join(
        f"(kafka_topic = '{r.topic}' AND kafka_partition = {r.partition} "
        f"AND kafka_offset >= {r.start} AND kafka_offset < {r.end})"
        for r in ranges
    )


def tracked(spark: Any, txn: Any, uri: str) -> tuple[Any, tuple[str, ...]]:
    """The table at the transaction's version as a DataFrame and, on a table with row tracking, the names of
    the columns delta-spark's own DML adds to keep each row's id and commit version through a rewrite
    (`RowTracking.preserveRowTrackingColumns`): written with a row, they keep its id; left null, the commit
    gives it a new one."""
    from pyspark.sql import DataFrame

    table = spark.read.format("delta").option("versionAsOf", txn.readVersion()).load(uri)
    preserved = spark._jvm.org.apache.spark.sql.delta.RowTracking.preserveRowTrackingColumns(table._jdf, txn.snapshot())
    with_tracking = DataFrame(preserved, spark)
    return with_tracking, tuple(c for c in with_tracking.columns if c not in table.columns)


def _kept_row_tracking(target: Any, tracking: tuple[str, ...]) -> list[Any]:
    """The row-tracking columns of a merged row, as Delta's MERGE writes them: a kept row keeps its id and
    commit version, an updated row its id (its commit version becomes this commit's), an inserted row
    neither. The columns keep the metadata that tells delta-spark to write them."""
    from pyspark.sql import functions as F

    if not tracking:
        return []
    row_id, commit_version = tracking  # preserveRowTrackingColumns adds them in this order
    metadata = {f.name: f.metadata for f in target.schema.fields}
    return [
        F.col(f"t.{quoted(row_id)}").alias(row_id, metadata=metadata[row_id]),
        F.when(F.col("__outcome") == "kept", F.col(f"t.{quoted(commit_version)}")).alias(
            commit_version, metadata=metadata[commit_version]
        ),
    ]


def _touched_files(merge: Merge, t: Any, s: Any, join: Any) -> list[str]:
    """The names of the files a row of the batch (or a TRUNCATE, or a snapshot's end) changes."""
    from pyspark.sql import functions as F

    if merge.truncate:
        hits = t
    else:
        hits = t.join(s, join, "left_semi")
        if merge.snapshot_ends:
            hits = hits.unionByName(t.where(F.expr(f"coalesce({spark_sql(merge.stale())}, false)")))
    return [row["__file"] for row in hits.select("__file").distinct().collect()]


def _outcome(merge: Merge) -> str:
    """Each joined row's fate, as Delta's MERGE clauses decide it (a clause whose condition is null does
    not apply)."""
    both = "t.__t IS NOT NULL AND s.__s IS NOT NULL"
    deletes = f"coalesce({spark_sql(merge.deletions())}, false)"
    updates = f"coalesce({spark_sql(merge.updates())}, false)"
    if merge.truncate:
        gone = "true"
    elif merge.snapshot_ends:
        gone = f"coalesce({spark_sql(merge.stale())}, false)"
    else:
        gone = "false"
    deleted = f"s.{quoted(DELETED_COLUMN)}"
    return (
        f"CASE WHEN {both} AND {deletes} THEN 'deleted' WHEN {both} AND {updates} THEN 'updated' "
        f"WHEN {both} THEN 'kept' "
        f"WHEN t.__t IS NOT NULL THEN CASE WHEN {gone} THEN 'deleted' ELSE 'kept' END "
        f"WHEN coalesce({deleted}, false) THEN 'absent' ELSE 'inserted' END"
    )


def _values(merge: Merge, target: list[str]) -> dict[str, str]:
    """Each target column's value in a written row: the target's when kept, the source's (or, where the
    connector sent the unavailable value, the target's) when updated, the source's or null when inserted."""
    source = [c for c in merge.source.column_names if c != DELETED_COLUMN]
    updated = merge.assignments(source, target, keep_target=True)
    inserted = merge.assignments(source, target, keep_target=False)
    values = {}
    for column in target:
        name, kept = quoted_column(column), f"t.{quoted(column)}"
        if column not in source:
            values[column] = kept  # null for an inserted row: the target side of the join is null
            continue
        values[column] = (
            f"CASE __outcome WHEN 'updated' THEN {spark_sql(updated[name])} "
            f"WHEN 'inserted' THEN {spark_sql(inserted[name])} ELSE {kept} END"
        )
    return values


def _removes(files: list[Any]) -> list[Any]:
    now = int(time.time() * 1000)
    return [f.removeWithTimestamp(now, True) for f in files]


def _rows_in(files: list[Any]) -> int:
    total = 0
    for f in files:
        records = f.numLogicalRecords()
        total += int(records.get()) if records.isDefined() else 0
    return total


def _file_name(add_file: Any) -> str:
    from urllib.parse import unquote

    return unquote(add_file.path().rsplit("/", 1)[-1])


def quoted(column: str) -> str:
    """A Spark SQL identifier."""
    return "`" + column.replace("`", "``") + "`"


def spark_sql(expression: str) -> str:
    """`Merge`'s DataFusion SQL as Spark SQL: "quoted" identifiers in backticks, DataFusion's array
    functions as Spark's; string literals untouched."""
    expression = _LITERAL_OR_ARROW_CAST.sub(
        lambda m: m[0] if m[1] is None else f"CAST({m[1]} AS {'INT' if m[2] == '32' else 'BIGINT'})", expression
    )
    out: list[str] = []
    i, n = 0, len(expression)
    while i < n:
        char = expression[i]
        if char in "'\"":
            end = i + 1
            while end < n:
                if expression[end] == char and end + 1 < n and expression[end + 1] == char:
                    end += 2
                    continue
                if expression[end] == char:
                    break
                end += 1
            token = expression[i : end + 1]
            if char == '"':
                token = quoted(token[1:-1].replace('""', '"'))
            out.append(token)
            i = end + 1
            continue
        start = i
        while i < n and expression[i] not in "'\"":
            i += 1
        out.append(expression[start:i].replace("make_array(", "array("))
    return "".join(out)


def added_columns(source: pa.Schema, target: list[str]) -> list[pa.Field]:
    """The source's columns the target lacks (DELETED_COLUMN is the MERGE's own)."""
    return [f for f in source if f.name not in target and f.name != DELETED_COLUMN]
