"""make soak: does a batch cost the same on a table a year old as on a new one?

20,000 small commits through the real commit path (`batch.commit_batch`: the ledger
read with RESTORE detection, the verdict, the quarantine check, one Delta commit
with data, txn actions and userMetadata, attempt clean-up), each adding a file of
a few rows, as a stream at a short interval does. Kafka and Spark are left out on
purpose: reading a few records costs the same on any day; what could grow with the
table's age is the table load, the ledger and history reads and the commit. Two
tables side by side, one with the maintenance a stream does (compaction every
`compact_every_batches`, checkpoints at the table's interval with log clean-up) and
the maintenance DAG's optimize every `--optimize-every` commits (the stream's own
compaction leaves one file per 50 batches, which the daily optimize packs), and one
with none.

Time is compressed: 20,000 commits take minutes here, a month at a 2-minute
interval. So the maintained table's two windows -- the log retention (commit files
every load lists) and the deleted-file retention (tombstones every checkpoint
carries) -- are compressed too, to `--window-seconds` (5 s: a few hundred commits),
so that they fill early and the run shows what they are for: once full, a batch
costs the same whatever the table's age. The unmaintained table keeps Delta's
defaults, 30 days and 7 days, which no commit of the run outlives: it shows what a
window that keeps growing costs (for `--plain-commits`, 5,000: past that it only
gets slower).

Printed: the latency of a small batch around commit 100, 1,000, 10,000 and 20,000
(median of the 50 commits up to there; target: the last within +10% of the first),
the windows' size, the file count and the time to read the whole table with and
without maintenance, and the peak memory of this process.

    python tests/benchmarks/bench_soak.py [--commits 20000] [--window-seconds 5] [--optimize-every 1000]
                                          [--plain-commits 5000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from offsetlake.batch import BatchResult, commit_batch  # noqa: E402
from offsetlake.config import parse_pipeline  # noqa: E402
from offsetlake.formats.columns import table_schema  # noqa: E402
from offsetlake.operations.compaction import optimize  # noqa: E402
from offsetlake.operations.maintenance import checkpoint  # noqa: E402
from offsetlake.protocol.commit import attempt_files, new_attempt_id  # noqa: E402
from offsetlake.protocol.ledger import read_ledger  # noqa: E402
from offsetlake.protocol.metadata import Run  # noqa: E402
from offsetlake.protocol.planning import BatchPlan  # noqa: E402
from offsetlake.protocol.quarantine import WrittenFile  # noqa: E402
from offsetlake.protocol.ranges import OffsetRange  # noqa: E402
from offsetlake.read_job import TaskFiles  # noqa: E402
from offsetlake.storage.parquet import attempt_file_name, write_files  # noqa: E402
from offsetlake.streaming import StreamCompaction  # noqa: E402
from offsetlake.table import open_table, query  # noqa: E402

TOPIC, PARTITIONS, RECORDS_PER_BATCH = "soak", 4, 8
MARKS = (100, 1_000, 10_000, 20_000)  # and every 5,000th
WINDOW = 50


def pipeline(workdir: Path, name: str, compact_every: int, window_seconds: float | None):
    """The pipeline, its table created with its maintenance properties (and windows compressed to
    `window_seconds` when given)."""
    doc = {
        "name": name,
        "topics": [TOPIC],
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},
        "table": {"path": str(workdir / name)},
        "format": {"type": "raw"},
        "maintenance": {"compact_every_batches": compact_every},
    }
    cfg = parse_pipeline(doc, name)
    properties = cfg.maintenance.table_properties()
    if window_seconds is not None:
        properties |= {
            "delta.logRetentionDuration": f"interval {window_seconds:g} seconds",
            "delta.deletedFileRetentionDuration": f"interval {window_seconds:g} seconds",
        }
    open_table(cfg.table_location, table_schema(cfg), [], cfg.name, properties=properties)
    return cfg


def one_batch(cfg, run: Run, number: int) -> tuple[float, set[str]]:
    """One small batch, committed as ingest commits it: the plan from the ledger, a file of a few rows."""
    started = time.perf_counter()
    table = open_table(cfg.table_location, table_schema(cfg), [], cfg.name)
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    ledger = read_ledger(cfg.table_location, table, cfg.name, tps)
    p = number % PARTITIONS
    start = ledger.offsets.get((TOPIC, p), 0)
    plan = BatchPlan(
        cfg.name,
        ledger.next_batch(),
        {tp: ledger.offsets.get(tp, 0) for tp in tps},
        {tp: ledger.offsets.get(tp, 0) + (RECORDS_PER_BATCH if tp == (TOPIC, p) else 0) for tp in tps},
        ledger_offsets={tp: ledger.offsets.get(tp) for tp in tps},
    )
    rng = OffsetRange(TOPIC, p, start, start + RECORDS_PER_BATCH)
    rows = pa.table(
        {
            "key": [b"k"] * RECORDS_PER_BATCH,
            "value": [b"soak value"] * RECORDS_PER_BATCH,
            "kafka_topic": [TOPIC] * RECORDS_PER_BATCH,
            "kafka_partition": pa.array([p] * RECORDS_PER_BATCH, pa.int32()),
            "kafka_offset": pa.array(range(start, start + RECORDS_PER_BATCH), pa.int64()),
            "kafka_timestamp": pa.array([1_700_000_000_000] * RECORDS_PER_BATCH, pa.timestamp("ms", tz="UTC")),
        },
        schema=table_schema(cfg),
    )
    attempt = new_attempt_id()
    with attempt_files(attempt, cfg.table_location, cfg.quarantine_location) as files_of_attempt:
        files = write_files(
            cfg.table_location, rows, [], lambda part: attempt_file_name(plan.batch, attempt, 0, 0, part)
        )
        result = commit_batch(
            cfg,
            plan,
            attempt,
            TaskFiles(RECORDS_PER_BATCH, [WrittenFile(rng, f) for f in files], []),
            run,
            files_of_attempt,
            snapshot=table,
        )
    assert result.status == "committed", result.message
    return time.perf_counter() - started, result.files


def soak(cfg, commits: int, maintained: bool, log, optimize_every: int = 0) -> dict:
    run = Run.here()
    tidy = StreamCompaction(cfg, run) if maintained else None
    latencies: list[float] = []
    marks = {}
    for n in range(1, commits + 1):
        seconds, files = one_batch(cfg, run, n)
        latencies.append(seconds)
        if tidy is not None:
            tidy.after(BatchResult("committed", n, files=files))
        if maintained and optimize_every and n % optimize_every == 0:  # what the maintenance DAG adds, once a "day"
            optimize(cfg.table_location, cfg.name, table_schema(cfg), [], cfg.maintenance.target_file_mb, run=run)
        if n in MARKS or n == commits or n % 5_000 == 0:
            marks[n] = statistics.median(latencies[-WINDOW:])
            log(
                f"  {'maintained' if maintained else 'no maintenance':<15} commit {n:>6}: "
                f"{marks[n] * 1000:7.1f} ms (median of the last {min(WINDOW, n)})"
            )
    if maintained:
        checkpoint(cfg.table_location)
    return {"marks": marks, "commits": commits, **table_shape(cfg)}


def table_shape(cfg) -> dict:
    started = time.perf_counter()
    table = open_table(cfg.table_location)
    files = len(table.file_uris())
    rows = query(cfg.table_location, "SELECT count(*) AS n FROM t").column(0)[0].as_py()
    return {
        "files": files,
        "rows": rows,
        "read_seconds": time.perf_counter() - started,
        "log_files": len(list(Path(cfg.table_path, "_delta_log").iterdir())),
        "tombstones": _tombstones_in_last_checkpoint(cfg.table_path),
    }


def _tombstones_in_last_checkpoint(uri: str) -> int:
    checkpoints = sorted(Path(uri, "_delta_log").glob("*.checkpoint.parquet"))
    if not checkpoints:
        return 0
    removes = pq.read_table(checkpoints[-1], columns=["remove"]).column("remove")
    return len(removes) - removes.null_count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=20_000)
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=5.0,
        help="the maintained table's log and deleted-file retention (compressed time)",
    )
    parser.add_argument(
        "--optimize-every",
        type=int,
        default=1_000,
        help="commits between the maintenance DAG's optimize runs on the maintained table",
    )
    parser.add_argument("--plain-commits", type=int, default=5_000)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="offsetlake-soak-"))
    log = lambda *a: print(*a, flush=True)  # noqa: E731
    log(f"soak: {args.commits} commits of {RECORDS_PER_BATCH} records per table, in {workdir}")
    results = {}
    for maintained in (True, False):
        cfg = pipeline(
            workdir,
            "soak_maintained" if maintained else "soak_plain",
            compact_every=50 if maintained else 0,
            window_seconds=args.window_seconds if maintained else None,
        )
        results[maintained] = soak(
            cfg,
            args.commits if maintained else min(args.commits, args.plain_commits),
            maintained,
            log,
            args.optimize_every,
        )
    first, last = min(results[True]["marks"]), max(results[True]["marks"])
    growth = results[True]["marks"][last] / results[True]["marks"][first] - 1
    log("\nsmall-batch latency (median of 50 commits), maintained table:")
    for n, seconds in results[True]["marks"].items():
        log(f"  commit {n:>6}: {seconds * 1000:7.1f} ms")
    log(
        f"commit {last} vs commit {first}: {growth:+.1%} (target: within +10%) -> "
        f"{'met' if growth <= 0.10 else 'NOT met'}"
    )
    plain = results[False]["marks"]
    log(f"without maintenance: commit {max(plain)} vs {min(plain)}: {plain[max(plain)] / plain[min(plain)] - 1:+.1%}")
    for label, key in (("maintained", True), ("no maintenance", False)):
        r = results[key]
        log(
            f"{label:<15} after {r['commits']:>6} commits: data files {r['files']:>6}, log files {r['log_files']:>6}, "
            f"tombstones {r['tombstones']:>6}, rows {r['rows']:>7}, full read {r['read_seconds'] * 1000:8.1f} ms"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    log(f"peak memory of this process: {peak:.0f} MB")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
