"""The batch protocol: what exactly-once rests on.

`planning` decides which offsets a batch reads, `metadata` is the one definition of a commit's
userMetadata, `ledger` reads the committed offsets back from the Delta log, `commit` is the one place
that commits (decide against a snapshot, no rebase, retry), `quarantine` commits bad records once per
offset, `ranges` is the offset range all of them speak of. Imports: errors, kafka, files, table, config, and
the quarantine table's schema from formats.records; never Spark, Airflow, the read path or the operations.
"""
