"""The Airflow connections the Connections page shows (docs/examples/connections/), resolved for the
pipeline it shows as a task resolves them (`offsetlake.config.connections.resolve_connections`): each setting lands
where the page says."""

import json
from pathlib import Path

import yaml

from offsetlake.config import parse_pipeline
from offsetlake.config.connections import resolve_connections

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "connections"


def example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def test_the_pages_connections_give_the_pipeline_its_kafka_store_and_registry_settings():
    doc = yaml.safe_load((EXAMPLES / "orders_avro.yaml").read_text())
    cfg = parse_pipeline(doc, "orders_avro.yaml")
    given = {
        "kafka_prod": example("kafka.json"),
        "aws_lake": example("aws.json"),
        "registry_prod": example("registry.json"),
    }

    resolved = resolve_connections(cfg, given)

    kafka = example("kafka.json")["extra"]
    assert resolved.kafka.bootstrap_servers == kafka["bootstrap.servers"]
    assert {k: resolved.kafka.client[k] for k in kafka if k != "bootstrap.servers"} == {
        k: v for k, v in kafka.items() if k != "bootstrap.servers"
    }
    for table in (resolved.table, resolved.quarantine):
        options = table.storage_options
        assert (options["AWS_ACCESS_KEY_ID"], options["AWS_REGION"]) == ("AKIAEXAMPLEEXAMPLE", "eu-west-1")
        assert options["conditional_put"] == "etag"  # the pipeline's own option stays
    registry = resolved.format.registry
    assert registry.url == "https://registry.example.com"
    assert registry.username.get_secret_value() == "offsetlake"


def test_the_spark_connection_names_a_master_and_a_deploy_mode():
    spark = example("spark.json")
    assert spark["conn_type"] == "spark" and spark["host"].startswith("spark://")
    assert spark["extra"]["deploy-mode"] in ("client", "cluster")
