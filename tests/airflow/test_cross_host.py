"""Across hosts: the broker, the Spark cluster and Airflow on three machines of one private network.

- host `k` (a network namespace with its own address): the Kafka broker;
- host `s`: a Spark standalone master and worker (spark-class from the pyspark package);
- this machine (the root namespace, `.1` of the network): PostgreSQL as Airflow's metadata
  database, and Airflow as four processes.

The ingest and backfill DAGs, triggered over REST, submit to the remote master in client mode:
the driver runs here (it advertises this machine's address on the network, from SPARK_LOCAL_IP),
the executors on the Spark host, reading Kafka on the broker host. Then the table is checked row
by row against what Kafka holds under read_committed.
"""

from __future__ import annotations

import json

import pytest

from hosts import Postgres, PrivateNetwork, SparkStandalone, free_port
from offsetlake.local import broker as embedded_broker
from offsetlake.local import stack
from offsetlake.table import query
from support import (
    REPO,
    assert_exactly_once,
    create_topic,
    load,
    pipeline_commits,
    produce,
    task_result,
    unique,
    write_pipeline,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def network():
    net = PrivateNetwork.create()
    yield net
    net.close()


@pytest.fixture
def postgres():
    server = Postgres.start()
    yield server
    server.stop()


def test_ingest_and_backfill_dags_run_on_a_spark_cluster_across_hosts(network, postgres, tmp_path):
    kafka_host, spark_host = network.add_host("k"), network.add_host("s")
    kafka = embedded_broker.start(tmp_path / "broker", port=9092, host=kafka_host.address, netns=kafka_host.name)
    cluster = None
    home = tmp_path / "airflow"
    try:
        cluster = SparkStandalone.start(spark_host, tmp_path)
        topic = unique("t")
        create_topic(kafka.bootstrap_servers, topic, 3)
        pipelines = tmp_path / "pipelines"
        name = write_pipeline(
            pipelines,
            kafka.bootstrap_servers,
            [topic],
            tmp_path / "lake",
            schedule=None,
            batch={"max_records_per_batch": 100_000, "max_records_per_task": 400},
        )
        cfg = load(pipelines, name)
        produce(cfg.kafka, topic, 2000, transactional_share=0.6, abort_share=0.25, seed=7)

        env = stack.environment(
            home,
            free_port(),
            REPO,
            pipelines,
            extra={
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.url,
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                    {
                        "conn_type": "spark",
                        "host": f"spark://{spark_host.address}",
                        "port": 7077,
                        "extra": {"deploy-mode": "client"},
                    }
                ),
                # Where the driver (spark-submit, here) binds and what it tells executors to call back.
                "SPARK_LOCAL_IP": network.root_address,
                "SPARK_LOCAL_HOSTNAME": network.root_address,
            },
        )
        stack.start(env)
        api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))

        ingest_id = f"offsetlake__{name}__ingest"
        api.wait_for_dag(ingest_id)
        api.unpause(ingest_id)  # `schedule: null`: only the run triggered here
        ingest_run = api.trigger(ingest_id)
        assert api.wait_for_run(ingest_id, ingest_run, timeout=600) == "success", _logs(home)
        assert_exactly_once(cfg)
        ingested = task_result(api, ingest_id, ingest_run, "ingest")
        assert ingested["versions"] and ingested["kinds"] == ["ingest"] and ingested["rows"] > 0

        before = query(cfg.table_path, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist()
        backfill_id = f"offsetlake__{name}__backfill"
        api.wait_for_dag(backfill_id)
        api.unpause(backfill_id)
        backfill_run = api.trigger(backfill_id, {"ranges": [{"topic": topic, "partition": 1, "start": 20, "end": 400}]})
        assert api.wait_for_run(backfill_id, backfill_run, timeout=600) == "success", _logs(home)

        backfilled = task_result(api, backfill_id, backfill_run, "backfill")
        apps = [a["name"] for a in cluster.applications()]
        runs_in_postgres = _dag_runs(postgres, ingest_id)
    finally:
        stack.stop(home)
        if cluster is not None:
            cluster.stop()
        embedded_broker.stop(kafka.pid)

    # The table: exact row by row, the backfill replaced its rows with the same rows in one commit.
    assert query(cfg.table_path, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist() == before
    last = pipeline_commits(cfg)[-1]
    assert last.meta.kind == "backfill" and last.meta.run.dag_id == backfill_id and last.meta.run.run_id == backfill_run
    assert last.meta.ranges == {topic: {"1": [20, 400]}}
    assert all(h.meta.run.by == "airflow" for h in pipeline_commits(cfg))
    # The Spark work ran on the cluster: the master ran both applications, and the worker on the Spark
    # host launched their executors (each application leaves its executor's logs in the work dir).
    assert f"offsetlake-ingest-{name}" in apps and f"offsetlake-backfill-{name}" in apps
    executor_logs = list(cluster.work_dir.glob("app-*/*/stderr"))
    assert len({p.parent.parent.name for p in executor_logs}) >= 2, apps
    # Airflow's state is in PostgreSQL; the backfill's result (XCom) carries the committed ranges.
    assert ingest_run in runs_in_postgres
    assert backfilled["ranges"] == {topic: {"1": [20, 400]}} and backfilled["kinds"] == ["backfill"]


def _dag_runs(postgres: Postgres, dag_id: str) -> list[str]:
    conn = postgres.connect(postgres.database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT run_id FROM dag_run WHERE dag_id = %s", (dag_id,))
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def _logs(home) -> str:
    return "\n".join(p.read_text(errors="replace")[-1500:] for p in sorted(home.glob("*.log")))
