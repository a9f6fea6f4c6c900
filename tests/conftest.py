"""Shared services, started once per test session and stopped by PID: an Apache Kafka broker (a three-node
cluster for the failover tests), a Schema Registry, an S3-protocol server and Spark."""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from offsetlake_local import broker as embedded_broker
from offsetlake_local import jvm as embedded_jvm

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The local stack's JVMs (Kafka brokers, Kafka Connect, the Hive Metastore) compile with C1 only here: the
# tests start them dozens of times and give them little to serve, and C2 compiling their start-up code was
# most of each start's CPU (docs/development/tests.md, "The Kafka brokers"). The benchmarks keep the defaults.
os.environ.setdefault(embedded_jvm.OPTIONS_ENV, "-XX:TieredStopAtLevel=1")

# `make test` runs two pytest-xdist workers, each taking whole files (--dist loadfile) in collection order: the
# longest files first, so that no long file starts last while the other worker sits idle, and the short ones
# fill the end. Seconds per file (the sum of its tests' durations) in a fresh clone's `make test` of 2026-11-28
# (two workers, --durations=0), less the tests since marked `long`; files under ~15 s keep their place.
LONGEST_FIRST = (
    "tests/chaos/test_chaos.py",  # ~240-420 s, by the seed's draw
    "tests/integration/test_delta_spark_engine.py",  # ~500
    "tests/airflow/test_dags.py",  # ~270
    "tests/integration/test_delta_spark.py",  # ~260
    "tests/airflow/test_airflow_ui.py",  # ~255
    "tests/integration/test_cdc.py",  # ~220
    "tests/airflow/test_cross_host.py",  # ~215
    "tests/integration/test_catalog.py",  # ~180
    "tests/integration/test_failures.py",  # ~170
    "tests/integration/test_oracle.py",  # ~120
    "tests/integration/test_object_storage.py",  # ~115
    "tests/integration/test_broker_restart.py",  # ~95
    "tests/integration/test_failover.py",  # ~85
    "tests/airflow/test_scheduler_kill.py",  # ~75
    "tests/airflow/test_airflow_connections.py",  # ~70
    "tests/integration/test_operations.py",  # ~60
    "tests/airflow/test_end_to_end.py",  # ~55
    "tests/integration/test_registry_formats.py",  # ~55
    "tests/integration/test_upsert.py",  # ~50
    "tests/integration/test_jvm_archive.py",  # ~45
    "tests/integration/test_bad_input.py",  # ~45
    "tests/integration/test_maintenance.py",  # ~45
    "tests/integration/test_executor_loss.py",  # ~45
    "tests/integration/test_package.py",  # ~40
    "tests/integration/test_kafka_security.py",  # ~35
    "tests/integration/test_spark_session.py",  # ~35
    "tests/unit/test_checks.py",  # ~35
    "tests/integration/test_secrets.py",  # ~35
    "tests/integration/test_per_topic_pipelines.py",  # ~35
    "tests/integration/test_ingest.py",  # ~30
    "tests/integration/test_cli.py",  # ~30
    "tests/airflow/test_plugin.py",  # ~25
    "tests/integration/test_oracle_schema.py",  # ~20
    "tests/integration/test_disk_full.py",  # ~20
)


# A worker that dies (a signal, a fatal error in native code) takes what it would have said with it: its
# output is captured, and pytest's fault handler writes there. Each worker's fault handler writes to files of
# its own instead (one for fatal errors, one per ending signal), which the controller prints when that worker
# goes down.
CRASH_DIR_ENV = "OFFSETLAKE_PYTEST_CRASH_DIR"
_CRASH_LOGS = pytest.StashKey()


@pytest.hookimpl(trylast=True)  # after pytest's own fault handler, which this one replaces in a worker
def pytest_configure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        os.environ[CRASH_DIR_ENV] = tempfile.mkdtemp(prefix="offsetlake-pytest-crashes-")  # the workers inherit it
        return
    if not os.environ.get(CRASH_DIR_ENV):
        return
    directory = Path(os.environ[CRASH_DIR_ENV])
    logs = config.stash[_CRASH_LOGS] = {
        name: open(directory / f"{worker} {name}.log", "w")  # noqa: SIM115 - open until the worker exits
        for name in ("fatal error", "SIGTERM", "SIGHUP")
    }
    faulthandler.enable(file=logs["fatal error"], all_threads=True)
    for ending in (signal.SIGTERM, signal.SIGHUP):  # where it was, then end as it would have
        faulthandler.register(ending, file=logs[ending.name], all_threads=True, chain=True)


def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") is None and os.environ.get(CRASH_DIR_ENV):
        shutil.rmtree(os.environ.pop(CRASH_DIR_ENV), ignore_errors=True)


def pytest_testnodedown(node, error):
    """In the controller: a worker went down without finishing (`error`); print what its fault handler wrote
    (nothing: it was killed by SIGKILL, or it exited)."""
    if error is None:
        return
    worker = node.gateway.id
    said = {
        log.stem.removeprefix(f"{worker} "): log.read_text(errors="replace").strip()
        for log in Path(os.environ.get(CRASH_DIR_ENV, "/nonexistent")).glob(f"{worker} *.log")
    }
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    reporter.write_line(f"\n[{worker}] went down ({error})")
    for cause, text in said.items():
        if text:
            reporter.write_line(f"[{worker}] {cause}:\n{text}")
    if not any(said.values()):
        reporter.write_line(f"[{worker}] no fatal error and no SIGTERM or SIGHUP: a SIGKILL, or it exited")


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three Apache Kafka nodes, one cluster (replication factor 3, min.insync.replicas 2), for the failover
    tests: a test that kills a node starts it again before it ends (tests/integration/test_failover.py).
    Stopped when their module ends, so that three idle nodes do not share the cores with the rest of the
    session."""
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
