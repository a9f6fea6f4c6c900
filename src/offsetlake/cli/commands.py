"""The `offsetlake` command's commands: each turns its arguments into library calls and prints their lines."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offsetlake import runs
from offsetlake.config import PipelineConfig, load_pipeline
from offsetlake.errors import ConfigError, OffsetlakeError
from offsetlake.protocol.metadata import Run

if TYPE_CHECKING:
    from collections.abc import Callable

    from offsetlake.config.topic_tables import PipelineTable


def _loaded(args: argparse.Namespace) -> PipelineConfig:
    """The pipeline as its file says (topic patterns, a table path per topic), with its Airflow connections
    (kafka.connection, format.registry.connection) applied: handed over by the operator's task
    (offsetlake.config.connections), or read through Airflow where it runs."""
    from offsetlake.config.connections import resolve_connections

    return resolve_connections(load_pipeline(args.pipeline, args.pipelines_dir))


def _pipeline(args: argparse.Namespace) -> PipelineConfig:
    """The one table the command acts on, as a single-table pipeline (`--table` of a per-topic pipeline)."""
    return runs.one_table(_loaded(args), args.table)


def _pipeline_tables(
    args: argparse.Namespace, topic_names: Callable[[], list[str]] | None = None
) -> list[PipelineTable]:
    """The tables a command that takes all of them acts on: the pipeline's (as of the cluster's topics
    now), or `--table`'s."""
    return runs.tables_of(_loaded(args), args.table, topic_names)


def _heading(table: PipelineTable) -> str | None:
    """A line above each table's part of the output, when a command covers several."""
    return f"== {table.label}: {table.cfg.table_path}" if table.name is not None else None


def _print_each_table(args: argparse.Namespace, rows_of, text_of) -> None:
    """`status` and `history`: each table's rows (`rows_of(cfg)`), as JSON rows naming their table, or as
    text (`text_of(rows)`) under a heading per table."""
    out: list[Any] = []  # JSON rows, or lines of text
    for table in _pipeline_tables(args):
        rows = rows_of(table.cfg)
        if args.json:
            out.extend({**r.as_dict(), **_table_field(table)} for r in rows)
        else:
            out.extend(filter(None, [_heading(table), text_of(rows)]))
    print(json.dumps(out) if args.json else "\n".join(out))


def cmd_status(args: argparse.Namespace) -> int:
    from offsetlake.operations.status import format_status, status

    _print_each_table(args, status, format_status)
    return 0


def _table_field(table: PipelineTable) -> dict:
    """JSON output of a per-topic pipeline: each row names its table."""
    return {} if table.name is None else {"table": table.name}


def cmd_history(args: argparse.Namespace) -> int:
    from offsetlake.operations.status import format_history, history

    _print_each_table(args, lambda cfg: history(cfg, args.limit), format_history)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from offsetlake.table import query

    cfg = _pipeline(args)
    total = query(cfg.table_location, "SELECT count(*) AS n FROM t").column(0)[0].as_py()
    print(f"{cfg.table_path}: {total} rows")
    sample = query(cfg.table_location, f"SELECT * FROM t ORDER BY kafka_timestamp DESC LIMIT {args.limit}")
    for row in sample.to_pylist():
        print("  " + json.dumps(row, default=str))
    return 0


def _run(args: argparse.Namespace) -> Run:
    return Run.here(args.dag_id, args.run_id, args.try_number)


def spark_session(args: argparse.Namespace) -> runs.SparkFactory:
    """`runs.spark_session` on the command's `--master`: what a run that needs Spark is given."""
    return lambda cfg, job: runs.spark_session(cfg, job, args.master)


def _say(line: str) -> None:
    print(line, flush=True)


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cmd_ingest(args: argparse.Namespace) -> int:
    """Every table in one Spark session, a few at a time (runs.ingest_tables)."""
    from offsetlake.spark.session import startup_report

    tables = _pipeline_tables(args)
    with spark_session(args)(tables[0].cfg, "ingest") as spark:  # under spark-submit it starts while Kafka is checked
        results = runs.ingest_tables(spark, tables, _run(args), _say, _warn)
        report = startup_report(spark.ready_at, runs.first_spark_job(results))
    if report:
        _say(report)
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # finish the batch in flight, then leave

    from offsetlake.kafka import KafkaCluster

    loaded = _loaded(args)
    # One client lists the cluster's topics before every round (a new one each round costs the broker more).
    topics = KafkaCluster(loaded.kafka)

    def current_tables() -> list[PipelineTable]:
        return _pipeline_tables(args, topics.topic_names)

    started = time.monotonic()
    interval = args.interval or loaded.stream_interval_seconds
    try:
        tables = runs.first_tables(current_tables, stop, interval, _warn, args.max_seconds)
        n = 0
        if tables:
            # What --max-seconds leaves after the wait (at least one round).
            left = max(args.max_seconds - (time.monotonic() - started), 1e-3) if args.max_seconds else None
            # Under spark-submit the session starts while Kafka is checked.
            with spark_session(args)(tables[0].cfg, "stream") as spark:
                n = runs.stream_tables(spark, current_tables, stop, interval, _run(args), _warn, max_seconds=left)
    finally:
        topics.close()
    _say(f"stream stopped after {n} committed batches")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from offsetlake.kafka import KafkaCluster
    from offsetlake.operations.backfill import backfill, parse_ranges, ranges_for_time_window

    cfg = _pipeline(args)
    runs.check_reachable(cfg)
    if args.ranges:
        ranges = parse_ranges(args.ranges)
    else:
        if args.time_to is None:
            raise ConfigError("--from needs --to")
        ranges = ranges_for_time_window(cfg, KafkaCluster(cfg.kafka), args.time_from, args.time_to)
        if not ranges:
            print("no records in that time window")
            return 0
    with spark_session(args)(cfg, "backfill") as spark:
        print(backfill(spark, cfg, ranges, _run(args), dry_run=args.dry_run).summary(), flush=True)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from offsetlake.operations.audit import audit
    from offsetlake.operations.backfill import parse_ranges

    tables = _pipeline_tables(args)
    if args.ranges and len(tables) > 1:
        raise ConfigError("--ranges: name the table they are in with --table")
    out: list[Any] = []  # JSON reports, or lines of text
    bad: list[str] = []
    for table in tables:
        cfg = table.cfg
        with spark_session(args)(cfg, "audit") as spark:  # started only to read a delta-spark engine's table
            report = audit(cfg, parse_ranges(args.ranges) if args.ranges else None, spark)
        if args.json:
            out.append({**report.as_dict(), **_table_field(table)})
        else:
            out.extend(filter(None, [_heading(table), report.format()]))
        if not report.ok:
            bad.append(
                f"{report.problem_count()} {runs.problems(cfg)} and "
                f"{len(report.continuity) + len(report.sanity)} ledger issues in {table.label}"
            )
    print(json.dumps(out[0] if len(tables) == 1 and tables[0].name is None else out) if args.json else "\n".join(out))
    if bad:
        raise OffsetlakeError(f"audit found {'; '.join(bad)}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    runs.check_reachable(cfg)
    runs.repair(spark_session(args), cfg, _run(args), _say, args.dry_run)
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    runs.cleanup(_pipeline(args), args.older_than, args.dry_run, _say)
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    runs.reset(_pipeline(args), args.offsets, args.reason, _run(args), _say)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    with spark_session(args)(cfg, "restore") as spark:  # used on the delta-spark engine only
        version = runs.restore(cfg, args.version, _run(args), spark)
    print(f"table restored to version {args.version} with its ledger, as table version {version}")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    with spark_session(args)(cfg, "optimize") as spark:  # used on the delta-spark engine only
        runs.optimize(cfg, _run(args), _say, args.target_file_mb, args.zorder_by, spark)
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    with spark_session(args)(cfg, "vacuum") as spark:
        runs.vacuum(cfg, args.retention_hours, args.dry_run, _run(args), _say, spark)
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    with spark_session(args)(cfg, "checkpoint") as spark:
        runs.checkpoint(cfg, _say, spark)
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    cfg = _pipeline(args)
    with spark_session(args)(cfg, "maintain") as spark:
        runs.maintain(
            cfg,
            _run(args),
            _say,
            compact=args.optimize,
            vacuum_files=args.vacuum,
            checkpoint_log=args.checkpoint,
            target_file_mb=args.target_file_mb,
            zorder_by=args.zorder_by,
            retention_hours=args.retention_hours,
            spark=spark,
        )
    return 0


def cmd_recover(args: argparse.Namespace) -> int:
    runs.recover(
        spark_session(args),
        _pipeline(args),
        _run(args),
        _say,
        reset_offsets=args.reset_offsets,
        reason=args.reason,
        repair_damage=args.repair,
        clean_up=args.cleanup,
        older_than=args.older_than,
    )
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from offsetlake.config.topic_tables import for_topic, matching_topics, per_topic
    from offsetlake_local.producer import demo_event, ensure_topic, keyed, produce

    cfg = _loaded(args)  # the topic may not exist yet: produce creates it
    topic = args.topic or cfg.topics[0]
    if topic.startswith("^"):
        raise ConfigError(f"--topic: pipeline {cfg.name!r} reads topics by pattern ({topic}); name one")
    if topic not in matching_topics(cfg, [topic]):
        raise ConfigError(f"--topic {topic!r} is not one of pipeline {cfg.name!r}'s topics: {cfg.topics}")
    if per_topic(cfg):
        cfg = for_topic(cfg, topic)
    ensure_topic(cfg.kafka, topic, args.partitions)
    make_record = _demo_records(cfg, topic, args.schema_version)
    if args.keys:
        make_record = keyed(make_record or demo_event, args.keys, args.tombstone_share)
    elif args.tombstone_share:
        raise ConfigError("--tombstone-share needs --keys: a tombstone deletes a key")
    stop = threading.Event()
    if args.every:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while True:
        report = produce(
            cfg.kafka,
            topic,
            args.count,
            transactional_share=args.transactional_share,
            abort_share=args.abort_share,
            seed=args.seed,
            bad_share=args.bad_share,
            **({"make_record": make_record} if make_record else {}),
        )
        print(report, flush=True)
        if not args.every or stop.wait(args.every):
            return 0


def _demo_records(cfg: PipelineConfig, topic: str, schema_version: int):
    """The record maker for the pipeline's format: None (JSON events) or Avro events through its registry."""
    fmt = cfg.format
    if fmt.type == "json":
        return None
    if fmt.type != "avro" or fmt.registry is None:
        raise ConfigError(f"produce writes demo events as json or as avro through a registry, not {fmt.type!r}")
    from offsetlake_local.producer import avro_event_maker, registry_client

    reg = fmt.registry
    if reg is None or reg.url is None:
        raise ConfigError(f"produce writes {fmt.type} through format.registry.url; pipeline {cfg.name!r} has none")
    client = registry_client(
        reg.url,
        reg.username.get_secret_value() if reg.username else None,
        reg.password.get_secret_value() if reg.password else None,
    )
    return avro_event_maker(client, topic, schema_version, headers=fmt.include_headers)


def cmd_broker(args: argparse.Namespace) -> int:
    from offsetlake_local import broker

    if args.action == "stop":
        stopped = broker.stop_from_pid_file(args.pid_file)
        print("broker stopped" if stopped else "broker was not running")
        return 0
    pid_file = Path(args.pid_file)
    running = broker.running_from_pid_file(pid_file)
    if running:
        print(f"broker already running (pid {running}) on 127.0.0.1:{args.port}")
        return 0
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    b = broker.start(args.data_dir, args.port, pid_file=pid_file)
    print(f"broker running: pid {b.pid}, bootstrap servers {b.bootstrap_servers}, data in {b.data_dir}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(pipeline_json_schema(), indent=2))
    return 0


MONITORING_FILES = {"rules": "offsetlake-rules.yml", "dashboard": "offsetlake-dashboard.json"}


def cmd_monitoring(args: argparse.Namespace) -> int:
    from importlib.resources import files

    print((files("offsetlake.airflow") / "monitoring" / MONITORING_FILES[args.what]).read_text(), end="")
    return 0


def pipeline_json_schema() -> dict:
    """The pipeline file's JSON Schema, generated from the models that read it (offsetlake.config). An editor checks
    the file before `${VAR}` references are substituted, so a string holding one passes any pattern."""
    schema = PipelineConfig.model_json_schema(by_alias=True)
    _allow_references(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "offsetlake pipeline"}


def _allow_references(node) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = f"(?:{node['pattern']})|\\$\\{{"
        for value in node.values():
            _allow_references(value)
    elif isinstance(node, list):
        for value in node:
            _allow_references(value)


COMMANDS = {
    "schema": cmd_schema,
    "status": cmd_status,
    "history": cmd_history,
    "show": cmd_show,
    "backfill": cmd_backfill,
    "audit": cmd_audit,
    "repair": cmd_repair,
    "cleanup": cmd_cleanup,
    "reset": cmd_reset,
    "restore": cmd_restore,
    "recover": cmd_recover,
    "optimize": cmd_optimize,
    "vacuum": cmd_vacuum,
    "checkpoint": cmd_checkpoint,
    "maintain": cmd_maintain,
    "ingest": cmd_ingest,
    "stream": cmd_stream,
    "produce": cmd_produce,
    "monitoring": cmd_monitoring,
    "broker": cmd_broker,
}
