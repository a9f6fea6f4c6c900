"""One pipeline, a table per topic, on the real broker: a topic pattern and `table.path` with `{table}`.
Each table is checked row by row against what Kafka holds (the oracle, per topic); a topic created later
gets its table at the next run; a table that fails does not stop the others; status, history and audit
list or select the tables.

The commands run in this process (`offsetlake.cli.main`, the `offsetlake` fixture of conftest.py) with the
test session's Spark: the JVM of the worker, not one per command. Everything else (Kafka, Delta, the
ledger) is the product's own path."""

from __future__ import annotations

import json
import logging
import re
import threading
import time

from deltalake import DeltaTable

from offsetlake.config.topic_tables import for_topic
from oracle import assert_exactly_once, read_with_delta_rs
from support import create_topic, load, produce, unique, write_per_topic_pipeline, write_pipeline


def test_a_pattern_with_a_table_per_topic_ingests_each_topic_exactly_once(
    offsetlake, bootstrap, pipelines_dir, lake, caplog
):
    prefix = unique("db")
    for table in ("a", "b"):
        create_topic(bootstrap, f"{prefix}.s.{table}", 2)
    unrelated = f"{prefix}.x.z"
    create_topic(bootstrap, unrelated, 1)
    name = write_per_topic_pipeline(pipelines_dir, bootstrap, f"{prefix}.s", lake)
    cfg = load(pipelines_dir, name)
    for table, records in (("a", 300), ("b", 150)):
        produce(cfg.kafka, f"{prefix}.s.{table}", records, transactional_share=0.5, abort_share=0.2, seed=7)
    produce(cfg.kafka, unrelated, 20, seed=1)
    where = ("--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    code, out, err = offsetlake("ingest", *where)

    assert code == 0, err
    assert re.search(r"^a: batch \d+: committed", out, re.M) and re.search(r"^b: batch \d+: committed", out, re.M), out
    assert sorted(p.name for p in lake.iterdir()) == ["a", "b"]  # nothing of the unrelated topic
    for table in ("a", "b"):
        assert_exactly_once(for_topic(cfg, f"{prefix}.s.{table}"))

    # A topic created later that matches: the next run gives it a table. One whose table path is taken
    # by a plain file fails alone, in one line naming it; the others commit.
    create_topic(bootstrap, f"{prefix}.s.c", 3)
    produce(cfg.kafka, f"{prefix}.s.c", 200, transactional_share=0.5, abort_share=0.2, seed=8)
    create_topic(bootstrap, f"{prefix}.s.d", 1)
    produce(cfg.kafka, f"{prefix}.s.d", 40, seed=9)
    produce(cfg.kafka, f"{prefix}.s.a", 50, seed=10)
    (lake / "d").write_text("not a table")

    code, out, err = offsetlake("ingest", *where)

    assert code == 1
    assert err.strip().splitlines()[-1].startswith("offsetlake: error: ingest failed for 1 of 4 tables: d ("), err
    for table in ("a", "b", "c"):
        assert_exactly_once(for_topic(cfg, f"{prefix}.s.{table}"))

    (lake / "d").unlink()
    code, out, err = offsetlake("ingest", *where, "--table", "d")
    assert code == 0, err
    assert_exactly_once(for_topic(cfg, f"{prefix}.s.d"))

    code, out, _ = offsetlake("status", *where, "--json")
    rows = json.loads(out)
    assert {r["table"] for r in rows} == {"a", "b", "c", "d"} and all(r["lag"] == 0 for r in rows)
    assert sum(1 for r in rows if r["table"] == "c") == 3  # one row per partition of its topic

    code, out, err = offsetlake("audit", *where)
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("== ")] == [
        f"== {name}/{t}: {lake / t}" for t in ("a", "b", "c", "d")
    ]

    code, out, _ = offsetlake("history", *where, "--table", "a", "--json")
    entries = json.loads(out)
    assert len(entries) >= 2 and {e["table"] for e in entries} == {"a"}

    # A stream lists the topics again each round: a topic created while it runs gets its table. A table
    # that fails (a new topic whose table path is a plain file) is tried each round while the others go on.
    create_topic(bootstrap, f"{prefix}.s.f", 1)
    produce(cfg.kafka, f"{prefix}.s.f", 10, seed=12)
    (lake / "f").write_text("not a table")
    produce(cfg.kafka, f"{prefix}.s.a", 20, seed=13)

    def later_topic():
        time.sleep(2)
        create_topic(bootstrap, f"{prefix}.s.e", 1)
        produce(cfg.kafka, f"{prefix}.s.e", 30, seed=11)

    creator = threading.Thread(target=later_topic)
    creator.start()
    with caplog.at_level(logging.WARNING, logger="offsetlake"):
        code, out, err = offsetlake("stream", *where, "--interval", "0.5", "--max-seconds", "10")
    creator.join()
    assert code == 0, err
    assert f"f: failed: table {lake / 'f'} is a file, not a directory" in err
    for table in ("a", "e"):
        assert_exactly_once(for_topic(cfg, f"{prefix}.s.{table}"))
    failures = [r.getMessage() for r in caplog.records if "failed (tried again next round)" in r.getMessage()]
    assert len(failures) >= 2 and all("table f failed" in m for m in failures), failures


def test_commands_on_one_table_refuse_in_one_line_without_it(offsetlake, bootstrap, pipelines_dir, lake):
    prefix = unique("db")
    for table in ("a", "b"):
        create_topic(bootstrap, f"{prefix}.{table}", 1)
    name = write_per_topic_pipeline(pipelines_dir, bootstrap, prefix, lake)
    where = ("--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    for args, expected in (
        (("backfill", "--ranges", f"{prefix}.a:0:0-1"), "name one with --table (its tables: a, b)"),
        (("status", "--table", "c"), f"--table 'c': pipeline '{name}' has no such table (its tables: a, b)"),
        (("audit", "--ranges", f"{prefix}.a:0:0-1"), "--ranges: name the table they are in with --table"),
    ):
        code, out, err = offsetlake(*args, *where)
        assert code == 1 and len(err.strip().splitlines()) == 1 and expected in err, (args, err)
    assert not lake.exists()  # nothing written

    single = write_pipeline(pipelines_dir, bootstrap, [f"{prefix}.a"], lake)
    code, _, err = offsetlake("status", "--pipeline", single, "--pipelines-dir", str(pipelines_dir), "--table", "a")
    assert code == 1 and "writes one table" in err and "--table is for a table.path with {table}" in err


def test_tables_of_one_pipeline_upsert_on_their_own_keys(offsetlake, bootstrap, pipelines_dir, lake):
    """`write.keys` gives a table its own key; the others take `write.key`. Each table is checked against
    the fold of what Kafka holds on the key the test expects of it."""
    prefix = unique("db")
    for table in ("by_user", "by_event"):
        create_topic(bootstrap, f"{prefix}.{table}", 1)  # one partition: a user's records keep their order
    upsert = {"mode": "upsert", "key": ["user_id"], "keys": {"by_event": ["event_id"]}}
    name = write_per_topic_pipeline(pipelines_dir, bootstrap, prefix, lake, write=upsert)
    cfg = load(pipelines_dir, name)
    for table in ("by_user", "by_event"):
        produce(cfg.kafka, f"{prefix}.{table}", 400, transactional_share=0.5, abort_share=0.2, seed=12)

    code, out, err = offsetlake("ingest", "--pipeline", name, "--pipelines-dir", str(pipelines_dir))

    assert code == 0, err
    by_user, by_event = for_topic(cfg, f"{prefix}.by_user"), for_topic(cfg, f"{prefix}.by_event")
    assert (by_user.write.key, by_event.write.key) == (["user_id"], ["event_id"])
    for one in (by_user, by_event):
        assert_exactly_once(one)
    users = read_with_delta_rs(by_user.table_location).column("user_id").to_pylist()
    events = read_with_delta_rs(by_event.table_location).column("event_id").to_pylist()
    assert len(users) == len(set(users)) < len(events) == len(set(events))  # the same records, other keys

    # The Prometheus endpoint's text: each table labelled `pipeline/table`, caught up, with its own rows.
    from prometheus_client.parser import text_string_to_metric_families

    from offsetlake.airflow.metrics import CommitTotals, prometheus_text

    text = prometheus_text([cfg], CommitTotals()).decode()
    samples = {
        (s.name, s.labels.get("pipeline")): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }
    for one in (by_user, by_event):
        label = f"{name}/{one.topics[0].rsplit('.', 1)[-1]}"
        assert samples[("offsetlake_up", label)] == 1 and samples[("offsetlake_pipeline_lag_records", label)] == 0
        assert samples[("offsetlake_table_version", label)] == DeltaTable(one.table_path).version(), label
        assert samples[("offsetlake_alert_max_quarantine_share", label)] == cfg.alerts.max_quarantine_share, label
        newest_ingest = max(e["timestamp"] for e in DeltaTable(one.table_path).history() if "userMetadata" in e)
        assert samples[("offsetlake_last_ingest_timestamp_seconds", label)] == newest_ingest / 1000, label


def test_a_stream_started_before_any_topic_matches_waits_for_one(offsetlake, bootstrap, pipelines_dir, lake):
    """A connector creates its topics with its first events, so a stream started beside it may list the
    topics before any matches: it waits, saying so once, and reads the first topic that comes. A run that
    is not a stream is refused in one line, as a pattern naming nothing should be."""
    prefix = unique("later")
    name = write_per_topic_pipeline(pipelines_dir, bootstrap, f"{prefix}.s", lake)
    cfg = load(pipelines_dir, name)
    where = ("--pipeline", name, "--pipelines-dir", str(pipelines_dir))
    refusal = f"pipeline {name!r}: topics {cfg.topics[0]!r} match no topic in Kafka"

    code, _, err = offsetlake("ingest", *where)

    assert code != 0 and err.strip().splitlines()[-1] == f"offsetlake: error: {refusal}", err
    assert not lake.exists() or not any(lake.iterdir())

    def first_topic():
        time.sleep(3)
        create_topic(bootstrap, f"{prefix}.s.a", 2)
        produce(cfg.kafka, f"{prefix}.s.a", 120, transactional_share=0.5, abort_share=0.2, seed=14)

    creator = threading.Thread(target=first_topic)
    creator.start()
    code, out, err = offsetlake("stream", *where, "--interval", "0.5", "--max-seconds", "15")
    creator.join()

    assert code == 0, err
    assert err.count(refusal) == 1 and "the stream waits for one (listed every 0.5 s)" in err, err
    assert re.search(r"^a: batch \d+: committed", out, re.M), out
    assert_exactly_once(for_topic(cfg, f"{prefix}.s.a"))
