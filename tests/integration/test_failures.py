"""Crashes, duplicate runs and zombies, with real job processes killed by SIGKILL.

Each job here is a real `offsetlake ingest` process (driver, JVM, Python
workers); the re-run happens in this test process. Every check is row by row
against what Kafka holds under read_committed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from offsetlake.batch import ingest
from offsetlake.table import committed_files
from support import (
    REPO,
    assert_exactly_once,
    assert_quarantine_accounts_for_the_rest,
    data_files_on_disk,
    ingest_process,
    pipeline_commits,
    produce,
    spark_submit,
    stop_stream,
    table_lineage,
    wait_for_fault,
    wait_while_running,
)

pytestmark = pytest.mark.slow
FAULT_POINTS = ["after_plan", "after_read", "after_task_write", "after_files_written", "before_commit", "after_commit"]


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_job_killed_at_each_fault_point_then_rerun_is_exact(spark, pipeline, pipelines_dir, point):
    cfg, _ = pipeline(partitions=3, records=1200)
    job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": f"{point}:exit"})
    job.communicate(timeout=300)
    assert job.returncode == -signal.SIGKILL, f"the job was not killed at {point}"
    commits_after_crash = pipeline_commits(cfg)
    assert len(commits_after_crash) == (1 if point == "after_commit" else 0)
    killed_attempts_orphans = data_files_on_disk(cfg.table_path) - committed_files(cfg.table_location)
    if point in ("after_task_write", "after_files_written", "before_commit"):
        assert killed_attempts_orphans, "the killed attempt had written files: the check below must see them"
    else:
        assert not killed_attempts_orphans

    results = ingest(spark, cfg)

    new_commits = [r for r in results if r.status == "committed"]
    assert len(new_commits) == (0 if point == "after_commit" else 1)
    assert_exactly_once(cfg)
    # The killed attempt's orphans stay on disk (for cleanup), and no commit references any of them;
    # every referenced file is on disk; the re-run left no orphans of its own.
    referenced = committed_files(cfg.table_location)
    assert not killed_attempts_orphans & referenced
    assert referenced <= data_files_on_disk(cfg.table_path)
    assert data_files_on_disk(cfg.table_path) - referenced == killed_attempts_orphans


def test_a_batch_read_by_the_driver_killed_after_its_files_were_written_then_rerun_is_exact(
    spark, pipeline, pipelines_dir
):
    # batch.driver_reads_up_to: the tasks' fault points are hit in the driver's own thread
    cfg, _ = pipeline(partitions=3, records=1200, batch={"driver_reads_up_to": 1_000_000})
    job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": "after_task_write:exit"})
    job.communicate(timeout=300)
    assert job.returncode == -signal.SIGKILL, "the job was not killed in its read"
    assert pipeline_commits(cfg) == []
    orphans = data_files_on_disk(cfg.table_path) - committed_files(cfg.table_location)
    assert orphans, "the killed attempt had written a file: the check below must see it"

    results = ingest(spark, cfg)

    assert [r.status for r in results] == ["committed", "up_to_date"]
    assert_exactly_once(cfg)
    referenced = committed_files(cfg.table_location)
    assert not orphans & referenced and data_files_on_disk(cfg.table_path) - referenced == orphans


def test_two_ingests_started_together_are_exact(pipeline, pipelines_dir):
    cfg, _ = pipeline(partitions=3, records=3000, batch={"max_records_per_batch": 600, "max_records_per_task": 200})
    jobs = [ingest_process(cfg, pipelines_dir) for _ in range(2)]
    outputs = [job.communicate(timeout=300) for job in jobs]

    assert [job.returncode for job in jobs] == [0, 0], outputs
    history = pipeline_commits(cfg)
    assert [h.meta.batch for h in history] == list(range(1, len(history) + 1))
    assert_exactly_once(cfg)


@pytest.mark.parametrize("pause_at", ["after_files_written", "before_commit"])
def test_zombie_attempt_finds_its_batch_committed_and_writes_nothing(
    spark, pipeline, pipelines_dir, tmp_path, pause_at
):
    cfg, _ = pipeline(partitions=3, records=1200)
    fault_dir = tmp_path / "faults"
    zombie = ingest_process(
        cfg, pipelines_dir, {"OFFSETLAKE_FAULT": f"{pause_at}:pause", "OFFSETLAKE_FAULT_DIR": str(fault_dir)}
    )
    wait_for_fault(fault_dir / f"{pause_at}.reached", zombie)
    zombie_files = data_files_on_disk(cfg.table_path)
    assert zombie_files, "the zombie should have written its files before pausing"

    ingest(spark, cfg)  # the retry: runs the same batch to completion
    version = DeltaTable(cfg.table_path).version()
    (fault_dir / f"{pause_at}.release").touch()
    out, err = zombie.communicate(timeout=300)

    assert zombie.returncode == 0, err
    assert "batch 1: already_committed" in out
    assert DeltaTable(cfg.table_path).version() == version  # the zombie committed nothing
    assert not zombie_files & data_files_on_disk(cfg.table_path)  # and removed its own files
    assert data_files_on_disk(cfg.table_path) == committed_files(cfg.table_location)
    assert_exactly_once(cfg)


def test_stream_ingests_as_records_arrive_and_stops_on_sigterm(pipeline, pipelines_dir, bootstrap):
    cfg, _ = pipeline(partitions=3, records=300)
    full_env = {**os.environ, "OFFSETLAKE_HOME": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1"}
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offsetlake.cli",
            "stream",
            "--pipeline",
            cfg.name,
            "--pipelines-dir",
            str(pipelines_dir),
            "--interval",
            "0.5",
        ],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_while_running(lambda: len(pipeline_commits(cfg)) >= 1, job)
        produce(cfg.kafka, cfg.topics[0], 200, seed=99)
        wait_while_running(lambda: len(table_lineage(cfg.table_path)) == 500, job)  # caught up, in later batches
    finally:
        out, err = stop_stream(job)
    assert job.returncode == 0, err
    assert "stream stopped after" in out
    assert len(pipeline_commits(cfg)) >= 2
    assert_exactly_once(cfg)


def test_spark_submit_runs_the_ingest_job(pipeline, pipelines_dir):
    cfg, _ = pipeline(partitions=3, records=500)
    proc = spark_submit(
        REPO / "jobs" / "ingest.py",
        "--pipeline",
        cfg.name,
        "--pipelines-dir",
        str(pipelines_dir),
        "--dag-id",
        "demo_dag",
        "--run-id",
        "manual__1",
        "--try-number",
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = pipeline_commits(cfg)[-1].meta.run
    assert (run.by, run.dag_id, run.run_id, run.try_number) == ("airflow", "demo_dag", "manual__1", 2)
    assert_exactly_once(cfg)


def test_crash_between_quarantine_and_table_commits_quarantines_each_record_once(spark, pipeline, pipelines_dir):
    cfg, _ = pipeline(partitions=3, records=0)
    produce(cfg.kafka, cfg.topics[0], 600, bad_share=0.1, seed=31)
    job = ingest_process(cfg, pipelines_dir, {"OFFSETLAKE_FAULT": "before_commit:exit"})
    job.communicate(timeout=300)
    assert job.returncode == -signal.SIGKILL
    assert pipeline_commits(cfg) == []  # the table commit never happened...
    assert DeltaTable(cfg.quarantine_path).version() >= 1  # ...but the quarantine commit did
    produce(cfg.kafka, cfg.topics[0], 300, bad_share=0.1, seed=32)  # the retry plans a longer range

    ingest(spark, cfg)

    assert assert_quarantine_accounts_for_the_rest(cfg) > 0
    assert_exactly_once(cfg)
