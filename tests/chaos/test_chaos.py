"""The short chaos run inside `make test`: at least 20 faults, every kind at least once.

One run; its seed draws the records' format (JSON, or Avro through a Schema Registry with key and headers
kept and a field added mid-run), where the table lives (local disk, or S3 behind the fault proxy with
object storage's faults), the write mode (append, or upsert: the latest record per key, checked
against the fold of Kafka), for a local table in append mode the commit engine (delta-rs or
delta-spark; delta-spark refuses a table on S3), and whether batches of up to 2,000 offsets are read by the
job's driver instead of a Spark job (`batch.driver_reads_up_to`). Thirty-two seeds in a row cover every
combination; a run per combination in every `make test` would not fit its 30 minutes (two runs took 6-7 of
them). Upsert on the
delta-spark engine, the longest draw (about 10 minutes of the suite's two workers), is left to `make chaos`
(`--engine delta-spark --mode upsert`).

`make chaos` runs the same harness with 200. A failure names the seed; replay
it with OFFSETLAKE_CHAOS_SEED=<seed> make test, or with the arguments the failure prints, make chaos
CHAOS_ARGS="--seed <seed> ...".
"""

from __future__ import annotations

import os
import random

import pytest

from chaos.harness import UPSERT_KEYS, kinds_for, replay_args, run

pytestmark = pytest.mark.slow
FAULTS = 20
DRIVER_READS_UP_TO = 2000  # a stream's batches and a small ingest's, not the 4,000-offset ones of a backlog


def test_short_chaos_run_loses_and_duplicates_nothing(tmp_path):
    seed = int(os.environ.get("OFFSETLAKE_CHAOS_SEED") or random.randrange(1_000_000))
    record_format = ("json", "avro")[seed % 2]
    storage = ("local", "s3")[seed // 2 % 2]
    mode = ("append", "upsert")[seed // 4 % 2]
    on_delta_spark = storage == "local" and mode == "append" and seed // 8 % 2 == 1
    engine = "delta-spark" if on_delta_spark else "delta-rs"
    driver_reads_up_to = (0, DRIVER_READS_UP_TO)[seed // 16 % 2]
    replay = (
        f"seed {seed} -- replay: OFFSETLAKE_CHAOS_SEED={seed} make test, or make chaos CHAOS_ARGS="
        f"'{replay_args(seed, FAULTS, record_format, storage, mode, engine, driver_reads_up_to)}'"
    )
    # Raises, naming the seed, at the first loss, duplicate or wrong value.
    summary = run(
        FAULTS,
        seed,
        tmp_path / "chaos",
        record_format=record_format,
        storage=storage,
        mode=mode,
        engine=engine,
        driver_reads_up_to=driver_reads_up_to,
    )

    kinds = set(kinds_for(storage, mode))
    assert summary.injected >= FAULTS
    assert set(summary.faults) == kinds, f"{replay}: never injected {kinds - set(summary.faults)}"
    assert summary.findings == "", f"{replay}: the oracle found\n{summary.findings}"
    if mode == "append":  # upsert: one row per key, the fold checked by the oracle
        assert summary.kafka_records == summary.table_rows + summary.quarantined > 0
    else:
        assert 0 < summary.table_rows <= UPSERT_KEYS < summary.kafka_records
    assert summary.journaled > 0.9 * summary.kafka_records, f"{replay}: the producers' record covers too little"
    assert summary.audit_ok, f"{replay}: {summary.audit_label} FAILED"
    assert summary.job_failures == [], f"{replay}: jobs failed with no fault to explain it"
    assert summary.over_bounds == [], f"{replay}: excused or left out past the bounds: {summary.over_bounds}"
    # Availability: every stream that met a broker restart stayed up and committed again afterwards.
    assert summary.streams and summary.stream_uptime == 1.0, (replay, [w.as_dict() for w in summary.streams])
    if record_format == "avro":  # schema 2's field arrived mid-run as a column, among all the faults
        assert {"country", "kafka_key", "kafka_headers"} <= set(summary.columns), (replay, summary.columns)
