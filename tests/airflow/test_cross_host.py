"""Across hosts that share nothing but the network: five machines of one private network, each with
directories of its own that no other host can see.

- host `k` (a network namespace with its own address): the Kafka broker;
- host `o`: the object store (moto's S3 server), holding the table and the quarantine;
- host `s`: a Spark standalone master and worker (spark-class from the pyspark package);
- host `w`: an Airflow Celery worker, where the tasks run (spark-submit in client mode: the driver runs
  there, the executors on `s`);
- this machine (the root namespace, `.1` of the network): PostgreSQL (metadata database and Celery's
  result backend), Redis (Celery's broker) and Airflow's api-server, scheduler (CeleryExecutor),
  dag-processor and triggerer.

Nothing shared: the worker, the Spark processes, the store and the scheduler's Airflow components run
in mount namespaces of their own in which every other host's directory is an empty tmpfs
(`Host.command(hide=...)`), each host has its own HOME (so its own JVM archive cache), and the worker
has its own AIRFLOW_HOME and its own copy of the pipelines. The table's credentials come from an
Airflow connection (`table.connection`) kept in the metadata database, read where each task runs. The
ingest, stream, backfill and recovery DAGs run, the table is checked row by row against Kafka over S3,
and the Airflow view and metrics show the S3 table's lag.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hosts import Host, Postgres, PrivateNetwork, Redis, S3Server, SparkStandalone, free_port, start_postgres, wait_for
from offsetlake.table import query
from offsetlake_local import broker as embedded_broker
from offsetlake_local import processes, stack
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
CONNECTION = "aws_lake"


@pytest.fixture
def network():
    net = PrivateNetwork.create()
    yield net
    net.close()


def test_the_dags_run_across_hosts_that_share_nothing_but_the_network(network, tmp_path):
    places = {h: tmp_path / h for h in ("root", "worker", "spark", "kafka", "store")}
    for place in places.values():
        (place / "home").mkdir(parents=True)

    def hide_all_but(own: str) -> tuple:
        return tuple(p for h, p in places.items() if h != own)

    kafka_host, store_host = network.add_host("k"), network.add_host("o")
    spark_host, worker_host = network.add_host("s"), network.add_host("w")
    kafka = embedded_broker.start(places["kafka"] / "broker", port=9092, host=kafka_host.address, netns=kafka_host.name)
    started: list = []
    worker = None
    home = places["root"] / "airflow"
    try:
        store = S3Server.start(places["store"], store_host, hide=hide_all_but("store"))
        started.append(store)
        postgres = start_postgres(network)
        started.append(postgres)
        redis = Redis.start(network.root_address, places["root"])
        started.append(redis)
        cluster = SparkStandalone.start(
            spark_host, places["spark"], hide=hide_all_but("spark"), env={"HOME": str(places["spark"] / "home")}
        )
        started.append(cluster)

        topic = unique("t")
        create_topic(kafka.bootstrap_servers, topic, 3)
        pipelines = places["root"] / "pipelines"
        on_s3 = {"storage_options": {"conditional_put": "etag"}, "connection": CONNECTION}
        name = write_pipeline(
            pipelines,
            kafka.bootstrap_servers,
            [topic],
            places["root"] / "unused",
            schedule=None,
            table={"path": f"s3://{store.bucket}/{topic}/table", **on_s3},
            quarantine={"path": f"s3://{store.bucket}/{topic}/quarantine", **on_s3},
            batch={"max_records_per_batch": 100_000, "max_records_per_task": 400},
        )
        shutil.copytree(pipelines, places["worker"] / "pipelines")  # each host ships its own copy
        # The walls hold: from the worker host, the scheduler's pipeline file is not there.
        peek = worker_host.command("cat", str(pipelines / f"{name}.yaml"), hide=hide_all_but("worker"))
        assert subprocess.run(peek, capture_output=True).returncode != 0
        cfg = _resolved(load(pipelines, name), store)
        produce(cfg.kafka, topic, 2000, transactional_share=0.6, abort_share=0.25, seed=7, bad_share=0.02)

        celery = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{postgres.user}@{network.root_address}:"
            f"{postgres.port}/{postgres.database}",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.network_url,
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {
                    "conn_type": "spark",
                    "host": f"spark://{spark_host.address}",
                    "port": 7077,
                    "extra": {"deploy-mode": "client"},
                }
            ),
        }
        port = free_port(network.root_address)
        env = stack.environment(
            home,
            port,
            REPO,
            pipelines,
            host=network.root_address,
            extra={**celery, "HOME": str(places["root"] / "home")},
        )
        # The scheduler's host has its walls too: its api-server (the view, the metrics), scheduler,
        # dag-processor and triggerer see none of the other hosts' directories.
        root_host = Host("", network.root_address)
        pids = stack.start(env, wrap=lambda command: root_host.command(*command, hide=hide_all_but("root")))
        api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
        _create_connection(api, store)
        worker = _start_worker(worker_host, places, env, celery, hide_all_but("worker"))
        # The walls hold for them too: through its own mount namespace the scheduler sees the worker's
        # directory (which holds the worker's AIRFLOW_HOME by now) empty.
        assert list(places["worker"].iterdir())
        assert not list(Path(f"/proc/{pids['scheduler']}/root{places['worker']}").iterdir())

        ingest_id = f"offsetlake__{name}__ingest"
        api.wait_for_dag(ingest_id)
        api.unpause(ingest_id)  # `schedule: null`: only the runs triggered here
        ingest_run = api.trigger(ingest_id)
        assert api.wait_for_run(ingest_id, ingest_run, timeout=600) == "success", _logs(places)
        assert_exactly_once(cfg)
        ingested = task_result(api, ingest_id, ingest_run, "ingest")
        assert ingested["versions"] and ingested["kinds"] == ["ingest"] and ingested["rows"] > 0

        produce(cfg.kafka, topic, 600, transactional_share=0.5, abort_share=0.2, seed=8)
        stream_id = f"offsetlake__{name}__stream"
        api.wait_for_dag(stream_id)
        api.unpause(stream_id)
        stream_run = api.trigger(stream_id, {"max_seconds": 10})
        assert api.wait_for_run(stream_id, stream_run, timeout=600) == "success", _logs(places)
        assert_exactly_once(cfg)  # caught up to the LSO, over S3

        before = query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist()
        backfill_id = f"offsetlake__{name}__backfill"
        api.wait_for_dag(backfill_id)
        api.unpause(backfill_id)
        backfill_run = api.trigger(backfill_id, {"ranges": [{"topic": topic, "partition": 1, "start": 20, "end": 400}]})
        assert api.wait_for_run(backfill_id, backfill_run, timeout=600) == "success", _logs(places)
        backfilled = task_result(api, backfill_id, backfill_run, "backfill")

        recovery_id = f"offsetlake__{name}__recovery"
        api.wait_for_dag(recovery_id)
        api.unpause(recovery_id)
        recovery_run = api.trigger(recovery_id)
        assert api.wait_for_run(recovery_id, recovery_run, timeout=600) == "success", _logs(places)

        produce(cfg.kafka, topic, 150, transactional_share=0, seed=9)  # lag: 150 offsets, read over S3
        view = api.get("/offsetlake/api/pipelines")["pipelines"]
        metrics = urllib.request.urlopen(f"{env['AIRFLOW__API__BASE_URL']}/offsetlake/metrics", timeout=60).read()
        apps = [a["name"] for a in cluster.applications()]
        runs_in_postgres = _dag_runs(postgres, ingest_id)
        after = query(cfg.table_location, "SELECT * FROM t ORDER BY kafka_partition, kafka_offset").to_pylist()
        commits = pipeline_commits(cfg)
    finally:
        if worker is not None:
            processes.stop(worker.pid, timeout=30, group=True)
        stack.stop(home)
        for server in reversed(started):
            server.stop()
        embedded_broker.stop(kafka.pid)

    # The table: exact row by row, the backfill replaced its rows with the same rows in one commit.
    assert after == before
    assert {h.meta.kind for h in commits} >= {"ingest", "backfill"}
    assert any(h.meta.run.dag_id == stream_id for h in commits)
    assert backfilled["ranges"] == {topic: {"1": [20, 400]}} and backfilled["kinds"] == ["backfill"]
    # The Spark work ran on the cluster, the tasks on the Celery worker, Airflow's state in PostgreSQL.
    assert {f"offsetlake-ingest-{name}", f"offsetlake-stream-{name}", f"offsetlake-backfill-{name}"} <= set(apps)
    assert list((places["worker"] / "airflow" / "logs").rglob("*.log")), "no task ran on the worker host"
    assert not list((places["root"] / "airflow").glob("logs/dag_id=*")), "a task ran on the scheduler's host"
    assert ingest_run in runs_in_postgres
    # The view and the metrics read the S3 table (its credentials from the connection) where they run.
    (shown,) = [p for p in view if p["pipeline"] == name]
    assert shown["error"] is None and shown["table"] == cfg.table_path and shown["total_lag"] == 150, shown
    assert f'offsetlake_pipeline_lag_records{{pipeline="{name}"}} 150.0' in metrics.decode()


def _resolved(cfg, store: S3Server):
    """The pipeline as the test reads it: the connection's credentials applied (as the operator would)."""
    from offsetlake.config.connections import resolve_connections

    return resolve_connections(cfg, {CONNECTION: _connection(store)})


def _connection(store: S3Server) -> dict:
    return {
        "conn_type": "aws",
        "login": store.access_key,
        "password": store.secret_key,
        "extra": {"region_name": "us-east-1", "endpoint_url": store.url},
    }


def _create_connection(api: stack.Api, store: S3Server) -> None:
    conn = _connection(store)
    api._call(
        "POST",
        "/api/v2/connections",
        {
            "connection_id": CONNECTION,
            "conn_type": conn["conn_type"],
            "login": conn["login"],
            "password": conn["password"],
            "extra": json.dumps(conn["extra"]),
        },
    )


def _start_worker(host, places: dict, scheduler_env: dict, celery: dict, hide: tuple) -> subprocess.Popen:
    """`airflow celery worker` on its host: its own AIRFLOW_HOME, pipelines and HOME; the scheduler's
    secrets for the execution API (as a deployment hands them to each worker); logs not served."""
    airflow_home = places["worker"] / "airflow"
    airflow_home.mkdir()
    env = {
        **scheduler_env,
        **celery,
        "AIRFLOW_HOME": str(airflow_home),
        "OFFSETLAKE_PIPELINES_DIR": str(places["worker"] / "pipelines"),
        "HOME": str(places["worker"] / "home"),
        # The driver runs here: it binds and advertises this host's address to the executors.
        "SPARK_LOCAL_IP": host.address,
        "SPARK_LOCAL_HOSTNAME": host.address,
    }
    env.pop("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", None)
    log = places["worker"] / "worker.log"
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            host.command(sys.executable, "-m", "airflow", "celery", "worker", "-c", "2", "-s", hide=hide),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    wait_for(lambda: " ready." in log.read_text(errors="replace"), "the Celery worker ready", 180, worker, log)
    return worker


def _dag_runs(postgres: Postgres, dag_id: str) -> list[str]:
    conn = postgres.connect(postgres.database)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT run_id FROM dag_run WHERE dag_id = %s", (dag_id,))
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


def _logs(places: dict) -> str:
    logs = sorted((places["root"] / "airflow").glob("*.log")) + [places["worker"] / "worker.log"]
    logs += sorted((places["worker"] / "airflow" / "logs").rglob("*.log"))[-3:]
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')[-1500:]}" for p in logs if p.exists())
