"""What both audits (audit.py, fold.py) share: the ranges they read by default, and the ledger's checks."""

from __future__ import annotations

from offsetlake.kafka import TP
from offsetlake.protocol.metadata import HistoryEntry
from offsetlake.protocol.ranges import OffsetRange


def audited_ranges(tps: list[TP], log_starts: dict[TP, int], committed: dict[TP, int]) -> list[OffsetRange]:
    """What an audit reads by default: each partition from its log start to the ledger."""
    return [OffsetRange(t, p, log_starts[(t, p)], max(log_starts[(t, p)], committed.get((t, p), 0))) for t, p in tps]


def continuity_issues(history: list[HistoryEntry]) -> list[str]:
    """Each ingest must start where the ledger stood (previous end, a reset, a rewind or recorded loss)."""
    expected: dict[tuple[str, str], int] = {}
    issues = []
    for h in history:
        meta = h.meta
        if not meta.sets_ledger():
            continue
        if meta.kind in ("reset", "restore") or meta.rewind:
            positions = meta.offsets or (meta.rewind.to if meta.rewind else {})
            expected = {(t, p): o for t, parts in positions.items() for p, o in parts.items()}
        for t, parts in meta.lost.items():
            for p, (_lo, hi) in parts.items():
                expected[(t, p)] = hi
        for t, parts in meta.ranges.items():
            for p, (start, end) in parts.items():
                want = expected.get((t, p))
                if want is not None and start != want:
                    what = "gap" if start > want else "overlap"
                    issues.append(
                        f"batch {meta.batch} (version {h.version}): {t}[{p}] starts at {start} "
                        f"but the ledger stood at {want} ({what})"
                    )
                expected[(t, p)] = end
    return issues


def sanity_issues(committed: dict[TP, int], ends: dict[TP, int]) -> list[str]:
    return [
        f"{t}[{p}]: ledger at {committed[(t, p)]} is past Kafka's end {ends[(t, p)]}: the topic was "
        f"recreated or truncated"
        for (t, p) in sorted(committed)
        if (t, p) in ends and committed[(t, p)] > ends[(t, p)]
    ]
