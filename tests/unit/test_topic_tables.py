"""A pipeline's tables from its topics (offsetlake.config.topic_tables): patterns, a table per topic, and the
one-line refusals. Pure: the cluster's topic list is given."""

import logging
import threading

import pytest

from offsetlake.config import parse_pipeline
from offsetlake.config.topic_tables import only_table, resolve, select, table_path
from offsetlake.errors import ConfigError
from offsetlake.runs import first_tables
from offsetlake.streaming import TopicListing

CLUSTER = ["pg.shop.orders", "pg.shop.customers", "pg.shop.heartbeat", "pg.crm.orders", "__consumer_offsets"]


def pipeline(**overrides):
    doc = {
        "name": "shop",
        "topics": ["^pg\\.shop\\."],
        "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
        "table": {"path": "/lake/shop/{table}"},
        "format": {"type": "json", "schema": [{"name": "id", "type": "long"}]},
        **overrides,
    }
    return parse_pipeline(doc, "shop.yaml")


def error_for(call) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_pattern_with_a_table_path_template_gives_a_table_and_quarantine_per_topic():
    tables = resolve(pipeline(), CLUSTER)

    assert [(t.name, t.cfg.topics, t.cfg.table_path, t.cfg.quarantine_path) for t in tables] == [
        ("customers", ["pg.shop.customers"], "/lake/shop/customers", "/lake/shop/customers_quarantine"),
        ("heartbeat", ["pg.shop.heartbeat"], "/lake/shop/heartbeat", "/lake/shop/heartbeat_quarantine"),
        ("orders", ["pg.shop.orders"], "/lake/shop/orders", "/lake/shop/orders_quarantine"),
    ]
    assert [t.label for t in tables][0] == "shop/customers"
    assert {t.cfg.name for t in tables} == {"shop"}  # one pipeline: its name keys each table's ledger


def test_a_negative_lookahead_leaves_a_topic_out_and_named_topics_join_the_matches():
    cfg = pipeline(topics=["^pg\\.shop\\.(?!heartbeat$)", "pg.crm.orders"], table={"path": "/lake/{topic}"})

    tables = resolve(cfg, CLUSTER)

    assert [t.name for t in tables] == ["pg.shop.customers", "pg.shop.orders", "pg.crm.orders"]
    assert tables[2].cfg.table_path == "/lake/pg.crm.orders"


def test_a_pattern_into_one_table_reads_every_matching_topic_and_never_an_internal_one():
    cfg = pipeline(topics=["^pg\\.", "^__"], table={"path": "/lake/all"})

    (table,) = resolve(cfg, CLUSTER)

    assert table.name is None and table.cfg.table_path == "/lake/all"
    assert table.cfg.topics == ["pg.crm.orders", "pg.shop.customers", "pg.shop.heartbeat", "pg.shop.orders"]


def test_a_later_topic_that_matches_gets_its_table_at_the_next_resolution():
    cfg = pipeline()
    before = [t.name for t in resolve(cfg, CLUSTER)]

    after = [t.name for t in resolve(cfg, [*CLUSTER, "pg.shop.refunds"])]

    assert after == [*before, "refunds"]


def test_refusals_name_what_was_wrong():
    assert "match no topic in Kafka" in error_for(lambda: resolve(pipeline(topics=["^nothing\\."]), CLUSTER))
    clash = error_for(lambda: resolve(pipeline(topics=["^pg\\."]), CLUSTER))
    assert "'pg.crm.orders' and 'pg.shop.orders' both give table 'orders'" in clash and "{topic}" in clash
    tables = resolve(pipeline(), CLUSTER)
    assert "has no such table (its tables: customers, heartbeat, orders)" in error_for(
        lambda: select(tables, pipeline(), "refund")
    )
    one = pipeline(topics=["pg.shop.orders"], table={"path": "/lake/orders"})
    assert "writes one table (/lake/orders)" in error_for(lambda: select(resolve(one, CLUSTER), one, "orders"))


def test_a_stream_waits_for_its_first_matching_topic_and_says_so_once():
    cfg = pipeline()
    listings = [[], ["pg.crm.orders"], [], CLUSTER]  # what the cluster holds at each listing
    said: list[str] = []

    tables = first_tables(lambda: resolve(cfg, listings.pop(0)), threading.Event(), 0.01, said.append)

    assert [t.name for t in tables] == ["customers", "heartbeat", "orders"] and not listings
    assert said == [
        "pipeline 'shop': topics '^pg\\\\.shop\\\\.' match no topic in Kafka;"
        " the stream waits for one (listed every 0.01 s)"
    ]


def test_a_stream_that_never_sees_a_matching_topic_stops_when_told_and_other_refusals_are_raised():
    cfg = pipeline()
    stopped = threading.Event()
    stopped.set()
    assert first_tables(lambda: resolve(cfg, []), stopped, 60, lambda _: None) == []
    assert first_tables(lambda: resolve(cfg, []), threading.Event(), 60, lambda _: None, max_seconds=0.05) == []
    clash = pipeline(topics=["^pg\\."])
    assert "both give table 'orders'" in error_for(
        lambda: first_tables(lambda: resolve(clash, CLUSTER), threading.Event(), 60, lambda _: None)
    )


def test_a_command_on_one_table_needs_the_table_named_only_for_a_per_topic_pipeline():
    class Cluster:
        def topic_names(self):
            return CLUSTER

    assert only_table(pipeline(), "orders", Cluster().topic_names).topics == ["pg.shop.orders"]
    assert "name one with --table (its tables: customers, heartbeat, orders)" in error_for(
        lambda: only_table(pipeline(), None, Cluster().topic_names)
    )
    one = pipeline(topics=["pg.shop.orders"], table={"path": "/lake/orders"})

    def no_kafka() -> list[str]:
        raise AssertionError("a pipeline that names its topics and writes one table asked Kafka")

    assert only_table(one, None, no_kafka) is one


def test_a_table_path_is_known_from_the_name_alone():
    assert table_path(pipeline(), "orders") == "/lake/shop/orders"
    on_s3 = {"path": "s3://b/{topic}", "storage_options": {"conditional_put": "etag"}}
    assert table_path(pipeline(table=on_s3), "pg.shop.orders") == "s3://b/pg.shop.orders"


def test_each_table_takes_its_key_from_write_keys_or_else_write_key():
    schema = [{"name": n, "type": "long"} for n in ("id", "order_id", "line_no")]
    upsert = {"mode": "upsert", "key": ["id"], "keys": {"orders": ["order_id", "line_no"]}}
    tables = resolve(pipeline(format={"type": "json", "schema": schema}, write=upsert), CLUSTER)

    assert {t.name: t.cfg.write.key for t in tables} == {
        "customers": ["id"],
        "heartbeat": ["id"],
        "orders": ["order_id", "line_no"],
    }
    assert all(t.cfg.write.keys == {} for t in tables)  # a table's pipeline is a plain single-table one


def test_a_table_without_a_key_is_refused_naming_it_and_where_to_give_one():
    schema = [{"name": n, "type": "long"} for n in ("id", "order_id")]
    only_orders = {"mode": "upsert", "keys": {"orders": ["order_id"]}}
    cfg = pipeline(format={"type": "json", "schema": schema}, write=only_orders)

    assert [t.name for t in resolve(cfg, ["pg.shop.orders"])] == ["orders"]
    assert error_for(lambda: resolve(cfg, CLUSTER)) == (
        "pipeline 'shop': table 'customers' (topic 'pg.shop.customers') has no key: give write.key "
        "(every table's) or write.keys.customers"
    )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            {"table": {"path": "/lake/one"}, "write": {"mode": "upsert", "keys": {"orders": ["id"]}}},
            "this pipeline writes one table (/lake/one): use write.key",
        ),
        ({"write": {"mode": "upsert", "keys": {"orders": ["nope"]}}}, "write column 'nope' is not a column"),
        ({"write": {"mode": "upsert", "keys": {"orders": []}}}, "write.keys.orders is empty"),
        ({"write": {"mode": "upsert", "keys": {"orders": ["id", "id"]}}}, "write.keys.orders lists a column twice"),
        ({"write": {"keys": {"orders": ["id"]}}}, "write.key, write.keys and write.order_by are for"),
        ({"table": {"path": "/lake/{tabel}"}}, "unknown placeholder {tabel}: use {table} or {topic}"),
        ({"table": {"path": "/lake/{table"}}, "braces are only for the placeholders {table} and {topic}"),
        ({"table": {"path": "/lake/{{x}}"}}, "braces are only for the placeholders"),
        ({"topics": ["^pg\\.(shop"]}, "is not a valid regular expression"),
        ({"quarantine": {"path": "/lake/q"}}, "both or neither hold {table}/{topic}"),
    ],
)
def test_the_pipeline_file_is_refused_in_one_line(overrides, expected):
    assert expected in error_for(lambda: pipeline(**overrides))


def test_a_stream_whose_every_topic_is_deleted_runs_empty_rounds_and_says_so_once(caplog):
    cfg = pipeline()
    listings = [CLUSTER, [], [], ["pg.shop.orders"], []]
    listing = TopicListing("shop", lambda: resolve(cfg, listings.pop(0)))

    with caplog.at_level(logging.WARNING, logger="offsetlake"):
        rounds = [[name for name, _ in listing.round()] for _ in range(5)]

    assert rounds == [["customers", "heartbeat", "orders"], [], [], ["orders"], []]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all(w.endswith("match no topic in Kafka; waiting for one") for w in warnings)
