"""The `offsetlake` command's arguments: every command, its flags and its --help text (the generated CLI
reference, docs/reference/cli.md, is made from `build_parser`). Values are checked here, each refusal one
line; what the commands do is in offsetlake.cli."""

from __future__ import annotations

import argparse

from offsetlake.operations.maintenance import DEFAULT_CLEANUP_AGE_SECONDS

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other failure
        self.exit(EXIT_USAGE, f"offsetlake: error: {message}\n")


def _number(parse, low: float, high: float, what: str):
    """An argparse type: `parse` the text, then check low <= value <= high; one message names both."""

    def check(text: str):
        try:
            value = parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from err
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return check


_positive_int = _number(int, 1, 2**63 - 1, "a whole number above 0")
_positive_float = _number(float, 0.001, 31_536_000, "a number of seconds above 0 (at most a year)")
_share = _number(float, 0.0, 1.0, "a number between 0 and 1")


def _timestamp(text: str):
    import datetime as dt

    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time like 2026-11-22T10:00:00Z, got {text!r}") from err
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _add_dry_run(p: argparse.ArgumentParser) -> None:
    # `--dry-run` alone, or `--dry-run true|false` where a caller (an Airflow form) fills the value in.
    p.add_argument("--dry-run", nargs="?", const=True, default=False, type=_bool, help="show the plan, change nothing")


def _add_run(p: argparse.ArgumentParser) -> None:
    """Who runs a command that commits: recorded in the commit's userMetadata. The Airflow operator sets these."""
    p.add_argument("--dag-id", help="Airflow DAG id (set by the offsetlake operator)")
    p.add_argument("--run-id", help="Airflow DAG run id")
    p.add_argument("--try-number", type=_positive_int, help="Airflow task try number")
    _add_master(p)


def _add_master(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", help="Spark master (default local[*]; under spark-submit, spark-submit's)")


# What each command does, in full: its --help, and the generated CLI reference (docs/reference/cli.md).
DESCRIPTIONS = {
    "status": "Per partition: committed offset (the ledger), log start, end offset (the LSO under read_committed), "
    "lag.",
    "history": "The pipeline's commits: version, batch, kind, rows, quarantined, exact ranges; rewinds and recorded "
    "data loss.",
    "show": "Row count and the newest rows.",
    "ingest": "Catch up to the end offsets taken now, in as many batches as batch.max_records_per_batch needs.",
    "stream": "The same batches in a loop in one Spark session; SIGTERM or Ctrl-C stops it between batches, or at once "
    "while it waits for an absent broker. A broker restart shorter than kafka.retry_seconds is waited out (each "
    "retry logged once), not failed on; one warning at "
    "start when its log and deleted-file windows outgrow its rate.",
    "backfill": "Re-read offset ranges (or a time window) and replace their rows in one commit. Refused past the "
    "ledger's end or below Kafka's log start; the ledger's end is checked again when it commits, so a restore or "
    "reset that moved the ledger back meanwhile refuses it.",
    "audit": "Compare the rows with Kafka under read_committed (missing, duplicated, unexpected), and check the "
    "ledger's continuity; exit 1 if anything is wrong.",
    "repair": "Audit, backfill every damaged span, audit again.",
    "cleanup": "Delete files no commit references (killed attempts) older than --older-than seconds, so in-flight "
    "batches are safe.",
    "reset": "Move the ledger to the given offsets, recorded as a reset commit with the reason.",
    "restore": "Delta RESTORE to a version and, in the same commit, the ledger as of that version.",
    "recover": "What the recovery DAG runs: an optional reset, the audit, an optional repair and cleanup; exit 1 if "
    "problems remain.",
    "optimize": "Compact small files of the table and its quarantine (dataChange=false; the ledger is untouched).",
    "vacuum": "Delete data files removed longer ago than the retention (never below 1 hour).",
    "checkpoint": "Write a Delta checkpoint, then remove commit files past the table's log retention.",
    "maintain": "What the maintenance DAG runs: optimize, vacuum and checkpoint, each on request, for the table and "
    "its quarantine.",
    "produce": "Demo events through an idempotent and a transactional producer, with a share of aborted "
    "transactions and, on request, records the schema rejects.",
    "schema": "Print the pipeline file's JSON Schema, generated from the models that read it.",
    "monitoring": "Print the Prometheus alert rules or the Grafana dashboard offsetlake ships, for the metrics "
    "Airflow serves at /offsetlake/metrics (each pipeline's thresholds are its `alerts` settings).",
    "broker": "The embedded Apache Kafka broker (one KRaft node, its jars from Maven Central) on 127.0.0.1 "
    "(demo and tests).",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="offsetlake", description="Kafka to Delta Lake, exactly once.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name, help_text):
        p = sub.add_parser(name, help=help_text, description=DESCRIPTIONS[name])
        p.add_argument("--pipeline", required=True, help="pipeline name (include/pipelines/NAME.yaml)")
        p.add_argument("--pipelines-dir", help="folder of pipeline YAML files (default: include/pipelines)")
        p.add_argument(
            "--table",
            help="one table of a pipeline that writes a table per topic (table.path with {table} or {topic}); "
            "status, history, audit, ingest and stream take all of them without it",
        )
        return p

    p = command("status", "ledger vs Kafka end offsets (lag) per partition")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command("history", "the pipeline's committed batches")
    p.add_argument("--limit", type=_positive_int, help="the newest this many commits")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command("show", "row count and a sample of the table")
    p.add_argument("--limit", type=_positive_int, default=5, help="how many of the newest rows")
    p = command("ingest", "catch up to the current end offsets, in one or more batches")
    _add_run(p)
    p = command("stream", "ingest in a loop until SIGTERM")
    _add_run(p)
    p.add_argument("--interval", type=_positive_float, help="seconds between polls (default: the pipeline's)")
    p.add_argument("--max-seconds", type=_positive_float, help="stop after this long")
    p = command("backfill", "re-read offset ranges and replace their rows in one commit")
    _add_run(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--ranges", help="topic:partition:start-end[,...] (end exclusive)")
    group.add_argument("--from", dest="time_from", type=_timestamp, help="time window start (ISO 8601)")
    p.add_argument("--to", dest="time_to", type=_timestamp, help="time window end (ISO 8601), with --from")
    _add_dry_run(p)
    p = command("audit", "compare the table with Kafka row by row and check the ledger")
    p.add_argument("--ranges", help="topic:partition:start-end[,...] (default: all still in Kafka)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _add_master(p)
    p = command("repair", "audit, then backfill every span with missing, duplicated or unexpected rows")
    _add_run(p)
    _add_dry_run(p)
    p = command("cleanup", "delete files no commit references (killed attempts), older than a safety window")
    p.add_argument(
        "--older-than",
        type=_positive_int,
        default=DEFAULT_CLEANUP_AGE_SECONDS,
        help=f"seconds (default {DEFAULT_CLEANUP_AGE_SECONDS})",
    )
    _add_dry_run(p)
    p = command("reset", "move the ledger to given offsets, recorded as a reset commit")
    _add_run(p)
    p.add_argument("--offsets", required=True, help="topic:partition=offset[,...]")
    p.add_argument("--reason", required=True, help="why, recorded in the reset commit")
    p = command("restore", "Delta RESTORE to a version, with the ledger as of that version, in one commit")
    _add_run(p)
    p.add_argument("--version", required=True, type=int, help="the table version to restore")
    p = command("optimize", "compact small data files (dataChange=false; the ledger is untouched)")
    _add_run(p)
    p.add_argument("--target-file-mb", type=_positive_int, help="default: the pipeline's maintenance.target_file_mb")
    p.add_argument("--zorder-by", help="columns, comma-separated (default: maintenance.zorder_by)")
    p = command("vacuum", "delete data files removed from the table longer ago than the retention")
    _add_run(p)
    p.add_argument(
        "--retention-hours",
        type=_positive_int,
        help="default: the table's delta.deletedFileRetentionDuration; never below 1 hour",
    )
    _add_dry_run(p)
    _add_master(command("checkpoint", "write a Delta checkpoint and remove commit files past the log retention"))
    p = command("maintain", "what the maintenance DAG runs: [optimize,] [vacuum,] [checkpoint], table and quarantine")
    _add_run(p)
    p.add_argument("--optimize", nargs="?", const=True, default=False, type=_bool, help="compact (true/false)")
    p.add_argument("--vacuum", nargs="?", const=True, default=False, type=_bool, help="vacuum (true/false)")
    p.add_argument(
        "--checkpoint",
        nargs="?",
        const=True,
        default=False,
        type=_bool,
        help="checkpoint and log clean-up (true/false)",
    )
    p.add_argument("--retention-hours", type=_positive_int, help="vacuum's, as for `vacuum`")
    p.add_argument("--target-file-mb", type=_positive_int, help="compaction's, as for `optimize`")
    p.add_argument("--zorder-by", help="compaction's, as for `optimize`")
    p = command("recover", "what the recovery DAG runs: [reset,] audit, [repair,] [cleanup]; fails if problems remain")
    _add_run(p)
    p.add_argument("--reset-offsets", default="", help="topic:partition=offset[,...]: reset first (needs --reason)")
    p.add_argument("--reason", default="", help="why, recorded in the reset commit")
    p.add_argument(
        "--repair",
        nargs="?",
        const=True,
        default=False,
        type=_bool,
        help="backfill what the audit found damaged (true/false)",
    )
    p.add_argument(
        "--cleanup",
        nargs="?",
        const=True,
        default=False,
        type=_bool,
        help="delete files no commit references (true/false)",
    )
    p.add_argument(
        "--older-than", type=_positive_int, default=DEFAULT_CLEANUP_AGE_SECONDS, help="cleanup's safety window, seconds"
    )
    p = command("produce", "write demo events (idempotent and transactional, some aborted)")
    p.add_argument("--count", type=_positive_int, default=1000, help="committed records to write")
    p.add_argument("--topic", help="default: the pipeline's first topic")
    p.add_argument("--partitions", type=_positive_int, default=4, help="when the topic must be created")
    p.add_argument("--transactional-share", type=_share, default=0.5, help="share of records written in transactions")
    p.add_argument("--abort-share", type=_share, default=0.2, help="share of transactions aborted")
    p.add_argument("--bad-share", type=_share, default=0.0, help="share of records the schema rejects")
    p.add_argument("--every", type=float, help="keep producing --count records every this many seconds until SIGTERM")
    p.add_argument("--seed", type=int, help="the random seed: the same records again")
    p.add_argument(
        "--schema-version",
        type=int,
        choices=[1, 2],
        default=1,
        help="format avro: demo event schema 1, or 2 (adds a field 'country')",
    )
    p.add_argument("--keys", type=_positive_int, help="key the records 1..KEYS (a keyed topic, for upsert mode)")
    p.add_argument(
        "--tombstone-share", type=_share, default=0.0, help="with --keys: share of records that delete their key"
    )

    sub.add_parser(
        "schema",
        help="print the pipeline file's JSON Schema (for editors and validators)",
        description=DESCRIPTIONS["schema"],
    )

    m = sub.add_parser(
        "monitoring",
        help="print the Prometheus alert rules or the Grafana dashboard",
        description=DESCRIPTIONS["monitoring"],
    )
    m.add_argument("what", choices=["rules", "dashboard"], help="the alert rules (YAML) or the dashboard (JSON)")

    b = sub.add_parser(
        "broker", help="the embedded Apache Kafka broker (demo and tests)", description=DESCRIPTIONS["broker"]
    )
    b.add_argument("action", choices=["start", "stop"], help="start or stop it")
    b.add_argument("--data-dir", default=".offsetlake/broker", help="where it keeps its log")
    b.add_argument("--port", type=_positive_int, default=19092, help="its port on 127.0.0.1")
    b.add_argument("--pid-file", default=".offsetlake/broker.pid", help="its PID, for stop")
    return parser
