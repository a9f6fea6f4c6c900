"""A RESTORE to a version before the pipeline's first batch, recorded by `offsetlake checkpoint`'s first step.

Two jobs that create an S3 table at once leave it two commits before its first batch: the create that won
version 0, and the loser's create, committed as version 1 (the chaos run of seed 74, docs/development/tests.md).
A RESTORE to such a version empties the table, and the next ingest must read every partition from its start.
Rewound by the ingest itself it does. Recorded first by `record_pending_rewind` (as `offsetlake checkpoint`
and the chaos harness's checkpoint fault do), the record once named no partition, so the partitions' `txn`
actions kept the offsets of the restored-away batches and their records were never read again.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from offsetlake.batch import ingest
from offsetlake.engine import DeltaRs
from offsetlake.operations.maintenance import record_pending_rewind
from support import assert_exactly_once, new_pipeline, produce

pytestmark = pytest.mark.slow


def table_with_two_creates(spark, bootstrap, pipelines_dir, lake):
    """A pipeline's table whose versions 0 and 1 are both creates, then two batches (versions 2 and 3)."""
    cfg, topic = new_pipeline(bootstrap, pipelines_dir, lake, partitions=2)
    ingest(spark, cfg)  # nothing to read: the table is created, version 0
    created = DeltaTable(cfg.table_path)
    partition_by = created.metadata().partition_columns or None
    DeltaTable.create(cfg.table_path, created.schema(), mode="overwrite", partition_by=partition_by)  # version 1
    for seed in (1, 2):
        produce(cfg.kafka, topic, 300, seed=seed)
        ingest(spark, cfg)
    assert DeltaTable(cfg.table_path).version() == 3
    return cfg


def test_an_ingest_after_a_restore_to_before_the_first_batch_reads_every_partition_again(
    spark, bootstrap, pipelines_dir, tmp_path
):
    cfg = table_with_two_creates(spark, bootstrap, pipelines_dir, tmp_path / "lake")
    DeltaTable(cfg.table_path).restore(1)

    ingest(spark, cfg)

    assert_exactly_once(cfg)


def test_a_recorded_rewind_to_before_the_first_batch_reads_every_partition_again(
    spark, bootstrap, pipelines_dir, tmp_path
):
    cfg = table_with_two_creates(spark, bootstrap, pipelines_dir, tmp_path / "lake")
    DeltaTable(cfg.table_path).restore(1)
    record_pending_rewind(cfg, DeltaRs(cfg).commit)

    ingest(spark, cfg)

    assert_exactly_once(cfg)
