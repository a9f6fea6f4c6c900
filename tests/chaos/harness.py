"""Chaos harness: hundreds of injected faults against real jobs, then a row-by-row verdict.

A three-node Apache Kafka cluster of its own (replication factor 3, min.insync.replicas 2), a
4-partition topic fed all the time by
idempotent and transactional producers (aborted and long-open transactions,
1% bad records), and a driver that runs `offsetlake ingest`, `stream` and
`backfill` as real processes while it injects, in an order drawn from a seed:

  kill@<point>        SIGKILL the job at a protocol step (OFFSETLAKE_FAULT=<point>:exit)
  kill@random <job>   SIGKILL an ingest, stream or backfill at a random moment
  duplicate runs      two ingests of the same pipeline at once
  zombie@<point>      an ingest frozen at a step while a retry commits, then let go
  broker killed (leaders move)
                      SIGKILL one node mid-batch (its partitions' leaders move to the others),
                      start it again after 1-4 s
  whole cluster restarted
                      SIGTERM all three nodes, start them again on the same ports and data
  ... during stream   either of the two under a running `stream`, which must stay up and commit
                      again once the cluster is whole (availability: uptime and longest gap reported)
  restore             Delta RESTORE to an earlier version (delta-rs, as an operator would,
                      or `offsetlake restore`), sometimes while an ingest runs
  cleanup             `offsetlake cleanup` while an ingest runs
  optimize during X   compaction (dataChange=false) while an ingest, a stream or a backfill runs
  vacuum              `offsetlake vacuum` (1 h retention) while an ingest runs
  checkpoint          a checkpoint and log clean-up (the table keeps 1 minute of log) while an ingest runs

With `storage="s3"` the table and quarantine live on an S3 server (moto's, on
loopback) behind a fault proxy (tests/store_faults.py), and three kinds join:

  store 503 during ingest       every request answered 503 SlowDown for 1-6 s while an ingest runs
  store away during ingest      the endpoint refuses connections for 1-4 s (a store restarting:
                                moto keeps its data in memory, so the proxy goes away instead)
  store restart at commit       the next commit's log entry is stored, its answer dropped, and the
                                endpoint gone for 1-4 s: a store restarting between writing and answering

With `engine="delta-spark"` every job commits through delta-spark (`table.engine: delta-spark`, its jars
given as `--jars`), while the harness's own optimize, vacuum, checkpoint and restore stay delta-rs', as an
operator's maintenance beside the pipeline would be. Only on local disk: the delta-spark engine has no S3
settings yet.

With `driver_reads_up_to=N` (`batch.driver_reads_up_to`) a batch of at most N offsets is read by the job's
driver instead of a Spark job: the kills at `after_read` then end the job itself, not a Spark task.

After every fault the table is checked for duplicated offsets (before a
restore could erase the evidence, the full check below runs too). At the end
the producers stop, one clean ingest catches up, and every (topic, partition,
offset) Kafka returns under read_committed must be in the table or the
quarantine exactly once, and nothing else. The seed replays the fault
schedule; thread and process timing still vary from run to run.

    python tests/chaos/harness.py --faults 200 [--seed N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO / "tests", REPO / "tests" / "chaos"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import logging  # noqa: E402

from deltalake import DeltaTable  # noqa: E402
from deltalake.exceptions import CommitFailedError, DeltaError  # noqa: E402

import oracle  # noqa: E402
from offsetlake.engine import DeltaRs  # noqa: E402
from offsetlake.errors import TableError  # noqa: E402
from offsetlake.formats.columns import table_schema  # noqa: E402
from offsetlake.operations.audit import audit  # noqa: E402
from offsetlake.operations.compaction import optimize  # noqa: E402
from offsetlake.operations.maintenance import checkpoint, cleanup, record_pending_rewind, restore, vacuum  # noqa: E402
from offsetlake.spark.session import DRIVER_JIT  # noqa: E402
from offsetlake.storage.location import Location, retrying  # noqa: E402
from offsetlake_local import broker as embedded_broker  # noqa: E402
from offsetlake_local import schema_registry as embedded_registry  # noqa: E402
from support import (  # noqa: E402
    create_topic,
    delta_spark_submit_args,
    ledger_offsets,
    load,
    quarantine_lineage,
    table_lineage,
    write_pipeline,
)
from workload import CHUNK, TRANSACTION_TIMEOUT_MS, Workload  # noqa: E402

POINTS = ("after_plan", "after_read", "after_files_written", "before_commit", "after_commit")
PARTITIONS = 4
# Every kind once (in a seeded order) before the rest are drawn by weight: a short run still covers them all.
KINDS = {
    **{f"kill@{p}": 3 for p in POINTS},
    "kill@random ingest": 3,
    "kill@random stream": 2,
    "kill@random backfill": 2,
    "duplicate runs": 2,
    "zombie@after_files_written": 1,
    "zombie@before_commit": 1,
    "broker killed (leaders move)": 2,
    "broker killed during stream": 1,
    "whole cluster restarted": 2,
    "whole cluster restarted during stream": 1,
    "restore (delta-rs)": 1,
    "restore (offsetlake)": 1,
    "cleanup during ingest": 2,
    "optimize during ingest": 2,
    "optimize during stream": 1,
    "optimize during backfill": 1,
    "vacuum during ingest": 1,
    "checkpoint during ingest": 1,
}
# Object storage's own faults, in a run whose table is on S3 (storage="s3").
S3_KINDS = {"store 503 during ingest": 2, "store away during ingest": 2, "store restart at commit": 2}


# Upsert mode has no backfill (it is refused on an upsert table in one line).
UPSERT_LEFT_OUT = ("kill@random backfill", "optimize during backfill")
UPSERT_KEYS = 300  # keys of the upsert mode's records: most records update or delete a key the table holds


def kinds_for(storage: str, mode: str = "append") -> dict[str, int]:
    kinds = {**KINDS, **(S3_KINDS if storage == "s3" else {})}
    return {k: n for k, n in kinds.items() if mode == "append" or k not in UPSERT_LEFT_OUT}


LOG_RETENTION = "interval 1 minutes"  # so that checkpoints really remove commit files during the run
JOB_TIMEOUT = 300
MAX_TRIES_PER_FAULT = 10  # draws per fault asked for, before a run gives up on a kind it cannot reach
# A stream must commit again this soon after the cluster is whole: librdkafka reconnects within 10 s
# (reconnect.backoff.max.ms), then one batch runs; the rest is slack for two busy cores.
RECOVERY_LIMIT = 90
# On the delta-spark engine a batch is a second Spark job (its staged rows written again by delta-spark):
# a 20-fault run (seed 8, 2026-11-28) saw a stream's first commit after the cluster's return past 90 s.
RECOVERY_LIMITS = {"delta-rs": RECOVERY_LIMIT, "delta-spark": 2 * RECOVERY_LIMIT}
# An ingest or backfill that a broker restart failed (one per lane at most: each lane runs one job at a time
# beside it, and the job started by the restart fault itself).
EXCUSED_PER_RESTART = 2
# What the oracle may leave out of a check in this workload, counted and printed whatever the count:
# - records whose transaction's end raised (a broker restart under a commit): each of the workload's two
#   transactional threads has one transaction open when a restart begins (CHUNK, or 5 to 30 records), and
#   the next one it starts may still meet the cluster coming back: two of each per restart at most (one
#   200-fault run in upsert/Avro/S3 left 703 in doubt across 16 restarts);
# - quarantine rows of a batch whose job was killed between its quarantine commit and its table commit:
#   at most the bad records (1%) of one 4,000-record batch per lane. None at the final check;
# - records a retried write got acknowledged without an offset (the broker already held them) and that lie
#   past the ledger's end at a check before the last: at most the records in flight at a restart. None at
#   the final check (read to the LSO, every one must be found or is lost).
# A cluster restart takes at most this long: starting the nodes times out at 120 s, stopping at 20 s.
RESTART_WAIT_SECONDS = 180
IN_DOUBT_PER_RESTART = 2 * (CHUNK + 30)
LEFT_OUT_BOUNDS = {oracle.QUARANTINE_AHEAD: 100, oracle.UNPLACED: 300}


def left_out_bounds(broker_restarts: int) -> dict[str, int]:
    return {**LEFT_OUT_BOUNDS, oracle.IN_DOUBT: IN_DOUBT_PER_RESTART * max(1, broker_restarts)}


# Every in-process operation of the harness (optimize, vacuum, cleanup, restore, checkpoint, the oracle):
# one that has not returned by then fails the run instead of hanging it.
OPERATION_TIMEOUT = 300
COMMITTED = ": committed table version "  # in the line a job prints per committed batch (BatchResult.summary)


class ChaosFailure(AssertionError):
    pass


KAFKA_FAILURE = "offsetlake: error: Kafka at "  # how offsetlake says, in one line, that Kafka failed it


def bounded(action, what: str, seconds: float = OPERATION_TIMEOUT):
    """`action()`, or ChaosFailure naming `what` when it has not returned within `seconds` (its thread is
    left behind: a daemon, gone with the harness)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, action()))
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            outcome.append((False, err))

    thread = threading.Thread(target=run, daemon=True, name=f"harness: {what}")
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise ChaosFailure(f"{what} did not return within {seconds:.0f} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def version_gone(err: Exception) -> bool:
    """delta-rs' or offsetlake's word that a table version is no longer in the log."""
    text = str(err).lower()
    return any(words in text for words in ("no files in log segment", "invalid table version", "not found"))


def one_line_kafka_error(job: Job) -> bool:
    """The job ended on offsetlake's one-line Kafka error, with no Python traceback in its output: the only
    failure a broker restart excuses (an Airflow retry runs it again). Anything else is a finding."""
    text = job.log.read_text(errors="replace") if job.log.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith(KAFKA_FAILURE) and "Traceback (most recent call last)" not in text


class ThreadDeaths:
    """Every harness thread (a lane, a producer, a helper) that dies of an exception fails the run, named,
    instead of printing a traceback while the run goes on without it."""

    def __init__(self):
        self.deaths: list[str] = []
        self._previous = threading.excepthook

    def __enter__(self) -> ThreadDeaths:
        self._previous, threading.excepthook = threading.excepthook, self._died
        return self

    def __exit__(self, *exc) -> None:
        threading.excepthook = self._previous

    def _died(self, args) -> None:
        name = args.thread.name if args.thread is not None else "a thread"
        self.deaths.append(f"{name}: {args.exc_type.__name__}: {args.exc_value}")
        self._previous(args)  # its traceback, printed as Python would

    def check(self) -> None:
        if self.deaths:
            raise ChaosFailure(f"a harness thread died: {'; '.join(self.deaths)}")


class Stillness:
    """Faults run side by side in lanes; a full row-by-row check needs the table to hold still."""

    def __init__(self):
        self._cond = threading.Condition()
        self._busy = 0
        self._still = False

    @contextmanager
    def busy(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._still)
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    @contextmanager
    def still(self):
        with self._cond:
            self._cond.wait_for(lambda: not self._still)
            self._still = True
            self._cond.wait_for(lambda: self._busy == 0)
        try:
            yield
        finally:
            with self._cond:
                self._still = False
                self._cond.notify_all()


@dataclass
class Job:
    """A real offsetlake process in its own process group (driver, JVM and Python workers)."""

    name: str
    proc: subprocess.Popen
    log: Path
    broker_restarts: int  # how many restarts had happened when it started
    ledger_moves: int  # how many restores (which move the ledger back) had happened when it started

    def wait(self, timeout: float | None = JOB_TIMEOUT) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the job's whole group: the driver and whatever it started (JVM, Python workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def tail(self, lines: int = 5) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        return " | ".join(line for line in text[-lines:])


@dataclass
class Summary:
    seed: int
    faults: collections.Counter = field(default_factory=collections.Counter)
    job_failures: list[str] = field(default_factory=list)
    batches: int = 0
    kafka_records: int = 0
    table_rows: int = 0
    quarantined: int = 0
    missing: int = 0
    duplicated: int = 0
    unexpected: int = 0
    wrong: int = 0  # rows or quarantine rows unlike their record
    # Kafka unlike what the producers were told (lost, resurrected or changed records): the broker's findings
    kafka_vs_producers: int = 0
    journaled: int = 0  # records whose producer saw how their transaction ended, checked against that
    findings: str = ""  # the oracle's report, naming offsets
    audit_ok: bool | None = None  # None: the run ended before its final verdict, so no audit ran
    audit_label: str = "offsetlake audit"  # upsert mode: and the change feed replaying to the table
    seconds: float = 0.0
    produced: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)
    excused: int = 0  # jobs other than streams that failed while a broker restart was under way
    excused_lines: list[str] = field(default_factory=list)  # what each of them printed last
    restores_out_of_reach: int = 0  # restores whose target a checkpoint's log clean-up removed meanwhile
    restores_tried: int = 0  # every restore the faults started (each moves the ledger back when it lands)
    refused_after_restore: list[str] = field(default_factory=list)  # backfills a restore made ingest's
    broker_restarts: int = 0
    left_out: dict = field(default_factory=dict)  # what the oracle left out of its check, by kind: (count, bound)
    streams: list[StreamWatch] = field(default_factory=list)  # streams that met a broker restart
    columns: list[str] = field(default_factory=list)  # the table's, at the end (avro: schema 2's field)

    @property
    def stream_uptime(self) -> float:
        """Share of the time the streams that met a broker restart were up, of the time they were wanted."""
        wanted = sum(w.wanted_seconds for w in self.streams)
        return sum(w.up_seconds for w in self.streams) / wanted if wanted else 1.0

    @property
    def longest_gap(self) -> tuple[float, float]:
        """(seconds, broker down seconds): the longest a stream went without committing across a restart."""
        return max(((w.gap, w.broker_down) for w in self.streams), default=(0.0, 0.0))

    @property
    def injected(self) -> int:
        return sum(self.faults.values())

    @property
    def excused_bound(self) -> int:
        return EXCUSED_PER_RESTART * self.broker_restarts

    @property
    def out_of_reach_bound(self) -> int:
        """Restores the log clean-up may put out of reach: half of those tried, at least one; past it, the
        restore faults tested too little."""
        return max(1, self.restores_tried // 2)

    @property
    def over_bounds(self) -> list[str]:
        """Every count of things excused or left out that passed its bound. A backfill refused because a
        restore moved the ledger below its range during it needs a restore for each."""
        over = [f"{self.excused} failures excused (bound {self.excused_bound})"] * (self.excused > self.excused_bound)
        if self.restores_out_of_reach > self.out_of_reach_bound:
            over.append(f"{self.restores_out_of_reach} restores out of reach (bound {self.out_of_reach_bound})")
        if len(self.refused_after_restore) > self.restores_tried:
            over.append(
                f"{len(self.refused_after_restore)} backfills refused after a restore (bound {self.restores_tried})"
            )
        return over + [f"{n} {kind} (bound {bound})" for kind, (n, bound) in self.left_out.items() if n > bound]

    @property
    def ok(self) -> bool:
        wrong_rows = self.missing or self.duplicated or self.unexpected or self.wrong or self.kafka_vs_producers
        return not wrong_rows and self.audit_ok is True and not self.job_failures and not self.over_bounds

    def table(self) -> str:
        width = max(len(k) for k in [*self.faults, "duplicated (offsets twice)"]) + 2
        lines = [
            f"chaos run, seed {self.seed}: {self.injected} faults injected in {self.seconds:.0f} s",
            "-" * (width + 10),
        ]
        lines += [f"{kind:<{width}}{n:>8}" for kind, n in sorted(self.faults.items())]
        lines += ["-" * (width + 10)]
        rows = [
            ("batches committed (job logs)", self.batches),
            ("kafka records (read_committed)", self.kafka_records),
            ("table rows", self.table_rows),
            ("quarantined", self.quarantined),
            ("checked against the producers' record", self.journaled),
            ("missing", self.missing),
            ("duplicated (offsets twice)", self.duplicated),
            ("unexpected (not in Kafka)", self.unexpected),
            ("values or reasons wrong", self.wrong),
            ("Kafka unlike the producers' record", self.kafka_vs_producers),
        ]
        width = max(width, *(len(k) + 2 for k, _ in rows))
        lines += [f"{k:<{width}}{v:>8}" for k, v in rows]
        lines += [
            f"{self.audit_label:<{width}}{_audit_verdict(self.audit_ok):>8}",
            f"{'job failures (not injected)':<{width}}{len(self.job_failures):>8}",
            *(f"  {failure}" for failure in self.job_failures),
            f"{'ingest/backfill failures excused by a broker restart':<{width}}{self.excused:>8}"
            f"   (bound {self.excused_bound}: {EXCUSED_PER_RESTART} per broker restart)",
            *(f"  {line}" for line in self.excused_lines[:5]),
            f"{'restores whose target the log clean-up removed':<{width}}{self.restores_out_of_reach:>8}"
            f"   (bound {self.out_of_reach_bound}: half of {self.restores_tried} tried, at least 1)",
            f"{'backfills refused: a restore gave ingest their range':<{width}}{len(self.refused_after_restore):>8}"
            f"   (bound {self.restores_tried}: one per restore)",
            *(f"  {line}" for line in self.refused_after_restore[:5]),
            *(
                f"{'left out: ' + kind:<{width}}{count:>8}   (bound {bound})"
                for kind, (count, bound) in sorted(self.left_out.items())
            ),
        ]
        if self.streams:
            gap, down = self.longest_gap
            up = sum(w.up_seconds for w in self.streams)
            lines += [
                f"stream uptime across {len(self.streams)} broker restarts: {100 * self.stream_uptime:.1f}% "
                f"({up:.0f} s up of {sum(w.wanted_seconds for w in self.streams):.0f} s)",
                f"longest gap between a stream's commits across a restart: {gap:.1f} s "
                f"(broker down {down:.1f} s); median "
                f"{statistics.median(w.gap for w in self.streams):.1f} s",
            ]
        lines += [f"producers: {dict(self.produced)}"]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "seed": self.seed,
            "faults": dict(self.faults),
            "injected": self.injected,
            "batches": self.batches,
            "kafka_records": self.kafka_records,
            "table_rows": self.table_rows,
            "quarantined": self.quarantined,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "wrong": self.wrong,
            "kafka_vs_producers": self.kafka_vs_producers,
            "journaled": self.journaled,
            "findings": self.findings,
            "audit_ok": self.audit_ok,
            "job_failures": self.job_failures,
            "seconds": round(self.seconds, 1),
            "produced": self.produced,
            "examples": self.examples,
            "excused": self.excused,
            "excused_bound": self.excused_bound,
            "excused_lines": self.excused_lines,
            "restores_tried": self.restores_tried,
            "restores_out_of_reach": {"count": self.restores_out_of_reach, "bound": self.out_of_reach_bound},
            "refused_after_restore": {"lines": self.refused_after_restore, "bound": self.restores_tried},
            "left_out": {kind: {"count": n, "bound": bound} for kind, (n, bound) in self.left_out.items()},
            "stream_uptime": round(self.stream_uptime, 4),
            "streams": [w.as_dict() for w in self.streams],
        }


@dataclass
class StreamWatch:
    """One stream across one broker restart, seen from outside: when it printed each committed batch
    (its log, polled), whether it stayed up, and its longest stretch without a commit."""

    job: Job
    started: float = field(default_factory=time.monotonic)
    commits: list[float] = field(default_factory=list)  # monotonic times its commit lines were seen
    wanted_until: float = 0.0  # when the harness stopped it, or would have (a stream that died)
    died_at: float | None = None
    broker_down: float = 0.0
    gap: float = 0.0

    def poll(self) -> int:
        text = self.job.log.read_text(errors="replace") if self.job.log.exists() else ""
        seen = text.count(COMMITTED)
        self.commits += [time.monotonic()] * (seen - len(self.commits))
        if self.died_at is None and self.job.proc.poll() is not None:
            self.died_at = time.monotonic()
        return seen

    def watch(self, until: float, done=lambda: False) -> None:
        """Poll until `until`, `done()`, or the stream's death."""
        while True:
            self.poll()
            if self.died_at is not None or done() or time.monotonic() >= until:
                return
            time.sleep(0.2)

    @property
    def wanted_seconds(self) -> float:
        return self.wanted_until - self.started

    @property
    def up_seconds(self) -> float:
        return (self.died_at or self.wanted_until) - self.started

    def as_dict(self) -> dict:
        return {
            "job": self.job.name,
            "commits": len(self.commits),
            "wanted": round(self.wanted_seconds, 1),
            "up": round(self.up_seconds, 1),
            "gap": round(self.gap, 1),
            "broker_down": round(self.broker_down, 1),
        }


class Schedule:
    """Every kind once, in a seeded order (a kind that could not happen yet comes back later),
    then kinds drawn by weight."""

    def __init__(self, rng: random.Random, kinds: dict[str, int] = KINDS):
        self.rng, self.kinds = rng, kinds
        self.uncovered = list(kinds)
        rng.shuffle(self.uncovered)

    def next(self) -> str:
        if self.uncovered:
            return self.uncovered.pop(0)
        return self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]

    def not_reached(self, kind: str, covered: bool) -> None:
        if not covered:
            self.uncovered.append(kind)


class Chaos:
    def __init__(
        self,
        workdir: Path,
        seed: int,
        log,
        lanes: int = 2,
        record_format: str = "json",
        storage: str = "local",
        mode: str = "append",
        engine: str = "delta-rs",
        driver_reads_up_to: int = 0,
    ):
        if engine == "delta-spark" and storage != "local":
            raise ChaosFailure("the delta-spark engine runs on a local table only (it has no S3 settings yet)")
        self.workdir, self.seed, self.log, self.lanes = workdir, seed, log, lanes
        self.engine = engine
        self.upsert = mode == "upsert"
        self.kinds = kinds_for(storage, mode)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.stillness = Stillness()
        self.broker_restarts = 0
        self.ledger_moves = 0
        self.checkpoints = threading.Lock()  # a checkpoint's log clean-up and a RESTORE do not overlap
        # Two lanes restarting nodes at once would start two JVMs on one node's port and data directory
        # (and leave one running), or leave the cluster without a quorum: restarts take turns.
        self.restarting = threading.Lock()
        self.live: list[Job] = []
        self.closing = False
        self.summary = Summary(seed)
        self.deaths = ThreadDeaths()
        self.kafka = embedded_broker.start_cluster(workdir / "kafka", size=3)
        self.topic = f"chaos_{seed}"
        create_topic(self.kafka.bootstrap_servers, self.topic, PARTITIONS)
        self.pipelines = workdir / "pipelines"
        # Avro mode: the demo events in Avro through a Schema Registry, key and headers kept, schema 2
        # arriving mid-run (a column added in the commit of its first record).
        self.registry = embedded_registry.start(workdir / "registry") if record_format == "avro" else None
        avro = (
            {
                "format": {
                    "type": "avro",
                    "schema": [],
                    "registry": {"url": self.registry.url},
                    "key": {"type": "string"},
                    "include_headers": True,
                }
            }
            if self.registry
            else {}
        )
        # Upsert mode: the table keeps the latest record per Kafka key (few keys, tombstones deleting them).
        upsert = {}
        if self.upsert:
            upsert = {"write": {"mode": "upsert", "key": ["kafka_key"]}}
            if not self.registry:
                upsert["format"] = {"key": {"type": "string"}}
        # S3 mode: the table and quarantine on moto's S3 server, reached through the fault proxy.
        self.s3 = self.proxy = None
        tables: dict = {}
        if storage == "s3":
            from hosts import S3Server
            from store_faults import StoreProxy

            self.s3 = S3Server.start(workdir)
            self.proxy = StoreProxy(self.s3.port)
            options = self.s3.storage_options(AWS_ENDPOINT_URL=self.proxy.url)
            lake = f"s3://{self.s3.bucket}/chaos_{seed}"
            tables = {
                "table": {"path": f"{lake}/table", "storage_options": options},
                "quarantine": {"path": f"{lake}/quarantine", "storage_options": options},
            }
        if engine != "delta-rs":
            tables["table"] = {**tables.get("table", {}), "engine": engine}
        name = write_pipeline(
            self.pipelines,
            self.kafka.bootstrap_servers,
            [self.topic],
            workdir / "lake",
            name=f"chaos_{seed}",
            batch={
                "max_records_per_batch": 4000,
                "max_records_per_task": 1500,
                "read_timeout_seconds": 30,
                "driver_reads_up_to": driver_reads_up_to,
            },
            **avro,
            **upsert,
            **tables,
        )
        self.cfg = load(self.pipelines, name)
        self.journal = oracle.Journal()  # what the workload's producers committed and aborted
        self.workload = Workload(
            self.cfg.kafka,
            self.topic,
            seed,
            self.journal,
            registry_url=self.registry.url if self.registry else None,
            keys=UPSERT_KEYS if self.upsert else None,
        )
        self.jobs = 0
        self.tries = 0  # faults drawn, injected or not

    # -- processes -------------------------------------------------------------------------------

    def start(
        self,
        command: str,
        *args: str,
        fault: str | None = None,
        fault_dir: Path | None = None,
        ledger_moves: int | None = None,
    ) -> Job:
        """`ledger_moves`: the restores counted when the job's arguments were read from the ledger (a backfill's
        span), if before now."""
        with self.lock:
            self.jobs += 1
            number = self.jobs
        log = self.workdir / "logs" / f"{number:04d}-{command}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # One Spark core and a JVM tuned to start fast: many short jobs share two cores here,
        # and neither changes the code paths the faults hit.
        env = {
            **os.environ,
            "OFFSETLAKE_HOME": str(REPO),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "OFFSETLAKE_SPARK_MASTER": "local[1]",
            "JDK_JAVA_OPTIONS": f"{DRIVER_JIT} -XX:+UseSerialGC",
            # An error offsetlake does not know leaves its traceback in the job's log, to be found; its own
            # errors stay one line (so a broker restart's Kafka error is still told from anything else).
            "OFFSETLAKE_DEBUG": "1",
        }
        if self.engine == "delta-spark":
            env["PYSPARK_SUBMIT_ARGS"] = delta_spark_submit_args()
        env.pop("OFFSETLAKE_FAULT", None)
        if fault:
            env["OFFSETLAKE_FAULT"] = fault
            env["OFFSETLAKE_FAULT_DIR"] = str(fault_dir or self.workdir)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "offsetlake.cli",
                    command,
                    "--pipeline",
                    self.cfg.name,
                    "--pipelines-dir",
                    str(self.pipelines),
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        moves = self.ledger_moves if ledger_moves is None else ledger_moves
        job = Job(f"{command}#{number}", proc, log, self.broker_restarts, moves)
        with self.lock:
            self.live = [j for j in self.live if j.proc.poll() is None] + [job]
            closing = self.closing
        if closing:  # started as the run was being closed: close() may have listed the jobs already
            job.kill()
            raise ChaosFailure(f"{job.name}: started while the run was closing")
        return job

    def running_jobs(self) -> int:
        with self.lock:
            return sum(1 for job in self.live if job.proc.poll() is None)

    def finish(self, job: Job, may_fail: bool = False) -> int | None:
        """Wait for a job nobody killed; a failure is recorded unless a fault explains it."""
        rc = job.wait()
        job.kill()  # whatever the driver left behind (its JVM) goes with its group
        return self.account(job, rc, may_fail)

    def account(self, job: Job, rc: int | None, may_fail: bool = False) -> int | None:
        """A job that exited non-zero, or hung past JOB_TIMEOUT, is a failure unless a fault the harness
        injected explains it; the summary counts the ones a broker restart excused."""
        # Another lane restarted the broker: an ingest or backfill may fail (Airflow retries it), but a
        # stream must ride it out (kafka.retry_seconds), so its failure is never excused.
        excused = (
            job.broker_restarts != self.broker_restarts
            and not job.name.startswith("stream")
            and rc not in (0, None)
            and one_line_kafka_error(job)
        )
        if excused and not may_fail:
            with self.lock:
                self.summary.excused += 1
                self.summary.excused_lines.append(f"{job.name}: {job.tail(1)}")
        may_fail = may_fail or excused
        # A backfill planned from the ledger is rightly refused when another lane's restore moved the
        # ledger back below its range meanwhile: the product was right, so it is no unexplained failure.
        refused = job.ledger_moves != self.ledger_moves and "ingest owns those offsets" in job.tail(3)
        if refused and rc not in (0, None) and not may_fail:
            with self.lock:
                self.summary.refused_after_restore.append(f"{job.name}: {job.tail(1)}")
        may_fail = may_fail or refused
        if rc is None:
            self.summary.job_failures.append(f"{job.name}: still running after {JOB_TIMEOUT}s, killed")
        elif rc != 0 and not may_fail:
            self.summary.job_failures.append(f"{job.name}: exit {rc}: {job.tail(2)}")
        return rc

    def restart_broker(self, rng: random.Random, whole: bool) -> float:
        """SIGKILL one node (`whole`: SIGTERM all three), start it (them) again on the same ports and data;
        returns how long the cluster was not whole. The producers keep writing throughout."""
        with self.restarting:
            with self.lock:
                self.broker_restarts += 1
                self.summary.broker_restarts += 1
            down = time.monotonic()
            if whole:
                self.log(f"cluster stopping at {_clock()}")
                self.kafka.stop()
                time.sleep(rng.uniform(0.2, 3.0))
                self.kafka = embedded_broker.start_cluster(self.kafka.data_dir, size=3)
            else:
                node = rng.choice(self.kafka.nodes).node_id
                self.log(f"node {node} killed at {_clock()}")
                self.kafka.kill(node)
                time.sleep(rng.uniform(1.0, 4.0))
                self.kafka.start_node(node)
            self.log(f"cluster whole at {_clock()}")
            with self.lock:
                self.broker_restarts += 1  # jobs started while it was not whole may fail too
            return time.monotonic() - down

    # -- faults: each returns True if the fault really happened -------------------------------------

    def kill_at(self, rng: random.Random, point: str) -> bool:
        """The job SIGKILLs itself at `point`. Exit 0: it had nothing to do there (not reached). Any other
        end (a crash, a hang) is accounted as a job failure, as for a job nobody killed."""
        fault_dir = self.workdir / "faults" / uuid.uuid4().hex[:8]
        job = self.start("ingest", fault=f"{point}:exit", fault_dir=fault_dir)
        rc = job.wait()
        job.kill()  # whatever the driver left behind (its JVM) goes with its group
        # The fault point says it is about to kill the job: a SIGKILL without its word came from elsewhere.
        if rc == -signal.SIGKILL and (fault_dir / f"{point}.killed").exists():
            return True
        self.account(job, rc)
        return False

    def job_args(self, rng: random.Random, command: str, stream_seconds: float | None = None) -> tuple[str, ...] | None:
        """Arguments for an ingest, a stream (bounded when asked) or a backfill of a committed span;
        None when the job cannot run yet (no committed span to backfill)."""
        if command == "stream":
            return ("--interval", "0.5", *(("--max-seconds", f"{stream_seconds:.1f}") if stream_seconds else ()))
        if command == "backfill":
            span = self.committed_span(rng)
            return None if span is None else ("--ranges", span)
        return ()

    def kill_random(self, rng: random.Random, command: str) -> bool:
        moves = self.ledger_moves  # before a backfill's span is read from the ledger
        args = self.job_args(rng, command)
        if args is None:
            return False
        job = self.start(command, *args, ledger_moves=moves)
        if job.wait(rng.uniform(0.5, 10.0)) is not None:
            self.finish(job)
            return False  # done before the kill: no fault
        job.kill()
        return True

    def committed_span(self, rng: random.Random) -> str | None:
        """A random offset range below the ledger, for a backfill; None before there is one."""
        try:
            # The partitions it created, not the broker's word: the other lane may have the cluster down.
            ledger = ledger_offsets(self.cfg, [(self.topic, p) for p in range(PARTITIONS)])
        except TableError:  # no table yet: the fault is "not reached", and comes back later
            return None
        offsets = {tp: o for tp, o in ledger.items() if o and o > 1}
        if not offsets:
            return None
        (topic, partition), end = rng.choice(sorted(offsets.items()))
        start = rng.randrange(0, end - 1)
        return f"{topic}:{partition}:{start}-{rng.randint(start + 1, min(end, start + 3000))}"

    def duplicate_runs(self, rng: random.Random) -> bool:
        first, second = self.start("ingest"), self.start("ingest")
        self.finish(first)
        self.finish(second)
        return True

    def zombie(self, rng: random.Random, point: str) -> bool:
        """The zombie freezes at `point` with its batch written; a retry of the same batch, held
        just before its commit until then, commits; then the zombie goes on with its stale attempt.
        Both start together so their JVMs start side by side."""
        zombie_dir, retry_dir = (self.workdir / "faults" / uuid.uuid4().hex[:8] for _ in range(2))
        zombie_dir.mkdir(parents=True)
        retry_dir.mkdir(parents=True)
        zombie = self.start("ingest", fault=f"{point}:pause", fault_dir=zombie_dir)
        retry = self.start("ingest", fault="after_files_written:pause", fault_dir=retry_dir)
        reached = zombie_dir / f"{point}.reached"
        self.wait_for(reached, zombie)
        self.wait_for(retry_dir / "after_files_written.reached", retry)
        (retry_dir / "after_files_written.release").touch()
        self.finish(retry)
        (zombie_dir / f"{point}.release").touch()
        self.finish(zombie)  # must stand down (already committed / superseded) and exit 0
        return reached.exists()

    @staticmethod
    def wait_for(marker: Path, job: Job) -> None:
        deadline = time.monotonic() + JOB_TIMEOUT
        while not marker.exists() and job.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)

    def alongside_a_job(self, rng: random.Random, action, what: str) -> bool:
        """Hit the jobs other lanes are running; if there are none, start an ingest to hit. True when a job
        was running as the action began: a fault "during" a job that met none is not one (not reached)."""
        job = None if self.running_jobs() else self.start("ingest")
        time.sleep(rng.uniform(0.5, 6.0 if job is None else 3.0))  # our own ingest: hit it before it is done
        overlapped = self.running_jobs() > 0
        bounded(action, what)
        if job is not None:
            self.finish(job)
        return overlapped

    def broker_restart(self, rng: random.Random, whole: bool) -> bool:
        # A job may fail meanwhile: excused only with offsetlake's one-line Kafka error (account).
        return self.alongside_a_job(rng, lambda: self.restart_broker(rng, whole), "a broker restart")

    def broker_restart_during_stream(self, rng: random.Random, whole: bool) -> bool:
        """Availability, not only exactness: a stream that meets a node's death or the cluster's restart
        stays up and commits again once the cluster is whole. A stream that dies, or commits nothing within
        RECOVERY_LIMITS seconds of that, is a job failure (never excused)."""
        job = self.start("stream", *self.job_args(rng, "stream"))
        watch = StreamWatch(job)
        watch.watch(until=time.monotonic() + rng.uniform(3.0, 10.0))  # sometimes while its JVM starts
        # The gap runs from its last commit before the restart (or the restart, if it had none yet:
        # its JVM was still starting) to its first commit after the broker is back.
        last_before = watch.commits[-1] if watch.poll() else time.monotonic()
        watch.broker_down = self.restart_broker(rng, whole)
        at_return, back = watch.poll(), time.monotonic()
        limit = RECOVERY_LIMITS[self.engine]
        watch.watch(until=back + limit, done=lambda: len(watch.commits) > at_return)
        recovered = len(watch.commits) > at_return
        if recovered:
            watch.watch(until=time.monotonic() + rng.uniform(1.0, 4.0))  # and it keeps going
        watch.gap = (watch.commits[at_return] if recovered else time.monotonic()) - last_before
        watch.wanted_until = time.monotonic() if watch.died_at is None else back + limit
        job.proc.send_signal(signal.SIGTERM)  # a stream stops between batches, with exit 0
        rc = job.wait()
        job.kill()
        failure = (
            f"died across a broker restart (exit {rc})"
            if watch.died_at is not None
            else f"no commit within {limit} s of the broker's return"
            if not recovered
            else f"exit {rc} after SIGTERM"
            if rc != 0
            else None
        )
        with self.lock:
            self.summary.streams.append(watch)
            if failure:
                self.summary.job_failures.append(f"{job.name}: {failure}: {job.tail(2)}")
        return True

    def restore(self, rng: random.Random, how: str) -> bool:
        """(The lane has just checked the table row by row: a restore could erase a duplicate.)"""
        if not self.table_exists():
            return False
        version = self.delta_table().version()
        # Version 0 is the empty table, version 1 usually the first batch (two jobs creating an S3 table at
        # once leave a second create there: a RESTORE to it empties the table, and every partition must be
        # read again); older than the last checkpoint, the log may no longer hold a version (the checkpoint
        # fault cleans it up), so no RESTORE can reach it.
        lowest = max(1, version - 6, self.last_checkpoint())
        if lowest > version - 1:
            return False
        target = rng.randint(lowest, version - 1)

        reached = []

        def restore_now():
            with self.lock:
                self.ledger_moves += 1
                self.summary.restores_tried += 1
            try:
                restore_once()
            finally:
                # Counted again once it has landed (or failed): a backfill whose span was read from the ledger
                # while the restore was under way sees the count move when the ledger does.
                with self.lock:
                    self.ledger_moves += 1

        def restore_once():
            try:
                if how == "offsetlake":
                    restore(self.cfg, target)
                    reached.append(True)
                    return
                for _ in range(10):  # an operator re-runs a RESTORE that lost a race with a commit
                    try:
                        self.delta_table().restore(target)
                        reached.append(True)
                        return
                    except CommitFailedError:
                        time.sleep(0.2)
            except (DeltaError, TableError) as err:
                # A checkpoint meanwhile (delta-rs' own, every 100 commits) cleaned the log up past the
                # target: no RESTORE can reach it now. Only that is let pass, counted; any other error, or
                # this one with the target still in the log, fails the run.
                if target >= self.last_checkpoint() or not version_gone(err):
                    raise
                with self.lock:
                    self.summary.restores_out_of_reach += 1

        with self.checkpoints:  # the other lane's checkpoint fault waits: the target stays in the log
            overlapped = self.alongside_a_job(rng, restore_now, f"a restore to version {target}")
        return bool(reached) and overlapped

    def cleanup_during_ingest(self, rng: random.Random) -> bool:
        if not self.table_exists():  # before the first batch made it there is nothing to clean (not reached)
            return False

        def clean():
            cleanup(self.cfg.table_location, 60)
            if self.table_exists(self.cfg.quarantine_location):
                cleanup(self.cfg.quarantine_location, 60)

        return self.alongside_a_job(rng, clean, "a cleanup")

    def table_exists(self, location: Location | None = None) -> bool:
        location = location or self.cfg.table_location
        return DeltaTable.is_deltatable(location.uri, location.storage_options)

    def delta_table(self) -> DeltaTable:
        return self.cfg.table_location.delta_table()

    def last_checkpoint(self) -> int:
        fs, root = self.cfg.table_location.filesystem()

        def read() -> int:
            with fs.open_input_stream(f"{root}/_delta_log/_last_checkpoint") as marker:
                return json.loads(marker.read())["version"]

        try:
            return retrying(self.cfg.table_location, read)  # another lane's fault may have the store away
        except FileNotFoundError:
            return 0

    # -- object storage's faults (storage="s3") ------------------------------------------------------

    def store_refusing(self, rng: random.Random, away: bool) -> bool:
        """The store answers 503 (or is gone) for a few seconds while an ingest runs: the ingest rides it
        out within table.retry_seconds (or, past a planning step, fails and leaves nothing half-written)."""
        job = self.start("ingest")
        time.sleep(rng.uniform(0.5, 5.0))
        overlapped = job.proc.poll() is None
        if away:
            self.proxy.away_for(rng.uniform(1, 4))
        else:
            self.proxy.refuse_for(rng.uniform(1, 6))
        self.finish(job)
        return overlapped

    def store_restart_at_commit(self, rng: random.Random) -> bool:
        """The next commit's log entry is stored, its answer dropped, and the store away for a few seconds:
        the writer must ride out the outage and then know its commit landed."""
        before = self.proxy.seen["lost commit responses"]
        self.proxy.lose_next_commit_response(away=rng.uniform(1, 4))
        self.finish(self.start("ingest"))
        # Nothing to commit: not reached, and the fault stays armed for whichever commit comes next.
        return self.proxy.seen["lost commit responses"] > before

    def compact(self) -> None:
        cfg = self.cfg
        bounded(
            lambda: optimize(
                cfg.table_location, cfg.name, table_schema(cfg), cfg.table.partition_by, cfg.maintenance.target_file_mb
            ),
            "an optimize",
        )

    def optimize_during(self, rng: random.Random, command: str) -> bool:
        """Compaction commits beside a job that commits too: both must land exactly once, or stand down."""
        moves = self.ledger_moves  # before a backfill's span is read from the ledger
        args = self.job_args(rng, command, stream_seconds=rng.uniform(5, 15))
        if args is None or not self.table_exists():
            return False
        job = self.start(command, *args, ledger_moves=moves)
        time.sleep(rng.uniform(0.5, 6.0))
        overlapped = job.proc.poll() is None
        self.compact()
        self.finish(job)
        return overlapped

    def vacuum_during_ingest(self, rng: random.Random) -> bool:
        if not self.table_exists():
            return False
        return self.alongside_a_job(
            rng, lambda: vacuum(self.cfg.table_location, self.cfg.name, retention_hours=1), "a vacuum"
        )

    def checkpoint_during_ingest(self, rng: random.Random) -> bool:
        """A checkpoint, then log clean-up: commit files older than the table's (short) log retention and
        older than the checkpoint are deleted while an ingest reads the ledger and commits."""
        if not self.table_exists():
            return False

        def checkpoint_now():
            for _ in range(10):  # the property change is a commit: it can lose a race with a batch
                try:
                    self.delta_table().alter.set_table_properties({"delta.logRetentionDuration": LOG_RETENTION})
                    break
                except CommitFailedError:
                    time.sleep(0.2)
            record_pending_rewind(self.cfg, DeltaRs(self.cfg).commit)  # as `offsetlake checkpoint` does first
            checkpoint(self.cfg.table_location)

        with self.checkpoints:
            return self.alongside_a_job(rng, checkpoint_now, "a checkpoint")

    def inject(self, rng: random.Random, kind: str) -> bool:
        if kind.startswith("kill@random "):
            return self.kill_random(rng, kind.split()[1])
        if kind.startswith("kill@"):
            return self.kill_at(rng, kind.removeprefix("kill@"))
        if kind.startswith("zombie@"):
            return self.zombie(rng, kind.removeprefix("zombie@"))
        if kind.startswith("restore"):
            return self.restore(rng, "delta-rs" if "delta-rs" in kind else "offsetlake")
        if kind.startswith("optimize during "):
            return self.optimize_during(rng, kind.split()[-1])
        return {
            "duplicate runs": self.duplicate_runs,
            "broker killed (leaders move)": lambda rng: self.broker_restart(rng, whole=False),
            "broker killed during stream": lambda rng: self.broker_restart_during_stream(rng, whole=False),
            "whole cluster restarted": lambda rng: self.broker_restart(rng, whole=True),
            "whole cluster restarted during stream": lambda rng: self.broker_restart_during_stream(rng, whole=True),
            "cleanup during ingest": self.cleanup_during_ingest,
            "vacuum during ingest": self.vacuum_during_ingest,
            "checkpoint during ingest": self.checkpoint_during_ingest,
            "store 503 during ingest": lambda rng: self.store_refusing(rng, away=False),
            "store away during ingest": lambda rng: self.store_refusing(rng, away=True),
            "store restart at commit": self.store_restart_at_commit,
        }[kind](rng)

    # -- checks --------------------------------------------------------------------------------------

    def check_health(self) -> None:
        """The harness's own parts still run: its threads, the producers, the store's fault proxy."""
        self.deaths.check()
        stopped = self.workload.stopped_threads()
        if stopped:
            raise ChaosFailure(f"producer threads stopped before the run ended: {', '.join(stopped)}")
        if self.proxy is not None and self.proxy.proc.poll() is not None:
            raise ChaosFailure(f"the store fault proxy exited ({self.proxy.proc.returncode}); its traceback is above")

    def check_duplicates(self, when: str) -> None:
        if not self.table_exists():
            return
        rows = table_lineage(self.cfg.table_location)
        twice = [k for k, n in collections.Counter(rows).items() if n > 1]
        both = set(rows) & set(quarantine_lineage(self.cfg))
        if twice or both:
            self.summary.duplicated = len(twice) + len(both)
            self.summary.examples = sorted(twice or both)[:5]
            raise ChaosFailure(
                f"{when}: {len(twice)} offsets twice in the table, {len(both)} in table and "
                f"quarantine, e.g. {self.summary.examples}"
            )

    def verify(self, when: str) -> None:
        """Row by row against Kafka read_committed, below the ledger's end (it need not be caught up)."""
        if not self.table_exists():
            return
        self.tally(ledger_offsets(self.cfg))
        s = self.summary
        if s.findings or s.over_bounds:
            raise ChaosFailure(
                f"{when}: the table against Kafka: {s.missing} missing, {s.duplicated} duplicated, "
                f"{s.unexpected} unexpected, {s.wrong} wrong; Kafka against the producers: "
                f"{s.kafka_vs_producers}:\n{s.findings}"
            )

    def tally(self, until: dict, final: bool = False) -> None:
        """The oracle, values and producer-side truth included. The quarantine commit comes first, so a job
        killed before its table commit leaves the quarantine ahead of the ledger; the next batch skips those:
        they are counted once the ledger is there."""
        bounds = left_out_bounds(self.summary.broker_restarts)
        found = bounded(
            lambda: oracle.check(self.cfg, until, quarantine_ahead=not final, journal=self.journal, bounds=bounds),
            "the oracle",
        )
        s = self.summary
        s.left_out = {kind: (n, bounds.get(kind, 0)) for kind, n in found.left_out.items()}
        s.kafka_records, s.table_rows, s.quarantined = found.kafka_records, found.table_rows, found.quarantined
        s.journaled = found.journaled
        s.missing = found.count(oracle.MISSING)
        s.duplicated = found.count(oracle.DUPLICATED, oracle.QUARANTINED_TWICE, oracle.BOTH)
        s.unexpected = found.count(oracle.UNEXPECTED, oracle.QUARANTINE_UNEXPECTED)
        s.wrong = found.count(
            oracle.WRONG_VALUE,
            oracle.QUARANTINE_WRONG,
            oracle.GOOD_QUARANTINED,
            oracle.BAD_NOT_QUARANTINED,
            oracle.SCHEMA,
        )
        s.kafka_vs_producers = found.count_of(oracle.KAFKA_VS_PRODUCERS)
        counted = s.missing + s.duplicated + s.unexpected + s.wrong + s.kafka_vs_producers
        if counted != sum(len(f) for f in found.kinds.values()):  # a kind the lines above do not know
            raise ChaosFailure(f"the oracle found kinds the summary does not count:\n{found.report()}")
        s.examples, s.findings = found.examples(), found.report()

    def final_verdict(self) -> None:
        self.check_health()
        self.workload.stop()
        self.deaths.check()
        self.summary.produced = dict(self.workload.counts)
        self.wait_for_open_transactions()
        ledger = self.final_ingest()
        self.tally(ledger, final=True)  # the ledger at the LSO: no quarantine row may stand ahead of it now
        self.summary.columns = [f.name for f in self.delta_table().schema().fields]
        # Counted from what the jobs printed: the table's history is cut short by the log clean-up the
        # checkpoint fault runs (one minute of log), and restores rewind batch numbers.
        self.summary.batches = sum(
            log.read_text(errors="replace").count(COMMITTED) for log in (self.workdir / "logs").glob("*.log")
        )
        self.summary.audit_ok = bounded(lambda: audit(self.cfg).ok, "the audit")  # upsert: its own fold
        if self.upsert:  # and the change feed must replay to the table
            self.summary.audit_label = "offsetlake audit, change feed"
            replays = bounded(lambda: oracle.change_feed_replays(self.cfg), "the change feed replay")
            self.summary.audit_ok = self.summary.audit_ok and replays

    def final_ingest(self) -> dict:
        """A clean ingest that must bring the ledger to the LSO it started from. The LSO may move on after it
        started: a transaction a dropped producer left open with no record yet (it holds no LSO back, so
        wait_for_open_transactions cannot see it) ends when Kafka aborts it, and its markers move the LSO
        by one per partition (a short run in `make test` met it: the ledger one behind in every partition).
        Then it ingests again, until the LSO holds still, for at most twice the transaction timeout."""
        deadline = time.monotonic() + 2 * TRANSACTION_TIMEOUT_MS / 1000 + 10
        while True:
            before = self.kafka_ends("latest")
            job = self.start("ingest")
            if self.finish(job) != 0:
                raise ChaosFailure(f"the final clean ingest failed: {job.tail(3)}")
            lso, ledger = self.kafka_ends("latest"), ledger_offsets(self.cfg)
            if ledger == lso:
                return ledger
            short = {tp: end for tp, end in before.items() if ledger.get(tp, 0) < end}
            if short or time.monotonic() > deadline:
                raise ChaosFailure(
                    f"after the final ingest the ledger {ledger} is not at the LSO {lso} (at its start: {before})"
                )
            time.sleep(1)

    def kafka_ends(self, which: str) -> dict[tuple[str, int], int]:
        """{(topic, partition): offset} of the run's topic, "latest" (the LSO) or "high" (the high watermark), as
        the oracle's own admin client hears them from the broker (not through offsetlake's Kafka client)."""
        settings = {"bootstrap.servers": self.cfg.kafka.bootstrap_servers, **self.cfg.kafka.client}
        ends = oracle.kafka_offsets(settings, self.topic, oracle.kafka_partitions(settings, self.topic), which)
        return {(self.topic, p): end for p, end in ends.items()}

    def wait_for_open_transactions(self) -> None:
        """Until no transaction holds the LSO back (LSO = high watermark): a producer the workload dropped
        after an error left its transaction open, and Kafka aborts it after transaction.timeout.ms. One still
        open after twice that is the broker's failure to keep its promise, and ends the run."""
        deadline = time.monotonic() + 2 * TRANSACTION_TIMEOUT_MS / 1000 + 10
        while True:
            lso, high = self.kafka_ends("latest"), self.kafka_ends("high")
            if lso == high:
                return
            if time.monotonic() > deadline:
                raise ChaosFailure(f"Kafka kept transactions open past their timeout: LSO {lso}, high watermark {high}")
            time.sleep(1)

    # -- the run ---------------------------------------------------------------------------------------

    def lane(self, number: int, schedule, faults: int, errors: list) -> None:
        rng = random.Random(self.seed * 1000 + number)
        try:
            while not errors:
                with self.lock:
                    if self.summary.injected >= faults and (
                        not schedule.uncovered or self.summary.injected >= 2 * faults
                    ):
                        return
                    if self.tries >= MAX_TRIES_PER_FAULT * faults:  # the test then names the kinds never injected
                        return
                    self.tries += 1
                    kind = schedule.next()
                t0 = time.monotonic()
                if kind.startswith("restore"):
                    with self.stillness.still():
                        self.verify(f"before {kind}")  # a restore could erase the evidence of a duplicate
                with self.stillness.busy():
                    injected = self.inject(rng, kind)
                with self.lock:
                    if injected:
                        self.summary.faults[kind] += 1
                    else:
                        schedule.not_reached(kind, covered=self.summary.faults[kind] > 0)
                    done, again = self.summary.injected, not injected and self.summary.faults[kind] == 0
                _watchdog()
                self.log(
                    f"[{done:>4}/{faults}] lane {number} {kind:<28} "
                    f"{'injected' if injected else 'not reached'} ({time.monotonic() - t0:.1f} s)"
                )
                if again:
                    # It could not happen yet (no table, no committed span, nothing to restore to above the
                    # last checkpoint): an ingest moves the table on before the kind comes back. Without
                    # it, two lanes could draw only that kind, forever, with nothing committing.
                    with self.stillness.busy():
                        self.finish(self.start("ingest"))
                self.check_health()
                self.check_duplicates(f"after {kind}")
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            errors.append(err)

    def run(self, faults: int) -> Summary:
        started = time.monotonic()
        _watchdog()
        self.workload.start()
        time.sleep(2)
        errors: list[BaseException] = []
        schedule = Schedule(self.rng, self.kinds)
        try:
            lanes = [  # daemons: a harness stopped by a signal does not wait for them
                threading.Thread(target=self.lane, args=(n, schedule, faults, errors), name=f"lane-{n}", daemon=True)
                for n in range(1, self.lanes + 1)
            ]
            for t in lanes:
                t.start()
            for t in lanes:
                t.join()
            if errors:
                raise errors[0]
            self.final_verdict()
        finally:
            self.workload.stop_event.set()
            self.summary.seconds = time.monotonic() - started
        return self.summary

    def close(self) -> None:
        """Stop what the run started: its jobs still running (a run stopped early), then the services."""
        self.workload.stop_event.set()
        with self.lock:
            self.closing = True
            live = list(self.live)
        for job in live:
            job.kill()
        # A lane may be restarting the cluster (a run stopped by a signal): wait for it, so that the nodes
        # it starts are the ones stopped here, not left running after the harness.
        waited = self.restarting.acquire(timeout=RESTART_WAIT_SECONDS)
        try:
            self.kafka.stop()
        finally:
            if waited:
                self.restarting.release()
        if self.registry is not None:
            embedded_registry.stop(self.registry.pid)
        if self.proxy is not None:
            self.proxy.stop()
        if self.s3 is not None:
            self.s3.stop()


def _audit_verdict(ok: bool | None) -> str:
    return "not run" if ok is None else "ok" if ok else "FAILED"


def _clock() -> str:
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def _print(*args) -> None:
    print(*args, flush=True)


def run(
    faults: int,
    seed: int | None = None,
    workdir: Path | None = None,
    log=_print,
    lanes: int = 2,
    record_format: str = "json",
    storage: str = "local",
    mode: str = "append",
    engine: str = "delta-rs",
    driver_reads_up_to: int = 0,
) -> Summary:
    seed = random.randrange(1_000_000) if seed is None else seed
    workdir = Path(workdir or tempfile.mkdtemp(prefix="offsetlake-chaos-"))
    log(
        f"chaos: seed {seed}, {faults} faults, {record_format} records, {storage} table, {mode}, {engine} engine, "
        f"{f'batches of up to {driver_reads_up_to} offsets' if driver_reads_up_to else 'no batch'} read by the "
        f"driver, work in {workdir}"
    )
    replay = replay_args(seed, faults, record_format, storage, mode, engine, driver_reads_up_to)
    logging.getLogger("offsetlake.librdkafka").setLevel(logging.CRITICAL)  # a restarting node is expected
    workdir.mkdir(parents=True, exist_ok=True)
    chaos = Chaos(workdir, seed, log, lanes, record_format, storage, mode, engine, driver_reads_up_to)
    try:
        with chaos.deaths:
            summary = chaos.run(faults)
    except ChaosFailure as err:
        log(chaos.summary.table())
        raise ChaosFailure(f"{err} -- replay: make chaos CHAOS_ARGS='{replay}'") from None
    finally:
        chaos.close()
    (workdir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    log(summary.table())
    return summary


def replay_args(
    seed: int, faults: int, record_format: str, storage: str, mode: str, engine: str, driver_reads_up_to: int
) -> str:
    """The harness's command-line arguments that run a run's draws again."""
    return (
        f"--seed {seed} --faults {faults} --format {record_format} --storage {storage} --mode {mode} "
        f"--engine {engine} --driver-reads-up-to {driver_reads_up_to}"
    )


# No fault takes this long: if none ends within it, every thread's stack goes to stderr (and again each
# period), so a run that hangs says where, instead of only stopping to print.
STALL_REPORT_SECONDS = 600


def _watchdog() -> None:
    """(Re)arm the stall report: called each time a fault ends."""
    faulthandler.dump_traceback_later(STALL_REPORT_SECONDS, repeat=True, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--lanes", type=int, default=2, help="faults injected side by side (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, table, broker data)")
    parser.add_argument(
        "--format",
        choices=["json", "avro"],
        default="json",
        help="the records: JSON, or Avro through a Schema Registry with a schema change mid-run",
    )
    parser.add_argument(
        "--storage",
        choices=["local", "s3"],
        default="local",
        help="the table on local disk, or on an S3 server behind a fault proxy (adds the store's faults)",
    )
    parser.add_argument(
        "--mode",
        choices=["append", "upsert"],
        default="append",
        help="the table: every record a row, or the latest record per Kafka key (MERGE; no backfill faults)",
    )
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "delta-spark"],
        default="delta-rs",
        help="the commit engine of the pipeline's jobs (delta-spark: local storage only)",
    )
    parser.add_argument(
        "--driver-reads-up-to",
        type=int,
        default=0,
        help="batch.driver_reads_up_to: a batch of at most this many offsets read by the driver (default 0: off)",
    )
    args = parser.parse_args(argv)
    # `kill <harness>` or a CI timeout: unwind, so the run's brokers, jobs and servers are stopped by PID.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <harness>`: where is each thread
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="offsetlake-chaos-"))
    try:
        summary = run(
            args.faults,
            args.seed,
            workdir,
            lanes=args.lanes,
            record_format=args.format,
            storage=args.storage,
            mode=args.mode,
            engine=args.engine,
            driver_reads_up_to=args.driver_reads_up_to,
        )
    except ChaosFailure as err:
        print(f"CHAOS FAILED: {err}", file=sys.stderr)
        print(f"logs kept in {workdir}", file=sys.stderr)
        return 1
    if not summary.ok:
        replay = replay_args(
            summary.seed, args.faults, args.format, args.storage, args.mode, args.engine, args.driver_reads_up_to
        )
        print(
            f"CHAOS FAILED: seed {summary.seed}: the audit failed or a job failed with no fault to explain it "
            f"(see the summary) -- replay: make chaos CHAOS_ARGS='{replay}'",
            file=sys.stderr,
        )
        print(f"logs kept in {workdir}", file=sys.stderr)
        return 1
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
