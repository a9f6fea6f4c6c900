"""The batch protocol: what exactly-once rests on.

`planning` decides which offsets a batch reads, `metadata` is the one definition of a commit's
userMetadata, `ledger` reads the committed offsets back from the Delta log, `commit` is the one place
that commits (decide against a snapshot, no rebase, retry), `quarantine` commits bad records once per
offset, `upsert` and `key_changes` fold an upsert batch to one row per key, `ranges` is the offset range
all of them speak of. Imports: errors, kafka, storage, table, config, and the quarantine table's schema
from formats; never Spark, Airflow, the read path, the operations or the engine seam above it.
"""
