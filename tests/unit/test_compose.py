"""docker-compose.yaml is structurally sound (no Docker engine runs here: this checks the file)."""

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
PINNED = re.compile(r"^[\w./-]+:\d[\w.-]*$")  # a version tag, never latest or missing


def test_every_part_of_the_stack_is_there():
    expected = {
        "kafka",
        "postgres",
        "spark-master",
        "spark-worker",
        "airflow-init",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
    }
    assert expected <= set(SERVICES)


def test_every_image_is_pinned():
    for name, service in SERVICES.items():
        assert "image" in service, f"{name} has no image name"
        assert PINNED.match(service["image"]), f"{name}: image {service['image']!r} is not pinned"
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            assert PINNED.match(line.split()[1]), line


def test_spark_and_airflow_mount_the_same_dags_pipelines_and_lake():
    for name, service in SERVICES.items():
        if name.startswith(("spark-", "airflow-")) and name != "airflow-init":
            mounts = {v.split(":")[1] for v in service["volumes"] if ":" in v}
            assert {"/opt/offsetlake/dags", "/opt/offsetlake/include", "/lake"} <= mounts, name


def test_long_running_services_have_healthchecks_and_ports_bind_loopback_only():
    for name, service in SERVICES.items():
        if name != "airflow-init":
            assert "healthcheck" in service, f"{name} has no healthcheck"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_airflow_uses_postgres_and_the_spark_cluster():
    env = SERVICES["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    assert "spark://spark-master" in env["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert env["OFFSETLAKE_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_the_stacks_kafka_is_the_version_the_embedded_broker_runs():
    """One Kafka version for the product: the compose stack's image and the broker `make demo` resolves."""
    pom = (REPO / "src/offsetlake_local/poms/kafka-broker.xml").read_text()
    version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1)
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{version}"
