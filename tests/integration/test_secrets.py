"""A Kafka password given through ${ENV} never shows up in output, errors, logs or the table.

The broker (conftest.secured_broker) checks SCRAM-SHA-512 logins and ACLs, so the pipeline really
authenticates with the secret (a wrong one is refused); then every place the secret could leak is read:
stdout and stderr of each command (verbose, with Spark's own logging), error
messages of failing commands, and every file the platform wrote (Delta logs
with their userMetadata, checkpoints, data files).
"""

from __future__ import annotations

import uuid

import pytest

from offsetlake.config import KafkaSettings
from offsetlake_local import broker_security
from support import create_topic, files_containing, load, produce, run_cli, unique, write_pipeline

pytestmark = pytest.mark.slow
PASSWORD_VAR = "OFFSETLAKE_TEST_KAFKA_PASSWORD"
WRONG_VAR = "OFFSETLAKE_TEST_KAFKA_WRONG_PASSWORD"


def sasl(user: str, variable: str = PASSWORD_VAR) -> dict:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": "${" + variable + "}",
    }


def test_the_kafka_password_never_leaks(secured_broker, pipelines_dir, lake, tmp_path, monkeypatch):
    secret, wrong = f"pw-{uuid.uuid4().hex}", f"wrong-{uuid.uuid4().hex}"
    user = unique("u")
    broker_security.add_user(secured_broker, user, secret)
    monkeypatch.setenv(PASSWORD_VAR, secret)
    env = {PASSWORD_VAR: secret, WRONG_VAR: wrong}
    topic = unique("t")
    create_topic(secured_broker.admin_bootstrap, topic, 2)
    broker_security.allow(secured_broker, user, "topic", topic, "READ", "DESCRIBE")
    broker_security.allow(secured_broker, user, "group", "offsetlake.*", "READ", "DESCRIBE")
    bootstrap = secured_broker.sasl_bootstrap
    name = write_pipeline(pipelines_dir, bootstrap, [topic], lake, kafka={"client": sasl(user)})
    cfg = load(pipelines_dir, name)
    assert cfg.kafka.client["sasl.password"] == secret  # the real secret is what the clients get
    admin = KafkaSettings(bootstrap_servers=secured_broker.admin_bootstrap, timeout_seconds=10)
    produce(admin, topic, 300, seed=5, bad_share=0.05)  # the harness writes; the pipeline may only read
    args = ("--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    outputs = [run_cli("-v", "ingest", *args, env=env, check=True)]
    for command in (
        ("status",),
        ("history", "--json"),
        ("history",),
        ("show",),
        ("audit",),
        ("backfill", "--ranges", f"{topic}:0:0-10", "--dry-run"),
    ):
        outputs.append(run_cli("-v", *command, *args, env=env, check=True))
    assert "batch 1: committed" in outputs[0].stdout

    # Failing commands carry the secret in their configuration too; a wrong password's too.
    refused = write_pipeline(
        pipelines_dir, bootstrap, [topic], lake, kafka={"client": sasl(user, WRONG_VAR), "timeout_seconds": 3}
    )
    away = write_pipeline(
        pipelines_dir,
        "127.0.0.1:1",
        [topic],
        lake,
        kafka={"client": sasl(user), "timeout_seconds": 2, "retry_seconds": 4},
    )  # retries logged too
    broken = write_pipeline(
        pipelines_dir,
        bootstrap,
        [topic],
        lake,
        kafka={"client": sasl(user)},
        batch={"max_records_per_batch": "${" + PASSWORD_VAR + "}"},
    )
    failures = [
        run_cli("-v", "ingest", "--pipeline", p, "--pipelines-dir", str(pipelines_dir), env=env, timeout=120)
        for p in (refused, away, broken)
    ]
    assert all(f.returncode == 1 for f in failures), [f.stderr for f in failures]
    assert "authentication failed" in failures[0].stderr
    assert "127.0.0.1:1" in failures[1].stderr
    assert "batch.max_records_per_batch" in failures[2].stderr

    for proc in outputs + failures:
        assert secret not in proc.stdout + proc.stderr, proc.args
        assert wrong not in proc.stdout + proc.stderr, proc.args
    assert files_containing(lake, secret.encode()) == []
    assert files_containing(pipelines_dir, secret.encode()) == []  # the files hold only ${...}
