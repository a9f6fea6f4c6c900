"""Trigger-form validation (pure logic; the Kafka metadata lookup is a stub here)."""

import pytest

from offsetlake.airflow.forms import backfill_ranges, form_tables, recovery_args
from offsetlake.config import parse_pipeline
from offsetlake.errors import ConfigError

CFG = parse_pipeline(
    {
        "name": "p",
        "topics": ["t"],
        "kafka": {"bootstrap_servers": "x:1"},
        "table": {"path": "/tmp/p"},
        "format": {"type": "raw"},
    },
    "p.yaml",
)


class TwoPartitions:
    def partitions(self, topics):
        return [("t", 0), ("t", 1)]


def ranges(*items, **extra):
    return backfill_ranges(CFG, {"ranges": list(items), **extra}, TwoPartitions())


def test_ranges_become_canonical_arguments():
    assert (
        ranges(
            {"topic": "t", "partition": 1, "start": 5, "end": 9}, {"topic": "t", "partition": 0, "start": 0, "end": 3}
        )
        == "t:1:5-9,t:0:0-3"
    )


@pytest.mark.parametrize(
    "item, message",
    [
        ({"topic": "t", "partition": 0, "start": 9, "end": 5}, "must be greater than start"),
        ({"topic": "t", "partition": 4, "start": 0, "end": 5}, r"unknown partition t\[4\]"),
        ({"topic": "u", "partition": 0, "start": 0, "end": 5}, "not one of the pipeline's topics"),
        ({"topic": "t", "partition": 0, "start": "0", "end": 5}, "start must be a whole number"),
        ({"topic": "t", "partition": True, "start": 0, "end": 5}, "partition must be a whole number"),
        ({"topic": "t", "partition": 0, "start": 0, "end": 5, "path": "/etc"}, "must be an object with"),
    ],
)
def test_bad_ranges_are_refused(item, message):
    with pytest.raises(ConfigError, match=message):
        ranges(item)


def test_unknown_pipeline_and_mixed_modes_are_refused():
    with pytest.raises(ConfigError, match="unknown pipeline 'q'"):
        ranges({"topic": "t", "partition": 0, "start": 0, "end": 1}, pipeline="q")
    with pytest.raises(ConfigError, match="not both"):
        ranges({"topic": "t", "partition": 0, "start": 0, "end": 1}, time_from="2026-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="give ranges, or both"):
        backfill_ranges(CFG, {}, TwoPartitions())


def test_recovery_arguments():
    assert recovery_args(CFG, {"repair": True}) == {
        "repair": "true",
        "cleanup": "false",
        "older_than": "3600",
        "reset_offsets": "",
        "reason": "",
    }
    args = recovery_args(
        CFG,
        {
            "reset": True,
            "reset_reason": "bad deploy (INC-7)",
            "reset_offsets": [{"topic": "t", "partition": 0, "offset": 42}],
        },
    )
    assert args["reset_offsets"] == "t:0=42" and args["reason"] == "bad deploy (INC-7)"


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"reset": True, "reset_reason": "x", "reset_offsets": []}, "reset_offsets is empty"),
        ({"reset": False, "reset_offsets": [{"topic": "t", "partition": 0, "offset": 1}]}, "reset is false"),
        (
            {"reset": True, "reset_reason": "`id`", "reset_offsets": [{"topic": "t", "partition": 0, "offset": 1}]},
            "no paths or shell",
        ),
        (
            {
                "reset": True,
                "reset_reason": "/etc/passwd",
                "reset_offsets": [{"topic": "t", "partition": 0, "offset": 1}],
            },
            "no paths or shell",
        ),
        ({"cleanup_older_than_seconds": 5}, "between 60"),
        ({"repair": "yes"}, "true or false"),
    ],
)
def test_bad_recovery_forms_are_refused(conf, message):
    with pytest.raises(ConfigError, match=message):
        recovery_args(CFG, conf)


def test_maintenance_form_normalises_and_refuses():
    from offsetlake.airflow.forms import maintenance_args

    cfg = CFG
    args = maintenance_args(
        cfg,
        {
            "optimize": True,
            "vacuum": False,
            "checkpoint": True,
            "vacuum_retention_hours": 48,
            "target_file_mb": 64,
            "zorder_by": ["kafka_offset"],
        },
    )
    assert args == {
        "optimize": "true",
        "vacuum": "false",
        "checkpoint": "true",
        "retention_hours": "48",
        "target_file_mb": "64",
        "zorder_by": "kafka_offset",
    }
    for bad, why in [
        ({"vacuum_retention_hours": 0}, "vacuum_retention_hours"),
        ({"zorder_by": ["kafka_nope"]}, "zorder_by"),
        ({"optimize": "yes"}, "optimize"),
        ({"optimize": False, "vacuum": False, "checkpoint": False}, "nothing"),
    ]:
        with pytest.raises(ConfigError, match=why):
            maintenance_args(cfg, bad)


def per_topic_cfg():
    doc = {
        "name": "p",
        "topics": ["^pg\\.shop\\."],
        "kafka": {"bootstrap_servers": "x:1"},
        "table": {"path": "/lake/{table}"},
        "format": {"type": "raw"},
    }
    return parse_pipeline(doc, "p.yaml")


class ShopCluster:
    def topic_names(self):
        return ["pg.shop.customers", "pg.shop.orders"]

    def partitions(self, topics):
        return [(t, p) for t in topics for p in range(2)]


def test_a_per_topic_pipelines_forms_name_a_table_or_take_every_one():
    cfg, cluster = per_topic_cfg(), ShopCluster()

    assert form_tables(cfg, {}, cluster) == ["customers", "orders"]
    assert form_tables(cfg, {"table": "orders"}, cluster) == ["orders"]
    with pytest.raises(ConfigError, match=r"table: name the table .*customers, orders"):
        form_tables(cfg, {}, cluster, one=True)
    with pytest.raises(ConfigError, match="has no such table"):
        form_tables(cfg, {"table": "refunds"}, cluster)
    with pytest.raises(ConfigError, match="table must be a table's name"):
        form_tables(cfg, {"table": "../etc"}, cluster)
    assert form_tables(CFG, {}, cluster) == []
    with pytest.raises(ConfigError, match="writes one table; leave table empty"):
        form_tables(CFG, {"table": "orders"}, cluster)

    ranges = {"ranges": [{"topic": "pg.shop.orders", "partition": 1, "start": 0, "end": 5}]}
    assert backfill_ranges(cfg, {**ranges, "table": "orders"}, cluster) == "pg.shop.orders:1:0-5"
    with pytest.raises(ConfigError, match="is not one of the pipeline's topics"):
        backfill_ranges(cfg, {**ranges, "table": "customers"}, cluster)
