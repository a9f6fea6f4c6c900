"""The `offsetlake` command. Exit 0 on success; on failure one line on stderr and a non-zero exit."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from offsetlake import broker
from offsetlake.config import PipelineConfig, load_pipeline
from offsetlake.errors import ConfigError, OffsetlakeError, one_line

EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other failure
        self.exit(EXIT_USAGE, f"offsetlake: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


def _timestamp(text: str):
    import datetime as dt
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time like 2026-11-22T10:00:00Z, got {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="offsetlake", description="Kafka to Delta Lake, exactly once.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name, help_text):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--pipeline", required=True, help="pipeline name (include/pipelines/NAME.yaml)")
        p.add_argument("--pipelines-dir", help="folder of pipeline YAML files (default: include/pipelines)")
        return p

    p = command("status", "ledger vs Kafka end offsets (lag) per partition")
    p.add_argument("--json", action="store_true")
    p = command("history", "the pipeline's committed batches")
    p.add_argument("--limit", type=_positive_int)
    p.add_argument("--json", action="store_true")
    p = command("show", "row count and a sample of the table")
    p.add_argument("--limit", type=_positive_int, default=5)
    p = command("ingest", "catch up to the current end offsets, in one or more batches")
    p.add_argument("--master", help="Spark master (default local[*])")
    p = command("stream", "ingest in a loop until SIGTERM")
    p.add_argument("--master")
    p.add_argument("--interval", type=float, help="seconds between polls (default: the pipeline's)")
    p.add_argument("--max-seconds", type=float, help="stop after this long")
    p = command("backfill", "re-read offset ranges and replace their rows in one commit")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--ranges", help="topic:partition:start-end[,...] (end exclusive)")
    group.add_argument("--from", dest="time_from", type=_timestamp, help="time window start (ISO 8601)")
    p.add_argument("--to", dest="time_to", type=_timestamp, help="time window end (ISO 8601), with --from")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--master")
    p = command("audit", "compare the table with Kafka row by row and check the ledger")
    p.add_argument("--ranges", help="topic:partition:start-end[,...] (default: all still in Kafka)")
    p.add_argument("--json", action="store_true")
    p = command("repair", "audit, then backfill every span with missing, duplicated or unexpected rows")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--master")
    p = command("cleanup", "delete files no commit references (killed attempts), older than a safety window")
    p.add_argument("--older-than", type=_positive_int, default=3600, help="seconds (default 3600)")
    p.add_argument("--dry-run", action="store_true")
    p = command("reset", "move the ledger to given offsets, recorded as a reset commit")
    p.add_argument("--offsets", required=True, help="topic:partition=offset[,...]")
    p.add_argument("--reason", required=True)
    p = command("restore", "Delta RESTORE to a version, with the ledger as of that version, in one commit")
    p.add_argument("--version", required=True, type=int)
    p = command("produce", "write demo events (idempotent and transactional, some aborted)")
    p.add_argument("--count", type=_positive_int, default=1000)
    p.add_argument("--topic", help="default: the pipeline's first topic")
    p.add_argument("--partitions", type=_positive_int, default=4, help="when the topic must be created")
    p.add_argument("--transactional-share", type=_share, default=0.5)
    p.add_argument("--abort-share", type=_share, default=0.2)
    p.add_argument("--bad-share", type=_share, default=0.0, help="share of records the schema rejects")
    p.add_argument("--every", type=float, help="keep producing --count records every this many seconds until SIGTERM")
    p.add_argument("--seed", type=int)

    b = sub.add_parser("broker", help="the embedded noida-db broker (demo and tests)")
    b.add_argument("action", choices=["start", "stop"])
    b.add_argument("--data-dir", default=".offsetlake/broker")
    b.add_argument("--port", type=_positive_int, default=19092)
    b.add_argument("--pid-file", default=".offsetlake/broker.pid")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s",
                        stream=sys.stderr)
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


def _pipeline(args) -> PipelineConfig:
    return load_pipeline(args.pipeline, args.pipelines_dir)


def cmd_status(args) -> int:
    from offsetlake.status import format_status, status
    rows = status(_pipeline(args))
    print(json.dumps([r.as_dict() for r in rows]) if args.json else format_status(rows))
    return 0


def cmd_history(args) -> int:
    from offsetlake.status import format_history, history
    rows = history(_pipeline(args), args.limit)
    print(json.dumps(rows) if args.json else format_history(rows))
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


def _session(cfg: PipelineConfig, master: str | None, job: str):
    from offsetlake.spark import build_session
    return build_session(f"offsetlake-{job}-{cfg.name}", master)


def _lazy_session(cfg: PipelineConfig, master: str | None, job: str):
    from offsetlake.spark import LazySession
    return LazySession(f"offsetlake-{job}-{cfg.name}", master)


def cmd_ingest(args) -> int:
    from offsetlake.batch import ingest
    cfg = _pipeline(args)
    _check_reachable(cfg)
    spark = _lazy_session(cfg, args.master, "ingest")
    try:
        for result in ingest(spark, cfg):
            print(result.summary(), flush=True)
    finally:
        spark.stop()
    return 0


def cmd_stream(args) -> int:
    from offsetlake.batch import print_progress, stream
    cfg = _pipeline(args)
    _check_reachable(cfg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())  # finish the batch in flight, then leave
    spark = _lazy_session(cfg, args.master, "stream")
    try:
        n = stream(spark, cfg, stop, args.interval, max_seconds=args.max_seconds,
                   on_batch=print_progress)
    finally:
        spark.stop()
    print(f"stream stopped after {n} committed batches")
    return 0


def cmd_backfill(args) -> int:
    from offsetlake.backfill import backfill, parse_ranges, ranges_for_time_window
    from offsetlake.kafka import KafkaCluster
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
    if args.dry_run:
        print(backfill(None, cfg, ranges, dry_run=True).summary())
        return 0
    spark = _session(cfg, args.master, "backfill")
    try:
        print(backfill(spark, cfg, ranges).summary())
    finally:
        spark.stop()
    return 0


def cmd_audit(args) -> int:
    from offsetlake.audit import audit
    from offsetlake.backfill import parse_ranges
    cfg = _pipeline(args)
    report = audit(cfg, parse_ranges(args.ranges) if args.ranges else None)
    print(json.dumps(report.as_dict()) if args.json else report.format())
    if not report.ok:
        problems = sum(len(p.missing) + len(p.duplicated) + len(p.unexpected) for p in report.partitions)
        raise OffsetlakeError(f"audit found {problems} bad offsets and "
                              f"{len(report.continuity) + len(report.sanity)} ledger issues in {cfg.name}")
    return 0


def cmd_repair(args) -> int:
    from offsetlake.audit import audit, repair
    cfg = _pipeline(args)
    _check_reachable(cfg)
    spark = None if args.dry_run else _session(cfg, args.master, "repair")
    try:
        before, result = repair(spark, cfg, dry_run=args.dry_run)
    finally:
        if spark is not None:
            spark.stop()
    print(before.format())
    if result is None:
        print("nothing to repair")
        return 0
    print(result.summary())
    if not args.dry_run:
        after = audit(cfg)
        print(after.format())
        if not after.ok:
            raise OffsetlakeError("repair finished but audit still finds problems")
    return 0


def cmd_cleanup(args) -> int:
    from offsetlake.maintenance import cleanup
    cfg = _pipeline(args)
    for uri in (cfg.table_path, cfg.quarantine_path):
        try:
            print(cleanup(uri, args.older_than, args.dry_run).summary())
        except OffsetlakeError as err:
            if uri == cfg.table_path:
                raise
            print(f"{uri}: skipped ({err})")
    return 0


def cmd_reset(args) -> int:
    from offsetlake.maintenance import parse_offsets, reset
    cfg = _pipeline(args)
    version = reset(cfg, parse_offsets(args.offsets), args.reason)
    print(f"ledger reset recorded in table version {version}")
    return 0


def cmd_restore(args) -> int:
    from offsetlake.maintenance import restore
    cfg = _pipeline(args)
    version = restore(cfg, args.version)
    print(f"table restored to version {args.version} with its ledger, as table version {version}")
    return 0


def _check_reachable(cfg: PipelineConfig) -> None:
    """Fail in a second, before a Spark session starts, if Kafka or the topics are not there."""
    from offsetlake.kafka import KafkaCluster
    KafkaCluster(cfg.kafka).partitions(cfg.topics)


def cmd_produce(args) -> int:
    from offsetlake.producer import ensure_topic, produce
    cfg = _pipeline(args)
    topic = args.topic or cfg.topics[0]
    if topic not in cfg.topics:
        raise ConfigError(f"--topic {topic!r} is not one of pipeline {cfg.name!r}'s topics: {cfg.topics}")
    ensure_topic(cfg.kafka, topic, args.partitions)
    stop = threading.Event()
    if args.every:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while True:
        report = produce(cfg.kafka, topic, args.count, transactional_share=args.transactional_share,
                         abort_share=args.abort_share, seed=args.seed, bad_share=args.bad_share)
        print(report, flush=True)
        if not args.every or stop.wait(args.every):
            return 0


def cmd_broker(args) -> int:
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


COMMANDS = {"status": cmd_status, "history": cmd_history, "show": cmd_show, "backfill": cmd_backfill,
            "audit": cmd_audit, "repair": cmd_repair, "cleanup": cmd_cleanup, "reset": cmd_reset,
            "restore": cmd_restore, "ingest": cmd_ingest, "stream": cmd_stream,
            "produce": cmd_produce, "broker": cmd_broker}

if __name__ == "__main__":
    sys.exit(main())
