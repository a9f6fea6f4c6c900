"""Airflow connections in a pipeline: how a resolved connection becomes Kafka and registry settings.

Pure logic: the connections come from the file the operator hands to its job (as in production); the
real path through Airflow processes is tests/airflow/test_airflow_connections.py."""

import json
import stat

import pytest

from offsetlake.config import parse_pipeline
from offsetlake.config.connections import (
    CONNECTIONS_FILE_ENV,
    connection_ids,
    resolve_connections,
    write_connections_file,
)
from offsetlake.errors import ConfigError

KAFKA = {
    "conn_type": "kafka",
    "host": None,
    "port": None,
    "schema": None,
    "login": None,
    "password": None,
    "extra": {
        "bootstrap.servers": "kafka-1:9093,kafka-2:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ol",
        "sasl.password": "pw-kafka",
        "group.id": "the-providers-example-group",
        "fetch.min.bytes": "1",
    },
}
REGISTRY = {
    "conn_type": "http",
    "host": "registry.internal",
    "port": 8081,
    "schema": "https",
    "login": "reg",
    "password": "pw-registry",
    "extra": {},
}


def pipeline(kafka: dict, registry: dict | None = None):
    fmt = {"type": "avro", "registry": registry} if registry else {"type": "raw"}
    return parse_pipeline(
        {"name": "p", "topics": ["t"], "table": {"path": "/lake/p"}, "kafka": kafka, "format": fmt}, "p.yaml"
    )


@pytest.fixture
def handed_over(tmp_path, monkeypatch):
    path = write_connections_file(tmp_path, {"kafka_prod": KAFKA, "registry_prod": REGISTRY})
    monkeypatch.setenv(CONNECTIONS_FILE_ENV, str(path))
    return path


def test_the_file_handed_to_the_job_is_readable_by_its_user_only(handed_over):
    assert stat.S_IMODE(handed_over.stat().st_mode) == 0o600
    assert json.loads(handed_over.read_text())["kafka_prod"]["extra"]["sasl.password"] == "pw-kafka"


def test_a_kafka_connection_gives_the_clients_its_settings_and_the_protocol_keeps_its_own(handed_over):
    cfg = resolve_connections(pipeline({"connection": "kafka_prod", "client": {"fetch.min.bytes": 1000}}))
    assert cfg.kafka.bootstrap_servers == "kafka-1:9093,kafka-2:9093"
    client = cfg.kafka.client_config()
    assert client["sasl.password"] == "pw-kafka" and client["security.protocol"] == "SASL_SSL"
    assert "group.id" not in client  # offsetlake's own (never joined), not the connection's
    assert client["fetch.min.bytes"] == 1000  # the pipeline file wins over the connection
    assert "pw-kafka" not in repr(cfg)  # redacted like any client secret
    explicit = resolve_connections(pipeline({"connection": "kafka_prod", "bootstrap_servers": "here:9092"}))
    assert explicit.kafka.bootstrap_servers == "here:9092"


def test_a_registry_connection_gives_the_url_and_basic_auth(handed_over):
    cfg = resolve_connections(pipeline({"bootstrap_servers": "k:9092"}, {"connection": "registry_prod"}))
    registry = cfg.format.registry
    assert registry.url == "https://registry.internal:8081"
    assert (registry.username.get_secret_value(), registry.password.get_secret_value()) == ("reg", "pw-registry")
    assert "pw-registry" not in repr(cfg)
    given_url = resolve_connections(
        pipeline({"bootstrap_servers": "k:9092"}, {"connection": "registry_prod", "url": "http://other:8081"})
    )
    assert given_url.format.registry.url == "http://other:8081"


def test_a_pipeline_without_connections_is_left_as_it_is():
    cfg = pipeline({"bootstrap_servers": "k:9092"})
    assert connection_ids(cfg) == [] and resolve_connections(cfg) is cfg


def test_missing_pieces_are_one_line_errors_naming_them(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="key 'kafka': give 'bootstrap_servers', or an Airflow 'connection'"):
        pipeline({"client": {}})
    with pytest.raises(
        ConfigError, match="key 'format.registry': give the registry's 'url', or an Airflow 'connection'"
    ):
        pipeline({"bootstrap_servers": "k:9092"}, {"subject_name_strategy": "topic"})
    bare = {**KAFKA, "extra": {"security.protocol": "SASL_SSL"}}
    monkeypatch.setenv(CONNECTIONS_FILE_ENV, str(write_connections_file(tmp_path, {"bare": bare})))
    with pytest.raises(ConfigError, match="'bare' has no bootstrap.servers"):
        resolve_connections(pipeline({"connection": "bare"}))


def test_connections_read_already_are_used_as_given(monkeypatch):
    """The operator reads each connection through Airflow once and passes them on; nothing is read again."""
    monkeypatch.delenv(CONNECTIONS_FILE_ENV, raising=False)
    cfg = resolve_connections(
        pipeline({"connection": "kafka_prod"}, {"connection": "registry_prod"}),
        {"kafka_prod": KAFKA, "registry_prod": REGISTRY},
    )
    assert cfg.kafka.client_config()["sasl.password"] == "pw-kafka"
    assert cfg.format.registry.password.get_secret_value() == "pw-registry"


AWS = {
    "conn_type": "aws",
    "host": None,
    "port": None,
    "schema": None,
    "login": "AKIA-lake",
    "password": "pw-s3",
    "extra": {"region_name": "eu-west-1", "service_config": {"s3": {"endpoint_url": "http://minio.internal:9000"}}},
}


def table_pipeline(table: dict):
    doc = {
        "name": "p",
        "topics": ["t"],
        "table": table,
        "kafka": {"bootstrap_servers": "k:9092"},
        "format": {"type": "raw"},
    }
    return parse_pipeline(doc, "p.yaml")


def test_an_aws_connection_gives_the_tables_credentials_endpoint_and_region_and_the_pipeline_wins():
    table = {
        "path": "s3://lake/p",
        "connection": "aws_lake",
        "storage_options": {"conditional_put": "etag", "AWS_REGION": "us-east-2"},
    }
    cfg = table_pipeline(table)
    assert connection_ids(cfg) == ["aws_lake"]

    resolved = resolve_connections(cfg, {"aws_lake": AWS})

    assert resolved.table.storage_options == {
        "AWS_ACCESS_KEY_ID": "AKIA-lake",
        "AWS_SECRET_ACCESS_KEY": "pw-s3",
        "AWS_ENDPOINT_URL": "http://minio.internal:9000",
        "AWS_ALLOW_HTTP": "true",
        "conditional_put": "etag",
        "AWS_REGION": "us-east-2",  # the pipeline's own setting wins over the connection's region
    }
    # what every reader and writer of the table and its default quarantine is given, with the retry bound
    assert resolved.table_location.storage_options["AWS_SECRET_ACCESS_KEY"] == "pw-s3"
    assert resolved.quarantine_location.uri == "s3://lake/p_quarantine"
    assert resolved.quarantine_location.storage_options["AWS_SECRET_ACCESS_KEY"] == "pw-s3"
    assert resolved.quarantine_location.retry_seconds == 120
    assert cfg.table_location.storage_options.get("AWS_SECRET_ACCESS_KEY") is None  # the unresolved pipeline's
    assert "pw-s3" not in repr(resolved)


def test_an_aws_connection_without_an_access_key_is_one_line():
    table = {"path": "s3://lake/p", "connection": "aws_lake", "storage_options": {"conditional_put": "etag"}}
    cfg = table_pipeline(table)
    with pytest.raises(ConfigError, match="'aws_lake' has no login .* s3://lake/p"):
        resolve_connections(cfg, {"aws_lake": {**AWS, "login": None}})
