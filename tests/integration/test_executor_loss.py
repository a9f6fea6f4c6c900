"""An executor lost mid-task, on a real Spark standalone master and worker (spark-class from the
pyspark package, on this machine's loopback; tests/airflow/test_cross_host.py puts one on another host).

The executor JVM is SIGKILLed while its tasks hold files they have written but not yet reported.
Spark re-runs those tasks on an executor the worker launches in its place; the data files are named
after Spark's task attempt, so the re-run writes beside the lost attempt's files, never over them;
the driver commits only what the accepted attempts reported. One commit, the table exact row by row,
and none of the lost attempt's files referenced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hosts import LOOPBACK, SparkStandalone, free_port
from offsetlake.table import committed_files
from support import REPO, assert_exactly_once, data_files_on_disk, new_pipeline, pipeline_commits

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    spark = SparkStandalone.start(
        LOOPBACK,
        tmp_path / "spark",
        cores=2,
        memory="2g",
        port=free_port(),
        ui_port=free_port(),
        worker_ui_port=free_port(),
    )
    yield spark
    spark.stop()


def test_an_executor_killed_mid_task_is_replaced_and_the_batch_commits_once(
    cluster, bootstrap, pipelines_dir, lake, tmp_path
):
    cfg, _ = new_pipeline(
        bootstrap, pipelines_dir, lake, partitions=2, records=3000, batch={"max_records_per_task": 800}
    )
    faults = tmp_path / "faults"
    env = {
        **os.environ,
        "OFFSETLAKE_HOME": str(REPO),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "OFFSETLAKE_FAULT": "after_task_write:pause",
        "OFFSETLAKE_FAULT_DIR": str(faults),
    }
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "offsetlake.cli",
            "ingest",
            "--pipeline",
            cfg.name,
            "--pipelines-dir",
            str(pipelines_dir),
            "--master",
            cluster.master_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until(lambda: (faults / "after_task_write.reached").exists(), job)
        lost_attempts_files = data_files_on_disk(cfg.table_path)
        executors = cluster.executor_pids()
        assert len(executors) == 1, executors
        os.kill(executors[0], signal.SIGKILL)  # the executor JVM, its tasks and their Python workers
        (faults / "after_task_write.release").touch()  # the re-run tasks go straight through
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]

    assert lost_attempts_files, "the lost executor had written files: the checks below must see them"
    assert len(cluster.executor_dirs()) >= 2, "the worker should have launched an executor in the lost one's place"
    assert [h.meta.batch for h in pipeline_commits(cfg)] == [1]  # one batch, committed once
    assert_exactly_once(cfg)
    referenced = committed_files(cfg.table_location)
    assert referenced and not referenced & lost_attempts_files
    assert referenced <= data_files_on_disk(cfg.table_path)


def _wait_until(condition, job: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if job.poll() is not None:
            raise AssertionError(f"the ingest exited early ({job.returncode}): {job.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "the tasks never reached after_task_write"
        time.sleep(0.2)
