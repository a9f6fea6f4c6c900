"""What every offsetlake commit says about itself: its `userMetadata`, one typed definition.

Spark's `DESCRIBE HISTORY` shows it as `userMetadata`; delta-rs' `history()` as
the `userMetadata` key of each entry. It is written by `CommitMetadata.to_json`
and read back by `CommitMetadata.from_history` only, so the writer and every
reader (ledger, audit, status, Airflow) agree on one shape. Readers are
tolerant: fields they do not know (written by a newer offsetlake) are ignored,
and a commit whose metadata is not offsetlake's is simply not a pipeline commit.

The `txn` actions are the ledger; this is its human-readable account, plus what
only history can tell: who ran the commit, rewinds, recorded data loss.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from offsetlake import __version__
from offsetlake.kafka import TP
from offsetlake.protocol.ranges import OffsetRange

Kind = Literal["ingest", "backfill", "reset", "restore", "quarantine", "optimize", "vacuum", "checkpoint"]
# Commits that set the ledger (carry the pipeline's txn actions). Backfills rewrite rows but leave it alone.
LEDGER_KINDS = ("ingest", "reset", "restore")
# {topic: {partition: offset}} and {topic: {partition: [start, end)}}: JSON keys are strings.
Offsets = dict[str, dict[str, int]]
Ranges = dict[str, dict[str, list[int]]]


class Run(msgspec.Struct, omit_defaults=True, frozen=True):
    """Who made a commit: an Airflow task try, or someone at the command line."""

    by: str = ""  # "airflow" or "cli"; no default value, so that it is always written
    host: str | None = None
    user: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    try_number: int | None = None
    via: str | None = None  # "stream": a batch of `offsetlake stream`; "repair": a backfill that repair made

    @staticmethod
    def here(dag_id: str | None = None, run_id: str | None = None, try_number: int | None = None) -> Run:
        """This process: an Airflow task when a dag id is given (or in the task's environment), else the CLI."""
        if dag_id is None and os.environ.get("AIRFLOW_CTX_DAG_ID"):
            dag_id, run_id = os.environ["AIRFLOW_CTX_DAG_ID"], os.environ.get("AIRFLOW_CTX_DAG_RUN_ID")
            text = os.environ.get("AIRFLOW_CTX_TRY_NUMBER", "")
            try_number = int(text) if text.isdigit() else None
        by = "airflow" if dag_id else "cli"
        return Run(by, socket.gethostname(), _user(), dag_id, run_id, try_number)

    def is_task_try(self, dag_id: str, run_id: str, try_number: int | None) -> bool:
        return (self.dag_id, self.run_id) == (dag_id, run_id) and try_number in (None, self.try_number)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return str(os.getuid())


class Records(msgspec.Struct, omit_defaults=True, frozen=True):
    read: int = 0  # records Kafka returned for the ranges
    rows: int = 0  # rows added to the table
    quarantined: int = 0
    removed: int = 0  # backfill: rows replaced


class Rewind(msgspec.Struct, frozen=True, rename={"from_": "from"}):
    """A RESTORE took the ledger back: the offsets as of the restored version, written by the next commit."""

    restore_commit: int
    restored_version: int
    from_: Offsets
    to: Offsets


class CommitMetadata(msgspec.Struct, omit_defaults=True, frozen=True, rename={"from_": "from"}):
    pipeline: str
    kind: Kind
    batch: int | None = None  # ledger kinds: the batch number this commit makes the last
    attempt: str | None = None  # the attempt id in the names of the files this commit adds
    ranges: Ranges = {}
    records: Records = Records()
    run: Run = Run()
    offsetlake: str = ""  # the version that wrote it (set by the writers, so always written)
    lost: Ranges = {}  # on_data_loss: skip -- offsets deleted from Kafka before they were read
    rewind: Rewind | None = None
    initialised_at: Offsets = {}  # starting_offsets: latest -- where the first batch pinned the ledger
    reason: str | None = None  # reset
    from_: Offsets = {}  # reset, restore: the ledger before
    offsets: Offsets = {}  # reset, restore: the ledger after
    restored_version: int | None = None  # restore
    seconds: float | None = None  # ingest: from planning to the commit
    conflicts: int = 0  # commits by others that landed first, each followed by a new decision
    lag: int | None = None  # ingest: records between the ledger and Kafka's end offsets when this batch was planned
    # Debezium upserts: values a primary-key change's new row lacked (TOASTed, left unchanged), taken from the
    # old key's row; and those no row held (the old row was never captured), left null.
    carried_over: int = 0
    left_null: int = 0

    def to_json(self) -> str:
        stamped = self if self.offsetlake else msgspec.structs.replace(self, offsetlake=__version__)
        return _ENCODER.encode(stamped).decode()

    @staticmethod
    def parse(raw: str | None) -> CommitMetadata | None:
        """The metadata of an offsetlake commit, or None for anything else (other writers, other tools)."""
        if not raw or '"pipeline"' not in raw:
            return None
        try:
            return _DECODER.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def sets_ledger(self) -> bool:
        return self.kind in LEDGER_KINDS

    @property
    def change(self) -> str:
        """What changed the table, as users name it: a stream's batch or a repair's backfill by that name."""
        return self.run.via or self.kind


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(CommitMetadata)


class HistoryEntry(msgspec.Struct, frozen=True):
    """One pipeline commit as the table history shows it."""

    version: int
    timestamp: int  # epoch ms
    operation: str | None
    meta: CommitMetadata

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for `offsetlake history --json` and Airflow XCom."""
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "operation": self.operation,
            **msgspec.to_builtins(self.meta),
        }


def flat_offsets(offsets: dict[TP, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def unflat_offsets(offsets: Offsets) -> dict[TP, int]:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


def ranges_json(ranges: Iterable[OffsetRange]) -> Ranges:
    out: Ranges = {}
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition)):
        out.setdefault(r.topic, {})[str(r.partition)] = [r.start, r.end]
    return out
