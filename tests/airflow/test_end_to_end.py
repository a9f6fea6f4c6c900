"""End to end through real Airflow processes: api-server, scheduler, dag-processor, triggerer.

The test starts them (each by PID), logs in over REST, triggers the backfill
DAG with a conf, waits for success, and checks the table row by row and the
result the run reported (XCom). The pipeline authenticates to Kafka (SASL/SCRAM-SHA-512, checked by a
broker that enforces it and its ACLs: conftest.secured_broker) with a password from the environment:
afterwards no task log, component log, the Airflow database or any table file may contain it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import pytest

from offsetlake.batch import ingest
from offsetlake.config import KafkaSettings
from offsetlake.errors import OffsetlakeError
from offsetlake.table import query
from offsetlake_local import broker_security, stack
from offsetlake_local.broker import free_port
from support import (
    REPO,
    assert_exactly_once,
    create_topic,
    files_containing,
    load,
    pipeline_commits,
    produce,
    task_result,
    unique,
    write_pipeline,
)

pytestmark = pytest.mark.slow


SECRET_VAR = "OFFSETLAKE_TEST_KAFKA_PASSWORD"


def test_backfill_triggered_over_rest_runs_on_real_airflow(spark, secured_broker, tmp_path, monkeypatch):
    secret = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv(SECRET_VAR, secret)
    topic, user = unique("t"), unique("backfiller")
    create_topic(secured_broker.admin_bootstrap, topic, 2)
    broker_security.add_user(secured_broker, user, secret)
    broker_security.allow(secured_broker, user, "topic", topic, "READ", "DESCRIBE")
    broker_security.allow(secured_broker, user, "group", "offsetlake.*", "READ", "DESCRIBE")
    pipelines = tmp_path / "pipelines"
    name = write_pipeline(
        pipelines,
        secured_broker.sasl_bootstrap,
        [topic],
        tmp_path / "lake",
        kafka={"client": secured_broker.sasl_client(user, "${" + SECRET_VAR + "}")},
    )
    cfg = load(pipelines, name)
    harness = KafkaSettings(bootstrap_servers=secured_broker.admin_bootstrap)  # a super user writes
    produce(harness, topic, 800, transactional_share=0.6, abort_share=0.25, seed=5)
    ingest(spark, cfg)
    before = query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist()

    home = tmp_path / "airflow"
    env = stack.environment(home, free_port(), REPO, pipelines, spark_master="local[2]", extra={SECRET_VAR: secret})
    try:
        stack.start(env)
        base_url = env["AIRFLOW__API__BASE_URL"]
        for user, password in ((stack.USER, "wrong"), ("nobody", stack.password(home))):
            with pytest.raises(OffsetlakeError, match="HTTP 401"):
                stack.Api(base_url, user, password)  # a login is required, and checked
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{base_url}/api/v2/dags", timeout=30)
        assert anonymous.value.code in (401, 403)
        api = stack.Api(base_url, stack.USER, stack.password(home))
        dag_id = f"offsetlake__{name}__backfill"
        api.wait_for_dag(dag_id)
        api.unpause(dag_id)
        conf = {"ranges": [{"topic": topic, "partition": 0, "start": 10, "end": 200}]}
        run_id = api.trigger(dag_id, conf)

        state = api.wait_for_run(dag_id, run_id, timeout=600)

        assert state == "success", _logs(home)
        result = task_result(api, dag_id, run_id, "backfill")
    finally:
        stack.stop(home)

    last = pipeline_commits(cfg)[-1]
    assert last.meta.kind == "backfill" and last.meta.run.dag_id == dag_id and last.meta.run.run_id == run_id
    assert last.meta.ranges == {topic: {"0": [10, 200]}}
    assert query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist() == before
    assert_exactly_once(cfg)
    assert result["ranges"] == {topic: {"0": [10, 200]}} and result["versions"] == [last.version]

    task_logs = [p for p in (home / "logs").rglob("*") if p.is_file()]
    assert any(
        "backfill" in p.read_text(errors="replace") and "spark-submit" in p.read_text(errors="replace")
        for p in task_logs
    ), "no task log of the Spark step to check"
    for root in (home, tmp_path / "lake", pipelines):
        assert files_containing(root, secret.encode()) == []


def _logs(home) -> str:
    return "\n".join(p.read_text()[-1500:] for p in sorted(home.glob("*.log")))
