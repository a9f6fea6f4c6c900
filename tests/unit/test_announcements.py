"""How the table's commits are grouped into Asset event payloads (pure logic: `changes.announcements`)."""

from offsetlake.operations import changes
from offsetlake.operations.changes import TableCommit, announcements
from offsetlake.protocol.metadata import CommitMetadata, Records, Run


def ingest(version: int, ranges: dict, rows: int, via: str | None = None) -> TableCommit:
    meta = CommitMetadata(
        "p", "ingest", batch=version, ranges=ranges, records=Records(rows, rows, 1), run=Run("airflow", via=via)
    )
    return TableCommit(version, 1000 * version, "WRITE", meta)


def test_consecutive_commits_of_one_kind_are_one_event_with_their_ranges_merged():
    commits = [
        TableCommit(0, 0, "CREATE TABLE", None),
        ingest(1, {"t": {"0": [0, 10], "1": [0, 5]}}, 14, via="stream"),
        ingest(2, {"t": {"0": [10, 20]}}, 9, via="stream"),
        TableCommit(3, 3000, "OPTIMIZE", CommitMetadata("p", "optimize", records=Records(rows=23))),
        ingest(4, {"t": {"1": [5, 8]}}, 3),
        TableCommit(5, 5000, "DELETE", None),
    ]

    events = announcements("p", "/lake/p", commits)

    assert [(e["kind"], e["versions"]) for e in events] == [
        ("create", [0]),
        ("stream", [1, 2]),
        ("optimize", [3]),
        ("ingest", [4]),
        ("other", [5]),
    ]
    assert events[1]["ranges"] == {"t": {"0": [0, 20], "1": [0, 5]}}
    assert (events[1]["rows"], events[1]["quarantined"]) == (23, 2)
    assert events[4]["operation"] == "DELETE" and events[4]["ranges"] == {}
    assert all(e["pipeline"] == "p" and e["table"] == "/lake/p" for e in events)


def test_a_long_backlog_comes_as_several_events(monkeypatch):
    monkeypatch.setattr(changes, "MAX_VERSIONS_PER_EVENT", 3)
    commits = [ingest(v, {"t": {"0": [v, v + 1]}}, 1, via="stream") for v in range(1, 8)]

    events = announcements("p", "/lake/p", commits)

    assert [e["versions"] for e in events] == [[1, 2, 3], [4, 5, 6], [7]]
    assert [e["ranges"]["t"]["0"] for e in events] == [[1, 4], [4, 7], [7, 8]]


def test_nothing_new_is_no_event():
    assert announcements("p", "/lake/p", []) == []
