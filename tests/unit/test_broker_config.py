"""The embedded broker's configuration, written and read back without starting a JVM (the brokers
themselves run in every integration test)."""

from __future__ import annotations

import base64

from offsetlake_local import broker


def test_a_cluster_node_is_configured_for_three_replicas_and_read_back_as_written(tmp_path):
    voters = {1: ("127.0.0.1", 9101), 2: ("127.0.0.1", 9102), 3: ("127.0.0.1", 9103)}
    broker._configure(tmp_path, 2, "127.0.0.1", 9002, voters, "abc", replicas=3, listeners={"SASL_PLAINTEXT": 9012})
    config = broker._properties(tmp_path)

    assert config["node.id"] == "2"
    assert config["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert config["listeners"] == (
        "PLAINTEXT://127.0.0.1:9002,SASL_PLAINTEXT://127.0.0.1:9012,CONTROLLER://127.0.0.1:9102"
    )
    assert "CONTROLLER" not in config["advertised.listeners"]
    assert config["listener.security.protocol.map"] == (
        "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    for key in ("default.replication.factor", "offsets.topic.replication.factor"):
        assert config[key] == "3", key
    assert config["min.insync.replicas"] == config["transaction.state.log.min.isr"] == "2"
    assert config["auto.create.topics.enable"] == "false"

    node = broker._node(123, tmp_path, "127.0.0.1")
    assert (node.pid, node.port, node.node_id) == (123, 9002, 2)
    assert node.listeners == {"PLAINTEXT": 9002, "SASL_PLAINTEXT": 9012}
    assert (tmp_path / "cluster.id").read_text().strip() == "abc"


def test_one_node_keeps_one_replica_and_its_settings_win(tmp_path):
    broker._configure(
        tmp_path, 1, "127.0.0.1", 9002, {1: ("127.0.0.1", 9003)}, "x", replicas=1, extra={"num.partitions": "4"}
    )
    config = broker._properties(tmp_path)
    assert config["min.insync.replicas"] == config["default.replication.factor"] == "1"
    assert config["num.partitions"] == "4"


def test_cluster_ids_are_kafka_uuids_the_storage_tool_reads_as_values():
    ids = {broker.new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    for cluster_id in ids:
        assert not cluster_id.startswith("-")  # the storage tool would take it for an option
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_free_ports_are_distinct():
    ports = broker.free_ports(6)
    assert len(set(ports)) == 6 and all(p > 0 for p in ports)
