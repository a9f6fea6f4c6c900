"""What operators run beside the batches: `backfill` (replace ranges), `maintenance` (cleanup, vacuum,
checkpoint, reset, restore), `compaction`, `audit` (the table against Kafka; `fold`: an upsert table
against the fold of Kafka, and its rebuild), `status` and `changes` (lag, history, Asset event payloads),
`lineage` (OpenLineage datasets). Every write goes through protocol.commit. Imports: the protocol,
read_job (a backfill runs read tasks), table, storage, kafka, config, formats, read; never batch,
streaming or runs (they import operations, not the other way).
"""
