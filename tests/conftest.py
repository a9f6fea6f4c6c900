"""Shared services, started once per test session and stopped by PID: an Apache Kafka broker (a three-node
cluster for the failover tests), a Schema Registry, an S3-protocol server and Spark."""

from __future__ import annotations

import os

import pytest

from offsetlake_local import broker as embedded_broker

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# `make test` runs two pytest-xdist workers, each taking whole files (--dist loadfile) in collection order: the
# longest files first, so that no long file starts last while the other worker sits idle. Seconds per file in
# `make test` of 2026-11-27 (two workers, --durations=0); every other file is shorter and keeps its place.
LONGEST_FIRST = (
    "tests/chaos/test_chaos.py",  # ~250-390 s, by the seed's mode
    "tests/integration/test_delta_spark_engine.py",  # ~300 (one worker alone, 2026-11-28)
    "tests/airflow/test_cross_host.py",  # ~250
    "tests/airflow/test_dags.py",  # ~190, in many tests
    "tests/integration/test_delta_spark.py",  # ~160
    "tests/integration/test_catalog.py",  # ~135 (one worker alone, 2026-11-28)
    "tests/integration/test_cdc.py",  # ~140
    "tests/integration/test_failures.py",  # ~125
    "tests/airflow/test_airflow_ui.py",  # ~125
    "tests/integration/test_failover.py",  # ~120
    "tests/integration/test_upsert.py",  # ~115
    "tests/integration/test_object_storage.py",  # ~85
    "tests/integration/test_broker_restart.py",  # ~85
    "tests/integration/test_oracle.py",  # ~85
    "tests/airflow/test_airflow_connections.py",  # ~65
    "tests/airflow/test_scheduler_kill.py",  # ~60
    "tests/airflow/test_end_to_end.py",  # ~50
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: tests keep their order within a file, the rest theirs)."""
    rank = {name: n for n, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """An Apache Kafka broker (one KRaft node) on 127.0.0.1, on a free port, with its own data directory."""
    data = tmp_path_factory.mktemp("broker")
    b = embedded_broker.start(data, pid_file=data / "broker.pid")
    yield b
    embedded_broker.stop(b.pid)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Three Apache Kafka nodes, one cluster (replication factor 3, min.insync.replicas 2), for the failover
    tests: a test that kills a node starts it again before it ends (tests/integration/test_failover.py)."""
    c = embedded_broker.start_cluster(tmp_path_factory.mktemp("cluster"), size=3)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory):
    """An Apache Kafka node that enforces security: SASL/SCRAM-SHA-512 and mutual-TLS listeners, ACLs
    checked by Kafka's StandardAuthorizer (offsetlake_local.broker_security)."""
    from offsetlake_local import broker_security

    data = tmp_path_factory.mktemp("secured-broker")
    b = broker_security.start_secured(data, pid_file=data / "broker.pid")
    yield b
    embedded_broker.stop(b.pid)


@pytest.fixture
def own_broker(tmp_path):
    """A broker for one test, which it may stop and start again (support.RestartableBroker)."""
    from support import RestartableBroker

    b = RestartableBroker(tmp_path / "broker")
    yield b
    embedded_broker.stop(b.current.pid)


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory):
    """A Schema Registry (offsetlake_local.schema_registry) over real HTTP on 127.0.0.1, with basic auth."""
    from offsetlake_local import schema_registry as embedded_registry

    data = tmp_path_factory.mktemp("registry")
    r = embedded_registry.start(data, user="offsetlake", password="s3cret-registry-pw", pid_file=data / "registry.pid")
    r.user, r.password, r.answers = "offsetlake", "s3cret-registry-pw", "confluent"
    yield r
    embedded_registry.stop(r.pid)


@pytest.fixture(scope="session")
def karapace_registry(tmp_path_factory):
    """The same registry answering as Karapace does: Protobuf as .proto source, Avro keys reordered, JSON
    Schema with escaped slashes (offsetlake_local.schema_registry, --answer-as karapace)."""
    from offsetlake_local import schema_registry as embedded_registry

    data = tmp_path_factory.mktemp("karapace")
    r = embedded_registry.start(
        data, user="offsetlake", password="s3cret-registry-pw", pid_file=data / "registry.pid", answer_as="karapace"
    )
    r.user, r.password, r.answers = "offsetlake", "s3cret-registry-pw", "karapace"
    yield r
    embedded_registry.stop(r.pid)


@pytest.fixture(scope="session")
def bootstrap(broker) -> str:
    return broker.bootstrap_servers


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """An S3-protocol server (moto's) on 127.0.0.1 with one bucket, for tables on object storage."""
    from hosts import S3Server

    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark():
    """One local Spark for the session, with delta-spark in it as a Databricks user's session has it: the
    product runs beside Delta's SQL extension, and tests read and operate on its tables with delta-spark."""
    from delta_spark import delta_spark_conf
    from offsetlake.spark.session import build_session

    session = build_session("offsetlake-tests", "local[2]", delta_spark_conf())
    yield session
    session.stop()


@pytest.fixture
def pipeline(request, bootstrap, pipelines_dir, lake, monkeypatch):
    """A factory: a new topic holding `records` committed records (among aborted transactions), a
    pipeline reading it into a table under `lake`, optionally ingested once. Returns (cfg, topic).

    OFFSETLAKE_PIPELINES_DIR points at the test's pipelines, for jobs and DAG steps started from here.
    """
    from support import new_pipeline

    monkeypatch.setenv("OFFSETLAKE_PIPELINES_DIR", str(pipelines_dir))

    def make(partitions: int = 2, records: int = 0, ingest: bool = False, **overrides):
        cfg, topic = new_pipeline(bootstrap, pipelines_dir, lake, partitions, records, **overrides)
        if ingest:
            from offsetlake.batch import ingest as run_ingest

            run_ingest(request.getfixturevalue("spark"), cfg)
        return cfg, topic

    return make


@pytest.fixture
def pipelines_dir(tmp_path):
    return tmp_path / "pipelines"


@pytest.fixture
def lake(tmp_path):
    return tmp_path / "lake"
