"""Audit's ledger checks on a commit history (pure logic)."""

from __future__ import annotations

from offsetlake.operations.audit import continuity_issues
from offsetlake.protocol.metadata import CommitMetadata, HistoryEntry


def entry(version: int, batch: int, kind: str, **fields) -> HistoryEntry:
    return HistoryEntry(version, 0, "WRITE", CommitMetadata("p", kind, batch=batch, **fields))


def test_audit_flags_ledger_gaps():
    history = [
        entry(1, 1, "ingest", ranges={"t": {"0": [0, 10]}}),
        entry(2, 2, "ingest", ranges={"t": {"0": [12, 20]}}),
        entry(3, 3, "backfill", ranges={"t": {"0": [0, 5]}}),  # backfills do not move the ledger
        entry(4, 4, "reset", offsets={"t": {"0": 50}}),
        entry(5, 5, "ingest", ranges={"t": {"0": [50, 60]}}),  # starts where the reset put the ledger
    ]
    assert continuity_issues(history) == ["batch 2 (version 2): t[0] starts at 12 but the ledger stood at 10 (gap)"]
