"""The Airflow scheduler dies (SIGKILL of the scheduler and every process below it: its LocalExecutor
workers and the task they ran, spark-submit and the Spark driver with them, as when its machine
goes) while an ingest DAG run is in flight, then is started again.

The ingest is held just before its commit (OFFSETLAKE_FAULT=after_files_written:pause) when the
scheduler goes, so the killed try has written its data files and committed nothing. The restarted
scheduler finds the task without a heartbeat, fails that try and retries it; the retry commits the
batch. The run succeeds, the table is exact row by row, each batch is committed once, and none of
the killed try's files is referenced.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from hosts import descendants
from offsetlake.table import committed_files
from offsetlake_local import processes, stack
from offsetlake_local.broker import free_port
from support import REPO, assert_exactly_once, data_files_on_disk, new_pipeline, pipeline_commits

pytestmark = pytest.mark.slow


def test_scheduler_killed_mid_run_then_restarted_retries_the_ingest_exactly_once(bootstrap, tmp_path):
    pipelines = tmp_path / "pipelines"
    cfg, _ = new_pipeline(
        bootstrap,
        pipelines,
        tmp_path / "lake",
        partitions=2,
        records=2000,
        schedule=None,
        airflow={"retries": 3, "retry_delay_seconds": 1},
    )
    faults = tmp_path / "faults"
    home = tmp_path / "airflow"
    env = stack.environment(
        home,
        free_port(),
        REPO,
        pipelines,
        spark_master="local[2]",
        extra={
            "OFFSETLAKE_FAULT": "after_files_written:pause",
            "OFFSETLAKE_FAULT_DIR": str(faults),
            # A task without a heartbeat this long is failed (and retried); the default is 5 minutes.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "10",
        },
    )
    dag_id = f"offsetlake__{cfg.name}__ingest"
    try:
        pids = stack.start(env)
        api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
        api.wait_for_dag(dag_id)
        api.unpause(dag_id)
        run_id = api.trigger(dag_id)
        _wait_for(faults / "after_files_written.reached", home)
        killed_tries_files = data_files_on_disk(cfg.table_path)

        # The scheduler's machine goes, with the task on it (the task runs in a session of its own).
        for pid in [pids["scheduler"], *descendants(pids["scheduler"])]:
            os.kill(pid, signal.SIGKILL)
        processes.stop(pids["scheduler"], timeout=10)  # reaped
        (faults / "after_files_written.release").touch()  # the retry goes straight through
        stack.start_component(env, "scheduler")

        state = api.wait_for_run(dag_id, run_id, timeout=600)
        step = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/ingest")
    finally:
        stack.stop(home)

    assert state == "success", _logs(home)
    assert step["try_number"] >= 2, step  # the killed try failed for want of a heartbeat, a retry committed
    assert killed_tries_files, "the killed try had written its files: the checks below must see them"
    history = pipeline_commits(cfg)
    assert [h.meta.batch for h in history] == list(range(1, len(history) + 1))  # each batch once
    assert history and all(2 <= h.meta.run.try_number <= step["try_number"] for h in history)
    assert_exactly_once(cfg)
    assert not committed_files(cfg.table_location) & killed_tries_files


def _wait_for(marker, home, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, f"the ingest never reached its commit\n{_logs(home)}"
        time.sleep(0.5)


def _logs(home) -> str:
    return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(home.glob("*.log")))
