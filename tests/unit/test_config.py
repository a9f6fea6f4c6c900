"""Pipeline config validation: every mistake names its key and file, in one line."""

import pytest
import yaml

from offsetlake.config import load_pipeline, parse_pipeline, redact_client
from offsetlake.errors import ConfigError


def base():
    return {
        "name": "orders",
        "topics": ["orders"],
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "table": {"path": "/lake/orders"},
        "format": {"type": "json", "schema": [{"name": "id", "type": "long", "required": True}]},
    }


def error_for(doc) -> str:
    with pytest.raises(ConfigError) as err:
        parse_pipeline(doc, "orders.yaml")
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_valid_pipeline_gets_defaults():
    cfg = parse_pipeline(base(), "orders.yaml")
    assert cfg.kafka.isolation_level == "read_committed"
    assert cfg.starting_offsets == "earliest" and cfg.on_data_loss == "fail"
    assert cfg.quarantine_path == "/lake/orders_quarantine"
    assert cfg.column_names()[-4:] == ["kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp"]
    assert cfg.format.unknown_fields == "drop" and cfg.format.max_value_bytes == 1_048_576


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (
            lambda d: (
                d["batch"].update(max_records_per_batch="lots")
                if "batch" in d
                else d.update(batch={"max_records_per_batch": "lots"})
            ),
            "key 'batch.max_records_per_batch'",
        ),
        (lambda d: d.pop("topics"), "missing required key 'topics'"),
        (lambda d: d["kafka"].update(isolation_level="dirty"), "key 'kafka.isolation_level'"),
        (
            lambda d: (
                d["kafka"]["client"].update({"group.id": "x"})
                if "client" in d["kafka"]
                else d["kafka"].update(client={"group.id": "x"})
            ),
            "'group.id' is managed by offsetlake",
        ),
        (lambda d: d["format"].update(type="raw"), "takes no 'schema'"),
        (lambda d: d["format"].update(schema=[]), "needs a declared 'schema'"),
        (
            lambda d: d["format"]["schema"].append({"name": "kafka_offset", "type": "long"}),
            "clashes with a column offsetlake adds",
        ),
        (lambda d: d["format"]["schema"].append({"name": "x", "type": "decimal"}), "key 'format.schema.1.type'"),
        (lambda d: d["table"].update(partition_by=["nope"]), "'nope' is not a column"),
        (lambda d: d["table"].update(name="orders"), "'orders': a table name is schema.table"),
        (lambda d: d["table"].update(name="lake.or-ders"), "key 'table.name'"),
        (lambda d: d.update(name="../etc"), "key 'name'"),
        (
            lambda d: (
                d["batch"].update(max_records_per_task=0)
                if "batch" in d
                else d.update(batch={"max_records_per_task": 0})
            ),
            "key 'batch.max_records_per_task'",
        ),
        (lambda d: d.update(on_data_loss="ignore"), "key 'on_data_loss'"),
        (lambda d: d["format"].update(unknown_fields="merge"), "key 'format.unknown_fields'"),
        (lambda d: d["format"].update(type="raw", schema=[], unknown_fields="keep"), "needs format 'json'"),
        (
            lambda d: d["format"]["schema"].append({"name": "_unknown_fields", "type": "string"}),
            "clashes with a column",
        ),
        (lambda d: d["format"].update(max_value_bytes=0), "key 'format.max_value_bytes'"),
        (lambda d: d.update(airflow={"retries": -1}), "key 'airflow.retries'"),
        (lambda d: d.update(mode="micro"), "key 'mode'"),
        (lambda d: d.update(mode="stream", schedule="@hourly"), "in mode 'stream' the stream DAG runs all the time"),
        (lambda d: d.update(airflow={"retry_delay_seconds": "soon"}), "key 'airflow.retry_delay_seconds'"),
        (lambda d: d.update(airflow={"retry": 3}), "unknown key 'airflow.retry'"),
        (lambda d: d.update(write={"mode": "merge"}), "key 'write.mode'"),
        (lambda d: d.update(write={"mode": "upsert"}), "needs write.key"),
        (lambda d: d.update(write={"mode": "upsert", "key": ["nope"]}), "write column 'nope' is not a column"),
        (lambda d: d.update(write={"mode": "upsert", "key": ["kafka_offset"]}), "names a Kafka lineage column"),
        (lambda d: d.update(write={"mode": "upsert", "key": ["id", "id"]}), "lists a column twice"),
        (lambda d: d.update(write={"key": ["id"]}), "are for write.mode 'upsert'"),
        (
            lambda d: d.update(write={"mode": "upsert", "key": ["id"], "order_by": "id"}),
            "a tombstone has no value to order by",
        ),
        (lambda d: d["format"].update(envelope="debezium"), "envelope 'debezium' needs write.mode 'upsert'"),
        (lambda d: d["format"].update(envelope="dbz"), "key 'format.envelope'"),
        (lambda d: d["format"].update(debezium={"position": "lsn"}), "'debezium' settings are for envelope"),
        (
            lambda d: d.update(format={"type": "raw", "envelope": "debezium"}),
            "envelope 'debezium' needs a format that decodes values",
        ),
        (
            lambda d: d["format"]["schema"].append({"name": "_debezium_op", "type": "string"}),
            "schema field '_debezium_op' clashes with a column offsetlake adds",
        ),
    ],
)
def test_mistakes_name_the_key(mutate, expected):
    doc = base()
    mutate(doc)
    message = error_for(doc)
    assert message.startswith("orders.yaml: ")
    assert expected in message


def test_a_debezium_pipeline_adds_op_and_position_columns_and_may_order_deletes_by_position():
    doc = base()
    doc["format"].update(envelope="debezium", debezium={"position": "change_lsn", "position_type": "string"})
    doc["write"] = {"mode": "upsert", "key": ["id"], "order_by": "_debezium_position"}
    cfg = parse_pipeline(doc, "orders.yaml")
    assert cfg.column_names()[-6:-4] == ["_debezium_op", "_debezium_position"]
    assert cfg.format.debezium.position == "change_lsn"


def test_env_references_are_resolved(monkeypatch):
    monkeypatch.setenv("KAFKA_HOSTS", "kafka-1:9092")
    monkeypatch.setenv("KAFKA_PASSWORD", "s3cret")
    doc = base()
    doc["kafka"]["bootstrap_servers"] = "${KAFKA_HOSTS}"
    doc["kafka"]["client"] = {"sasl.password": "${KAFKA_PASSWORD}", "security.protocol": "${PROTO:-SASL_SSL}"}
    cfg = parse_pipeline(doc, "orders.yaml")
    assert cfg.kafka.bootstrap_servers == "kafka-1:9092"
    assert cfg.kafka.client_config()["sasl.password"] == "s3cret"
    assert cfg.kafka.client["security.protocol"] == "SASL_SSL"
    assert "s3cret" not in repr(cfg) and "s3cret" not in str(cfg)


def test_a_missing_env_reference_names_key_and_variable(monkeypatch):
    monkeypatch.delenv("NOPE_NOT_SET", raising=False)
    doc = base()
    doc["table"]["path"] = "${NOPE_NOT_SET}/orders"
    with pytest.raises(ConfigError, match=r"key 'table.path' refers to environment variable NOPE_NOT_SET"):
        parse_pipeline(doc, "orders.yaml")


def test_secrets_are_redacted_for_display():
    shown = redact_client({"sasl.password": "p", "sasl.username": "u", "ssl.key.pem": "k"})
    assert shown == {"sasl.password": "***", "sasl.username": "u", "ssl.key.pem": "***"}


def test_load_pipeline_from_a_folder(tmp_path):
    (tmp_path / "orders.yaml").write_text(yaml.safe_dump({**base(), "table": {"path": "lake/orders"}}))
    cfg = load_pipeline("orders", tmp_path)
    assert cfg.table_path.endswith("/lake/orders") and cfg.table_path.startswith("/")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("missing", "unknown pipeline 'missing'"),
        ("../../etc/passwd", "invalid pipeline name"),
    ],
)
def test_unknown_or_unsafe_pipeline_names(tmp_path, name, expected):
    with pytest.raises(ConfigError, match=expected):
        load_pipeline(name, tmp_path)


def test_file_name_and_pipeline_name_must_agree(tmp_path):
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(base()))
    with pytest.raises(ConfigError, match="key 'name' is 'orders' but the file is named 'other'"):
        load_pipeline("other", tmp_path)


def test_invalid_yaml_names_the_line(tmp_path):
    (tmp_path / "orders.yaml").write_text("name: orders\ntopics: [unclosed\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_pipeline("orders", tmp_path)


def test_log_retention_takes_fractions_of_a_day_down_to_an_hour():
    doc = base() | {"maintenance": {"log_retention_days": 0.25}}
    props = parse_pipeline(doc, "orders.yaml").maintenance.table_properties()
    assert props["delta.logRetentionDuration"] == "interval 360 minutes"
    assert (
        parse_pipeline(base(), "orders.yaml").maintenance.table_properties()["delta.logRetentionDuration"]
        == "interval 30 days"
    )
    assert "maintenance.log_retention_days" in error_for(base() | {"maintenance": {"log_retention_days": 0.01}})
    assert "maintenance.log_retention_days" in error_for(base() | {"maintenance": {"log_retention_days": "2"}})


def test_a_stream_is_warned_when_its_windows_outgrow_the_commit_rate():
    defaults = parse_pipeline(base(), "orders.yaml").maintenance
    warning = defaults.stream_window_warning(5)
    assert "~518,400 commits" in warning and "~120,960 removed files" in warning and "\n" not in warning
    assert defaults.stream_window_warning(300) is None  # every 5 minutes: 8,640 commits in 30 days
    sized = parse_pipeline(
        base() | {"maintenance": {"log_retention_days": 1, "deleted_file_retention_hours": 24}}, "orders.yaml"
    ).maintenance
    assert sized.stream_window_warning(5) is None
    assert "~86,400 commits" in sized.stream_window_warning(1)


def test_the_demo_pipeline_fits_its_stream():
    from pathlib import Path

    demo = load_pipeline("demo_events", Path(__file__).parents[2] / "include" / "pipelines")
    assert demo.maintenance.stream_window_warning(demo.stream_interval_seconds) is None
