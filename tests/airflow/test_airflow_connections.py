"""Kafka and registry credentials from Airflow connections, through real Airflow processes.

The pipeline names `kafka.connection` (the Apache Kafka provider's type: librdkafka settings in its
extra, SASL included) and `format.registry.connection` (HTTP, basic auth); neither secret is in the
pipeline file or in any environment. The connections are created over Airflow's REST API (stored
encrypted in the metadata database) and read back by the task through Airflow's own API. The ingest
DAG then commits an Avro topic read over SASL/SCRAM-SHA-512 from a broker that checks the password and
the ACLs (conftest.secured_broker), checked row by row; a second pipeline whose connection holds a wrong
password fails with "authentication failed", which shows the settings reach the job's Kafka clients.
While the runs go on, every process's command line and environment on this machine is sampled;
afterwards every Airflow log, the metadata database, Spark's event log, the XCom, the tables and the
pipeline files are read for the secrets.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from offsetlake.config import KafkaSettings
from offsetlake.config.connections import CONNECTIONS_FILE_ENV
from offsetlake_local import broker_security, stack
from offsetlake_local import schema_registry as embedded_registry
from offsetlake_local.broker import free_port
from offsetlake_local.producer import avro_event_maker, registry_client
from support import (
    REPO,
    BackgroundSampler,
    assert_exactly_once,
    create_topic,
    files_containing,
    load,
    produce,
    task_result,
    unique,
    write_pipeline,
)

pytestmark = pytest.mark.slow
HANDED_OVER = CONNECTIONS_FILE_ENV.encode()


class ProcessWatch(BackgroundSampler):
    """Samples /proc/*/cmdline and /proc/*/environ of every process, 10 times a second, for `needles`; and
    notes the connections files handed to jobs (the variable that names one, in a job's environment)."""

    def __init__(self, *needles: str, owners: set[int] = frozenset()):
        super().__init__()
        self.needles = [n.encode() for n in needles]
        self.owners = {str(pid) for pid in owners}  # processes that hold a secret by design (the registry server)
        self.found: list[str] = []
        self.connections_files: set[str] = set()
        self.samples = 0

    def sample(self) -> None:
        self.samples += 1
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or proc.name in self.owners:
                continue
            for part in ("cmdline", "environ"):
                try:
                    data = (proc / part).read_bytes()
                except OSError:
                    continue
                if part == "environ":
                    self.connections_files.update(
                        v.decode() for k, _, v in (e.partition(b"=") for e in data.split(b"\0")) if k == HANDED_OVER
                    )
                if any(n in data for n in self.needles):
                    self.found.append(f"/proc/{proc.name}/{part}: {(proc / 'cmdline').read_bytes()[:200]!r}")


def test_credentials_from_airflow_connections_reach_the_job_and_nothing_else(secured_broker, tmp_path):
    kafka_secret, registry_secret = f"kafka-{uuid.uuid4().hex}", f"registry-{uuid.uuid4().hex}"
    wrong_secret = f"wrong-{uuid.uuid4().hex}"
    registry = embedded_registry.start(tmp_path / "registry", user="offsetlake", password=registry_secret)
    bootstrap = secured_broker.sasl_bootstrap
    try:
        topic, user = unique("t"), unique("airflow")
        create_topic(secured_broker.admin_bootstrap, topic, 2)
        broker_security.add_user(secured_broker, user, kafka_secret)
        broker_security.allow(secured_broker, user, "topic", topic, "READ", "DESCRIBE")
        broker_security.allow(secured_broker, user, "group", "offsetlake.*", "READ", "DESCRIBE")
        sasl = secured_broker.sasl_client(user, kafka_secret)
        client = registry_client(registry.url, "offsetlake", registry_secret)
        produce(  # the harness writes (a super user); the pipeline's principal may only read
            KafkaSettings(bootstrap_servers=secured_broker.admin_bootstrap),
            topic,
            400,
            seed=3,
            abort_share=0.25,
            make_record=avro_event_maker(client, topic, 1),
        )
        pipelines, lake = tmp_path / "pipelines", tmp_path / "lake"
        avro = {
            "type": "avro",
            "schema": [],
            "registry": {"connection": "offsetlake_registry"},
            "key": {"type": "string"},
        }
        name = write_pipeline(
            pipelines,
            bootstrap,
            [topic],
            lake,
            schedule=None,
            format=avro,
            kafka={"bootstrap_servers": None, "connection": "offsetlake_kafka"},
        )
        refused = write_pipeline(
            pipelines,
            bootstrap,
            [topic],
            lake,
            schedule=None,
            format=avro,
            kafka={
                "bootstrap_servers": None,
                "connection": "offsetlake_kafka_wrong_password",
                "timeout_seconds": 5,
                "retry_seconds": 0,
            },
            airflow={"retries": 0},
        )
        cfg = load(pipelines, name)
        assert cfg.kafka.bootstrap_servers is None and kafka_secret not in (pipelines / f"{name}.yaml").read_text()

        home = tmp_path / "airflow"
        event_logs = tmp_path / "spark-events"
        event_logs.mkdir()
        conf_dir = tmp_path / "spark-conf"
        conf_dir.mkdir()
        # Uncompressed (Spark 4 compresses event logs by default): the grep below must see the text.
        (conf_dir / "spark-defaults.conf").write_text(
            f"spark.eventLog.enabled true\nspark.eventLog.compress false\nspark.eventLog.dir file://{event_logs}\n"
        )
        task_tmp = tmp_path / "tmp"  # the tasks' TMPDIR: where the connections file is handed over, then deleted
        task_tmp.mkdir()
        from cryptography.fernet import Fernet

        env = stack.environment(
            home,
            free_port(),
            REPO,
            pipelines,
            spark_master="local[2]",
            extra={
                "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
                "SPARK_CONF_DIR": str(conf_dir),
                "TMPDIR": str(task_tmp),
            },
        )
        with ProcessWatch(kafka_secret, wrong_secret, registry_secret, owners={registry.pid}) as watch:
            try:
                stack.start(env)
                api = stack.Api(env["AIRFLOW__API__BASE_URL"], stack.USER, stack.password(home))
                for conn_id, conn_type, fields in (
                    (
                        "offsetlake_kafka",
                        "kafka",
                        {"extra": json.dumps({"bootstrap.servers": bootstrap, **sasl, "group.id": "provider-example"})},
                    ),
                    (
                        "offsetlake_kafka_wrong_password",
                        "kafka",
                        {"extra": json.dumps({"bootstrap.servers": bootstrap, **sasl, "sasl.password": wrong_secret})},
                    ),
                    (
                        "offsetlake_registry",
                        "http",
                        {"host": registry.url, "login": "offsetlake", "password": registry_secret},
                    ),
                ):
                    api._call(
                        "POST", "/api/v2/connections", {"connection_id": conn_id, "conn_type": conn_type, **fields}
                    )
                runs = {}
                for pipeline in (name, refused):
                    dag_id = f"offsetlake__{pipeline}__ingest"
                    api.wait_for_dag(dag_id)
                    api.unpause(dag_id)
                    runs[pipeline] = (dag_id, api.trigger(dag_id))
                states = {p: api.wait_for_run(dag_id, run_id, timeout=600) for p, (dag_id, run_id) in runs.items()}
                result = task_result(api, *runs[name], "ingest")
            finally:
                stack.stop(home)
        if states.get(name) == "success":  # checked while the registry is up: the oracle decodes through it
            assert_exactly_once(
                cfg.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=bootstrap, client=sasl)}),
                registry=client,
            )
    finally:
        embedded_registry.stop(registry.pid)

    assert states == {name: "success", refused: "failed"}, _task_logs(home)
    assert result["versions"], result
    logs = _task_logs(home)
    assert "authentication failed" in logs  # the wrong password reached the job's clients, and was refused
    assert "handed to the job in a private file" in logs
    # the ingest said where its start-up went (make bench reads this line from the task log)
    assert re.search(
        r"start-up, seconds after spark-submit's JVM started: Python driver [0-9.]+, Spark session "
        r"ready [0-9.]+, first Spark job [0-9.]+ to [0-9.]+",
        logs,
    ), logs[-3000:]

    assert watch.samples > 50 and watch.found == []  # no command line or environment ever held a secret
    events = [p for p in event_logs.rglob("*") if p.is_file()]
    assert events and any(b"SparkListenerApplicationStart" in p.read_bytes() for p in events)
    assert json.dumps(result).find(kafka_secret) < 0  # the XCom (also in the database, read below)
    for secret in (kafka_secret, wrong_secret, registry_secret):
        for root in (home, event_logs, lake, pipelines):
            assert files_containing(root, secret.encode()) == [], (root, secret)
    # Handed over in a file under the tasks' TMPDIR, then deleted.
    assert watch.connections_files and all(Path(f).parent.parent == task_tmp for f in watch.connections_files)
    assert not any(Path(f).exists() for f in watch.connections_files)


def _task_logs(home: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((home / "logs").rglob("*")) if p.is_file())
