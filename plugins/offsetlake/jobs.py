"""The spark-submit entry points behind jobs/*.py: parse arguments, build the session, call offsetlake.

Each job can write a small JSON result (`--result-file`) that the Airflow DAG
reads back to publish an Asset event with the committed ranges.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from offsetlake.config import PipelineConfig, load_pipeline
from offsetlake.errors import ConfigError, OffsetlakeError, one_line
from offsetlake.ledger import RunInfo


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--pipelines-dir")
    parser.add_argument("--dag-id")
    parser.add_argument("--run-id")
    parser.add_argument("--try-number", type=int)
    parser.add_argument("--result-file")
    return parser


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _run(prog: str, argv, add_arguments, body) -> int:
    parser = _parser(prog)
    add_arguments(parser)
    args = parser.parse_args(argv)
    run = RunInfo("airflow", args.dag_id, args.run_id, args.try_number) if args.dag_id else RunInfo.from_env()
    try:
        cfg = load_pipeline(args.pipeline, args.pipelines_dir)
        result = body(args, cfg, run)
        if args.result_file:
            path = Path(args.result_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
    except OffsetlakeError as err:
        print(f"offsetlake: error: {one_line(err)}", file=sys.stderr, flush=True)
        return 1
    return 0


def _session(cfg: PipelineConfig, job: str):
    from offsetlake.spark import build_session
    return build_session(f"offsetlake-{job}-{cfg.name}")


def merged_ranges(batches: list[dict]) -> dict:
    """{topic: {partition: [first start, last end]}} over consecutive ingest batches."""
    out: dict = {}
    for b in batches:
        for topic, parts in b["ranges"].items():
            for p, (start, end) in parts.items():
                lo, _ = out.setdefault(topic, {}).get(p, (start, end))
                out[topic][p] = [lo, end]
    return out


def ingest_main(argv=None) -> int:
    from offsetlake.batch import ingest
    from offsetlake.ledger import ranges_json

    def body(args, cfg, run):
        spark = _session(cfg, "ingest")
        try:
            batches = []
            for result in ingest(spark, cfg, run):
                print(result.summary(), flush=True)
                if result.status == "committed":
                    batches.append({"batch": result.batch, "version": result.version,
                                    "ranges": ranges_json(result.ranges), "rows": result.records})
        finally:
            spark.stop()
        return {"pipeline": cfg.name, "kind": "ingest", "table": cfg.table_path, "batches": batches,
                "ranges": merged_ranges(batches), "rows": sum(b["rows"] for b in batches)}

    return _run("jobs/ingest.py", argv, lambda p: None, body)


def stream_main(argv=None) -> int:
    from offsetlake.batch import print_progress, stream

    def add(parser):
        parser.add_argument("--max-seconds", type=float, required=True)
        parser.add_argument("--interval", type=float)

    def body(args, cfg, run):
        if not 1 <= args.max_seconds <= 86400:
            raise ConfigError("--max-seconds must be between 1 and 86400")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        spark = _session(cfg, "stream")
        try:
            n = stream(spark, cfg, stop, args.interval, run, max_seconds=args.max_seconds,
                       on_batch=print_progress)
        finally:
            spark.stop()
        print(f"stream stopped after {n} committed batches", flush=True)
        return {"pipeline": cfg.name, "kind": "stream", "batches": n}

    return _run("jobs/stream.py", argv, add, body)


def backfill_main(argv=None) -> int:
    from offsetlake.backfill import backfill, parse_ranges

    def add(parser):
        parser.add_argument("--ranges", required=True)
        parser.add_argument("--dry-run", type=_bool, default=False)

    def body(args, cfg, run):
        ranges = parse_ranges(args.ranges)
        spark = None if args.dry_run else _session(cfg, "backfill")
        try:
            result = backfill(spark, cfg, ranges, run, dry_run=args.dry_run)
        finally:
            if spark is not None:
                spark.stop()
        print(result.summary(), flush=True)
        return {"pipeline": cfg.name, "kind": "backfill", "table": cfg.table_path, **result.as_dict()}

    return _run("jobs/backfill.py", argv, add, body)


def recovery_main(argv=None) -> int:
    """Audit; then, when asked, repair, clean up, reset. Fails if problems remain."""
    from offsetlake.audit import audit, repair
    from offsetlake.maintenance import cleanup, parse_offsets, reset

    def add(parser):
        parser.add_argument("--repair", type=_bool, default=False)
        parser.add_argument("--cleanup", type=_bool, default=False)
        parser.add_argument("--older-than", type=int, default=3600)
        parser.add_argument("--reset-offsets", default="")
        parser.add_argument("--reason", default="")

    def body(args, cfg, run):
        out: dict = {"pipeline": cfg.name, "kind": "recovery"}
        if args.reset_offsets:
            out["reset_version"] = reset(cfg, parse_offsets(args.reset_offsets), args.reason, run)
            print(f"ledger reset recorded in table version {out['reset_version']}", flush=True)
        report = audit(cfg)
        print(report.format(), flush=True)
        if args.repair and not report.ok:
            spark = _session(cfg, "repair")
            try:
                _, result = repair(spark, cfg, run)
            finally:
                spark.stop()
            if result is not None:
                print(result.summary(), flush=True)
                out["repair"] = result.as_dict()
            report = audit(cfg)
            print(report.format(), flush=True)
        if args.cleanup:
            for uri in (cfg.table_path, cfg.quarantine_path):
                try:
                    print(cleanup(uri, args.older_than).summary(), flush=True)
                except OffsetlakeError as err:
                    print(f"{uri}: cleanup skipped ({err})", flush=True)
        out["audit_ok"] = report.ok
        if not report.ok:
            raise OffsetlakeError("audit found problems" + ("" if args.repair else "; trigger with repair=true to fix them"))
        return out

    return _run("jobs/recovery.py", argv, add, body)
