"""Security the broker enforces (conftest.secured_broker: SASL/SCRAM-SHA-512 and mutual TLS, ACLs checked
by Kafka's StandardAuthorizer). A pipeline whose principal may read ingests exactly, over either listener;
a wrong password, a missing certificate and each missing permission fail in one line that names what was
refused, before Spark starts (the error is all the command prints)."""

from __future__ import annotations

import uuid

import pytest

from offsetlake.config import KafkaSettings
from offsetlake_local import broker_security
from support import (
    assert_exactly_once,
    assert_one_line_failure,
    create_topic,
    load,
    produce,
    run_cli,
    unique,
    write_pipeline,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def secured_topic(secured_broker):
    """A topic with 400 records among aborted transactions, written by the harness (a super user)."""
    topic = unique("t")
    create_topic(secured_broker.admin_bootstrap, topic, 2)
    harness = KafkaSettings(bootstrap_servers=secured_broker.admin_bootstrap, timeout_seconds=10)
    produce(harness, topic, 400, transactional_share=0.5, abort_share=0.25, seed=11)
    return topic


def user(secured_broker, *grants: tuple[str, str, tuple[str, ...]]) -> tuple[str, str]:
    """A new SCRAM user with `grants` [(resource, name, operations)]; returns (name, password)."""
    name, password = unique("u"), uuid.uuid4().hex
    broker_security.add_user(secured_broker, name, password)
    for resource, resource_name, operations in grants:
        broker_security.allow(secured_broker, name, resource, resource_name, *operations)
    return name, password


def reader_grants(topic: str) -> list:
    return [("topic", topic, ("READ", "DESCRIBE")), ("group", "offsetlake.*", ("READ", "DESCRIBE"))]


def ingest(pipelines_dir, name):
    return run_cli("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir), timeout=300)


def test_a_scram_reader_ingests_exactly(secured_broker, secured_topic, pipelines_dir, lake):
    name, password = user(secured_broker, *reader_grants(secured_topic))
    client = secured_broker.sasl_client(name, password)
    pipeline = write_pipeline(
        pipelines_dir, secured_broker.sasl_bootstrap, [secured_topic], lake, kafka={"client": client}
    )
    proc = ingest(pipelines_dir, pipeline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_exactly_once(load(pipelines_dir, pipeline)) > 0


def test_a_tls_client_certificate_is_the_principal(secured_broker, secured_topic, pipelines_dir, lake):
    principal = unique("reader")
    for resource, resource_name, operations in reader_grants(secured_topic):
        broker_security.allow(secured_broker, principal, resource, resource_name, *operations)
    pipeline = write_pipeline(
        pipelines_dir,
        secured_broker.ssl_bootstrap,
        [secured_topic],
        lake,
        kafka={"client": secured_broker.ssl_client(principal)},
    )
    proc = ingest(pipelines_dir, pipeline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert assert_exactly_once(load(pipelines_dir, pipeline)) > 0

    stranger = write_pipeline(
        pipelines_dir,
        secured_broker.ssl_bootstrap,
        [secured_topic],
        lake,
        kafka={"client": secured_broker.ssl_client(unique("stranger"))},  # a valid certificate, no ACLs
    )
    assert_one_line_failure(ingest(pipelines_dir, stranger), "not authorized to DESCRIBE topic", secured_topic)

    no_certificate = {k: v for k, v in secured_broker.ssl_client(principal).items() if "certificate" not in k}
    no_certificate.pop("ssl.key.location")
    anonymous = write_pipeline(
        pipelines_dir,
        secured_broker.ssl_bootstrap,
        [secured_topic],
        lake,
        kafka={"client": no_certificate, "timeout_seconds": 3, "retry_seconds": 0},
    )
    assert_one_line_failure(ingest(pipelines_dir, anonymous), secured_broker.ssl_bootstrap)


@pytest.mark.parametrize(
    "refusal, grants, expected",
    [
        ("wrong password", "reader", "authentication failed"),
        ("no READ on the topic", [("topic", "{topic}", ("DESCRIBE",))], "not authorized to READ topic"),
        ("no ACL on the topic", [], "not authorized to DESCRIBE topic"),
        (
            "no DESCRIBE on the group",
            [("topic", "{topic}", ("READ", "DESCRIBE"))],
            "not authorized to DESCRIBE consumer group",
        ),
    ],
)
def test_a_refusal_fails_in_one_line_before_spark_starts(
    secured_broker, secured_topic, pipelines_dir, lake, refusal, grants, expected
):
    if grants == "reader":
        grants = reader_grants(secured_topic)
    grants = [(r, n.format(topic=secured_topic), ops) for r, n, ops in grants]
    name, password = user(secured_broker, *grants)
    if refusal == "wrong password":
        password = "not-" + password
    pipeline = write_pipeline(
        pipelines_dir,
        secured_broker.sasl_bootstrap,
        [secured_topic],
        lake,
        kafka={"client": secured_broker.sasl_client(name, password), "timeout_seconds": 5, "retry_seconds": 30},
    )
    proc = ingest(pipelines_dir, pipeline)
    assert_one_line_failure(proc, expected, secured_broker.sasl_bootstrap)
    assert password not in proc.stderr
    if "topic" in expected:
        assert secured_topic in proc.stderr
