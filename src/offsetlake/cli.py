"""The `offsetlake` command. Exit 0 on success; on failure one line on stderr and a non-zero exit."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offsetlake.cli_arguments import build_parser
from offsetlake.config import PipelineConfig, load_pipeline
from offsetlake.errors import ConfigError, OffsetlakeError, one_line
from offsetlake.protocol.metadata import Run

if TYPE_CHECKING:
    from offsetlake.topic_tables import PipelineTable

EXIT_FAILED = 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # `kill -USR1 <pid>` prints every thread's Python stack to stderr: where a job that seems stuck waits.
    with contextlib.suppress(ValueError, OSError):  # OSError: a stderr with no file behind it (in-process)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    logging.getLogger("offsetlake.librdkafka").setLevel(logging.CRITICAL)
    try:
        return COMMANDS[args.command](args) or 0
    except OffsetlakeError as err:
        print(f"offsetlake: error: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("offsetlake: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # still one line; the traceback only when asked for
        if os.environ.get("OFFSETLAKE_DEBUG"):
            raise
        print(f"offsetlake: error: {type(err).__name__}: {one_line(err)}", file=sys.stderr)
        return EXIT_FAILED


def _loaded(args) -> PipelineConfig:
    """The pipeline as its file says (topic patterns, a table path per topic), with its Airflow connections
    (kafka.connection, format.registry.connection) applied: handed over by the operator's task
    (offsetlake.connections), or read through Airflow where it runs."""
    from offsetlake.connections import resolve_connections

    return resolve_connections(load_pipeline(args.pipeline, args.pipelines_dir))


def _pipeline(args) -> PipelineConfig:
    """The one table the command acts on, as a single-table pipeline (`--table` of a per-topic pipeline)."""
    from offsetlake.topic_tables import only_table

    return only_table(_loaded(args), args.table)


def _pipeline_tables(args) -> list[PipelineTable]:
    """The tables a command that takes all of them acts on: the pipeline's (as of the cluster's topics
    now), or `--table`'s."""
    from offsetlake.topic_tables import pipeline_tables, select

    cfg = _loaded(args)
    return select(pipeline_tables(cfg), cfg, args.table)


def _heading(table: PipelineTable) -> str | None:
    """A line above each table's part of the output, when a command covers several."""
    return f"== {table.label}: {table.cfg.table_path}" if table.name is not None else None


def _print_each_table(args, rows_of, text_of) -> None:
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


def cmd_status(args) -> int:
    from offsetlake.operations.status import format_status, status

    _print_each_table(args, status, format_status)
    return 0


def _table_field(table: PipelineTable) -> dict:
    """JSON output of a per-topic pipeline: each row names its table."""
    return {} if table.name is None else {"table": table.name}


def cmd_history(args) -> int:
    from offsetlake.operations.status import format_history, history

    _print_each_table(args, lambda cfg: history(cfg, args.limit), format_history)
    return 0


def cmd_show(args) -> int:
    from offsetlake.table import query

    cfg = _pipeline(args)
    total = query(cfg.table_path, "SELECT count(*) AS n FROM t").column(0)[0].as_py()
    print(f"{cfg.table_path}: {total} rows")
    sample = query(cfg.table_path, f"SELECT * FROM t ORDER BY kafka_timestamp DESC LIMIT {args.limit}")
    for row in sample.to_pylist():
        print("  " + json.dumps(row, default=str))
    return 0


def _run(args) -> Run:
    return Run.here(args.dag_id, args.run_id, args.try_number)


@contextmanager
def _spark(args, cfg: PipelineConfig, job: str):
    """A Spark session started on first use (a run with nothing to do starts no JVM), always stopped.
    Under spark-submit, whose JVM runs already, it starts while the command plans (start_early)."""
    from offsetlake.spark.session import LazySession

    spark = LazySession(f"offsetlake-{job}-{cfg.name}", args.master)
    spark.start_early()
    try:
        yield spark
    finally:
        spark.stop()


def cmd_ingest(args) -> int:
    """Each table in turn in one Spark session. A table that fails does not stop the others; the command
    fails afterwards, naming each failed table and why."""
    from offsetlake.batch import ingest
    from offsetlake.spark.session import startup_report

    tables = _pipeline_tables(args)
    first_job = None
    failed: list[str] = []
    with _spark(args, tables[0].cfg, "ingest") as spark:  # under spark-submit it starts while Kafka is checked
        for table in tables:
            try:
                _check_reachable(table.cfg)
                for result in ingest(spark, table.cfg, _run(args)):
                    result.table = table.name
                    print(result.summary(), flush=True)
                    first_job = first_job or result.spark_job
            except Exception as err:  # noqa: BLE001 - one table's failure is reported, the others go on
                if len(tables) == 1:
                    raise
                failed.append(f"{table.name} ({one_line(err)})")
                print(f"{table.name}: failed: {one_line(err)}", file=sys.stderr, flush=True)
        report = startup_report(spark.ready_at, first_job)
    if report:
        print(report, flush=True)
    if failed:
        raise OffsetlakeError(f"ingest failed for {len(failed)} of {len(tables)} tables: {'; '.join(failed)}")
    return 0


def cmd_stream(args) -> int:
    from offsetlake.batch import print_progress
    from offsetlake.streaming import stream

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # finish the batch in flight, then leave

    def current_tables() -> list[PipelineTable]:
        """Listed again before each round: a topic created meanwhile that matches gets its table."""
        return _pipeline_tables(args)

    tables = current_tables()

    with _spark(args, tables[0].cfg, "stream") as spark:  # under spark-submit it starts while Kafka is checked
        unreachable = []
        for table in tables:
            try:
                _check_reachable(table.cfg)
            except Exception as err:  # noqa: BLE001 - a table per topic: the stream tries it again each round
                if table.name is None:
                    raise
                unreachable.append(err)
                print(f"{table.name}: failed: {one_line(err)}", file=sys.stderr, flush=True)
        if len(unreachable) == len(tables):
            raise unreachable[0]
        n = stream(
            spark,
            tables[0].cfg,
            stop,
            args.interval,
            _run(args),
            max_seconds=args.max_seconds,
            on_batch=print_progress,
            tables=current_tables,
        )
    print(f"stream stopped after {n} committed batches", flush=True)
    return 0


def cmd_backfill(args) -> int:
    from offsetlake.kafka import KafkaCluster
    from offsetlake.operations.backfill import backfill, parse_ranges, ranges_for_time_window

    cfg = _pipeline(args)
    _check_reachable(cfg)
    if args.ranges:
        ranges = parse_ranges(args.ranges)
    else:
        if args.time_to is None:
            raise ConfigError("--from needs --to")
        ranges = ranges_for_time_window(cfg, KafkaCluster(cfg.kafka), args.time_from, args.time_to)
        if not ranges:
            print("no records in that time window")
            return 0
    with _spark(args, cfg, "backfill") as spark:
        print(backfill(spark, cfg, ranges, _run(args), dry_run=args.dry_run).summary(), flush=True)
    return 0


def cmd_audit(args) -> int:
    from offsetlake.operations.audit import audit
    from offsetlake.operations.backfill import parse_ranges

    tables = _pipeline_tables(args)
    if args.ranges and len(tables) > 1:
        raise ConfigError("--ranges: name the table they are in with --table")
    out: list[Any] = []  # JSON reports, or lines of text
    bad: list[str] = []
    for table in tables:
        cfg = table.cfg
        report = audit(cfg, parse_ranges(args.ranges) if args.ranges else None)
        if args.json:
            out.append({**report.as_dict(), **_table_field(table)})
        else:
            out.extend(filter(None, [_heading(table), report.format()]))
        if not report.ok:
            bad.append(
                f"{report.problem_count()} {_problems(cfg)} and "
                f"{len(report.continuity) + len(report.sanity)} ledger issues in {table.label}"
            )
    print(json.dumps(out[0] if len(tables) == 1 and tables[0].name is None else out) if args.json else "\n".join(out))
    if bad:
        raise OffsetlakeError(f"audit found {'; '.join(bad)}")
    return 0


def _problems(cfg: PipelineConfig) -> str:
    """What an audit counts: offsets (append mode), keys (upsert mode: the table against the fold)."""
    return "bad keys" if cfg.write.upsert else "bad offsets"


def cmd_repair(args) -> int:
    cfg = _pipeline(args)
    _check_reachable(cfg)
    _repair(args, cfg, args.dry_run)
    return 0


def _repair(args, cfg: PipelineConfig, dry_run: bool, before=None):
    """Audit (unless given), backfill every damaged span, audit again. The audit after, or the one before."""
    from offsetlake.operations.audit import audit, repair

    with _spark(args, cfg, "repair") as spark:
        before, result = repair(spark, cfg, _run(args), dry_run=dry_run, report=before)
    print(before.format(), flush=True)
    if result is None:
        print("nothing to repair", flush=True)
        return before
    print(result.summary(), flush=True)
    if dry_run:
        return before
    after = audit(cfg)
    print(after.format(), flush=True)
    if not after.ok:
        raise OffsetlakeError("repair finished but audit still finds problems")
    return after


def cmd_cleanup(args) -> int:
    _cleanup(_pipeline(args), args.older_than, args.dry_run)
    return 0


def _cleanup(cfg: PipelineConfig, older_than: int, dry_run: bool) -> None:
    """Both tables; the quarantine table may not exist yet (no bad record so far)."""
    from offsetlake.operations.maintenance import cleanup

    for uri in (cfg.table_path, cfg.quarantine_path):
        try:
            print(cleanup(uri, older_than, dry_run).summary(), flush=True)
        except OffsetlakeError as err:
            if uri == cfg.table_path:
                raise
            print(f"{uri}: skipped ({err})", flush=True)


def cmd_reset(args) -> int:
    _reset(args, _pipeline(args), args.offsets)
    return 0


def _reset(args, cfg: PipelineConfig, offsets: str) -> None:
    from offsetlake.operations.maintenance import parse_offsets, reset

    version = reset(cfg, parse_offsets(offsets), args.reason, _run(args))
    print(f"ledger reset recorded in table version {version}", flush=True)


def cmd_restore(args) -> int:
    from offsetlake.operations.maintenance import restore

    cfg = _pipeline(args)
    version = restore(cfg, args.version, _run(args))
    print(f"table restored to version {args.version} with its ledger, as table version {version}")
    return 0


def cmd_optimize(args) -> int:
    _optimize(args, _pipeline(args))
    return 0


def _optimize(args, cfg: PipelineConfig) -> None:
    """The table, then the quarantine table if there is one (no z-order there: it has other columns)."""
    from offsetlake.formats.columns import quarantine_schema, table_schema
    from offsetlake.operations.compaction import optimize
    from offsetlake.protocol.quarantine import quarantine_schema_of
    from offsetlake.table import open_table

    settings = cfg.maintenance
    target = args.target_file_mb or settings.target_file_mb
    zorder = [c.strip() for c in args.zorder_by.split(",") if c.strip()] if args.zorder_by else settings.zorder_by
    columns = cfg.data_columns()
    if cfg.format.evolves:  # the payload columns come from the registry: the table has them
        columns = [f.name for f in open_table(cfg.table_path).schema().fields if f.name not in cfg.table.partition_by]
    wrong = sorted(c for c in zorder if c not in columns)
    if wrong:
        raise ConfigError(f"--zorder-by column {wrong[0]!r} is not a data column of pipeline {cfg.name!r}")
    run = _run(args)
    for uri in _tables(cfg):
        if uri == cfg.table_path:
            outcome = optimize(uri, cfg.name, table_schema(cfg), cfg.table.partition_by, target, zorder, run=run)
        else:
            schema = quarantine_schema_of(open_table(uri), quarantine_schema(cfg))
            outcome = optimize(uri, cfg.name, schema, [], target, run=run)
        print(outcome.summary(), flush=True)


def cmd_vacuum(args) -> int:
    _vacuum(args, _pipeline(args), args.dry_run)
    return 0


def _vacuum(args, cfg: PipelineConfig, dry_run: bool) -> None:
    from offsetlake.operations.maintenance import vacuum

    for uri in _tables(cfg):
        print(vacuum(uri, cfg.name, args.retention_hours, dry_run, _run(args)).summary(), flush=True)


def cmd_checkpoint(args) -> int:
    _checkpoint(_pipeline(args))
    return 0


def _checkpoint(cfg: PipelineConfig) -> None:
    from offsetlake.operations.maintenance import checkpoint

    for uri in _tables(cfg):
        print(
            f"{uri}: checkpoint at version {checkpoint(uri)}; commit files past the log retention removed", flush=True
        )


def cmd_maintain(args) -> int:
    cfg = _pipeline(args)
    if not (args.optimize or args.vacuum or args.checkpoint):
        raise ConfigError("nothing to do: give --optimize, --vacuum and/or --checkpoint")
    if args.optimize:
        _optimize(args, cfg)
    if args.vacuum:
        _vacuum(args, cfg, dry_run=False)
    if args.checkpoint:
        _checkpoint(cfg)
    return 0


def _tables(cfg: PipelineConfig) -> list[str]:
    """What maintenance runs on: the table, and its quarantine table once one exists."""
    from deltalake import DeltaTable

    from offsetlake.files import storage_options

    return [cfg.table_path] + (
        [cfg.quarantine_path]
        if DeltaTable.is_deltatable(cfg.quarantine_path, storage_options(cfg.quarantine_path))
        else []
    )


def cmd_recover(args) -> int:
    from offsetlake.operations.audit import audit

    cfg = _pipeline(args)
    if args.reset_offsets:
        _reset(args, cfg, args.reset_offsets)
    report = audit(cfg)
    if args.repair and not report.ok:
        report = _repair(args, cfg, dry_run=False, before=report)
    else:
        print(report.format(), flush=True)
    if args.cleanup:
        _cleanup(cfg, args.older_than, dry_run=False)
    if not report.ok:
        raise OffsetlakeError(
            f"audit found {report.problem_count()} {_problems(cfg)} in {cfg.name}"
            + ("" if args.repair else "; run again with repair to fix them")
        )
    return 0


def _check_reachable(cfg: PipelineConfig) -> None:
    """Fail in seconds if the table's object store, Kafka or the topics are not there: before a Spark
    session starts (from a terminal), or while one starts in the background (under spark-submit:
    LazySession.start_early)."""
    from offsetlake.kafka import KafkaCluster
    from offsetlake.table import check_store

    check_store(cfg.table_path)
    if cfg.quarantine_path != cfg.table_path:
        check_store(cfg.quarantine_path, "quarantine")
    cluster = KafkaCluster(cfg.kafka)
    cluster.partitions(cfg.topics)
    cluster.check_access(cfg.topics, cfg.consumer_group)
    if cfg.format.registry is not None:
        from offsetlake.formats.registry_client import registry_for

        registry_for(cfg.format.registry).check()


def cmd_produce(args) -> int:
    from offsetlake.local.producer import demo_event, ensure_topic, keyed, produce
    from offsetlake.topic_tables import for_topic, matching_topics, per_topic

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
    from offsetlake.local.producer import avro_event_maker, registry_client

    reg = fmt.registry
    if reg is None or reg.url is None:
        raise ConfigError(f"produce writes {fmt.type} through format.registry.url; pipeline {cfg.name!r} has none")
    client = registry_client(
        reg.url,
        reg.username.get_secret_value() if reg.username else None,
        reg.password.get_secret_value() if reg.password else None,
    )
    return avro_event_maker(client, topic, schema_version, headers=fmt.include_headers)


def cmd_broker(args) -> int:
    from offsetlake.local import broker

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


def cmd_schema(args) -> int:
    print(json.dumps(pipeline_json_schema(), indent=2))
    return 0


def pipeline_json_schema() -> dict:
    """The pipeline file's JSON Schema, generated from the models that read it (config.py). An editor checks
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
    "broker": cmd_broker,
}

if __name__ == "__main__":
    sys.exit(main())
