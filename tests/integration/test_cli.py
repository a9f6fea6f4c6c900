"""The `offsetlake` command: one-line errors with a non-zero exit and no commit; status and history."""

from __future__ import annotations

import json

import pytest

from support import (
    assert_lake_untouched,
    assert_one_line_failure,
    create_topic,
    kafka_settings,
    load,
    produce,
    run_cli,
    unique,
    write_pipeline,
)


def test_bad_config_names_the_key_and_writes_nothing(pipelines_dir, lake, bootstrap):
    topic = unique("t")  # good and bad records: an ingest that ran would write a table and a quarantine
    create_topic(bootstrap, topic, 1)
    produce(kafka_settings(bootstrap), topic, 20, bad_share=0.3, seed=14)
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake, batch={"max_records_per_batch": "many"})
    proc = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, "batch.max_records_per_batch", f"{name}.yaml")
    assert_lake_untouched(lake)


def test_unknown_pipeline(pipelines_dir):
    pipelines_dir.mkdir(parents=True)
    proc = run_cli("status", "--pipeline", "nope", "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, "unknown pipeline 'nope'")


def test_unknown_topic_is_never_auto_created(pipelines_dir, lake, bootstrap):
    topic = unique("missing")
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake)
    proc = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))
    assert_one_line_failure(proc, f"unknown topic '{topic}'")
    assert_lake_untouched(lake)
    from confluent_kafka.admin import AdminClient

    assert topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=5).topics


def test_unreachable_broker(pipelines_dir, lake):
    name = write_pipeline(pipelines_dir, "127.0.0.1:1", ["t"], lake, kafka={"timeout_seconds": 2, "retry_seconds": 0})
    proc = run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir), timeout=60)
    assert_one_line_failure(proc, "127.0.0.1:1", "reachable")
    assert_lake_untouched(lake)

    # Told to wait, it retries (one warning line each), then fails with the same one-line error.
    patient = write_pipeline(
        pipelines_dir, "127.0.0.1:1", ["t"], lake, kafka={"timeout_seconds": 1, "retry_seconds": 3}
    )
    proc = run_cli("ingest", "--pipeline", patient, "--pipelines-dir", str(pipelines_dir), timeout=60)
    *retries, last = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and last.startswith("offsetlake: error: ") and "reachable" in last
    assert retries and all("retrying in" in line for line in retries), proc.stderr


def test_usage_errors_are_one_line(pipelines_dir):
    proc = run_cli("produce", "--pipeline", "x", "--count", "-5")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--count" in proc.stderr


@pytest.mark.slow
def test_ingest_status_and_history(pipelines_dir, lake, bootstrap):
    topic = unique("t")
    create_topic(bootstrap, topic, 2)
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake)
    cfg = load(pipelines_dir, name)
    args = ("--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    status = json.loads(run_cli("status", *args, "--json", check=True).stdout)
    produce(cfg.kafka, topic, 400, seed=1)
    before = json.loads(run_cli("status", *args, "--json", check=True).stdout)
    ingest = run_cli("ingest", *args, check=True)
    after = json.loads(run_cli("status", *args, "--json", check=True).stdout)
    history = json.loads(run_cli("history", *args, "--json", check=True).stdout)

    assert [s["committed"] for s in status] == [None, None]
    assert sum(s["lag"] for s in before) >= 400
    assert "batch 1: committed" in ingest.stdout and "up to date" in ingest.stdout
    assert all(s["lag"] == 0 and s["committed"] == s["end"] for s in after)
    assert [h["batch"] for h in history] == [1] and history[0]["records"]["rows"] == 400
    text = run_cli("history", *args, check=True).stdout
    assert f"{topic}[0] 0-" in text
    again = run_cli("ingest", *args, check=True)
    assert again.stdout.strip() == "up to date: nothing new to ingest"
    assert "log4j" in ingest.stderr and "log4j" not in again.stderr  # nothing to read: no JVM started
