"""The ledger and RESTORE detection against real delta-rs tables on disk (no Kafka, no Spark).

A Delta RESTORE brings back old files but not old `txn` actions: the ledger must
be taken as of the restored version until a pipeline commit records the rewind.
"""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable

from offsetlake.protocol.commit import Change, commit, new_attempt_id
from offsetlake.protocol.ledger import (
    _restored_version,
    commit_history,
    find_unrecorded_restore,
    ledger_at,
    partition_app_id,
    pipeline_app_id,
    pipeline_history,
    read_ledger,
    txn_actions,
    txn_versions,
)
from offsetlake.protocol.metadata import CommitMetadata, HistoryEntry, Rewind, Run, flat_offsets
from offsetlake.storage.delta_log import LEDGER_EXPIRING_PROPERTY
from offsetlake.storage.location import Location
from offsetlake.table import open_table

SCHEMA = pa.schema([("kafka_offset", pa.int64())])
TPS = [("t", 0), ("t", 1)]


@pytest.fixture
def table(tmp_path) -> Location:
    uri = Location.of(str(tmp_path / "table"))
    open_table(uri, SCHEMA, [], "test")  # version 0
    return uri


def ledger_commit(uri: Location, batch: int, offsets: dict, pipeline: str = "p", kind: str = "ingest") -> int:
    meta = CommitMetadata(
        pipeline,
        kind,
        batch=batch,
        attempt=new_attempt_id(),
        run=Run.here(),
        offsets=flat_offsets(offsets) if kind == "reset" else {},
    )
    return commit(uri, lambda t: Change(meta, txns=txn_actions(pipeline, batch, offsets), schema=SCHEMA), kind).version


def other_write(uri: Location) -> int:
    """A commit by someone else (a plain Delta write with no offsetlake metadata)."""
    table = DeltaTable(uri)
    table.create_write_transaction([], mode="append", schema=SCHEMA)
    return table.version() + 1


def test_the_ledger_is_the_txn_actions_of_the_latest_commit(table):
    ledger_commit(table, 1, {("t", 0): 10, ("t", 1): 5})
    ledger_commit(table, 2, {("t", 0): 20, ("t", 1): 5})
    other_write(table)

    ledger = read_ledger(table, DeltaTable(table.uri), "p", TPS)

    assert (ledger.batch, ledger.offsets, ledger.rewind) == (2, {("t", 0): 20, ("t", 1): 5}, None)
    assert read_ledger(table, DeltaTable(table.uri), "other", TPS).batch is None  # pipelines do not see each other


def test_a_restore_rewinds_the_offsets_until_a_commit_records_it(table):
    ledger_commit(table, 1, {("t", 0): 10})  # v1
    ledger_commit(table, 2, {("t", 0): 20})  # v2
    DeltaTable(table.uri).restore(1)  # v3: files of v1, but txn still says 20

    ledger = read_ledger(table, DeltaTable(table.uri), "p", TPS)

    assert ledger.offsets == {("t", 0): 10}
    assert ledger.batch == 2  # batch numbers never go back: a zombie of batch 2 still finds it committed
    assert ledger.rewind == Rewind(restore_commit=3, restored_version=1, from_={"t": {"0": 20}}, to={"t": {"0": 10}})
    ledger_commit(table, 3, {("t", 0): 15})  # the next batch writes the rewound offsets and records it
    after = read_ledger(table, DeltaTable(table.uri), "p", TPS)
    assert (after.offsets, after.rewind) == ({("t", 0): 15}, None)


def test_a_restore_before_the_pipelines_last_commit_is_already_recorded(table):
    ledger_commit(table, 1, {("t", 0): 10})
    DeltaTable(table.uri).restore(0)
    ledger_commit(table, 2, {("t", 0): 4})

    history = commit_history(table, DeltaTable(table.uri))

    assert find_unrecorded_restore(history, "p", DeltaTable(table.uri).version()) is None
    # ...but another pipeline in the same table has not recorded it
    assert find_unrecorded_restore(history, "q", DeltaTable(table.uri).version()) == (0, 2)


def test_restored_version_from_a_timestamp_restore(table):
    ledger_commit(table, 1, {("t", 0): 10})  # v1
    time.sleep(0.05)
    moment = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    ledger_commit(table, 2, {("t", 0): 20})  # v2, after the moment
    DeltaTable(table.uri).restore(moment)  # v3

    history = commit_history(table, DeltaTable(table.uri))
    restore = next(e for e in history if e["operation"] == "RESTORE")

    assert _restored_version(history, restore) == 1
    assert read_ledger(table, DeltaTable(table.uri), "p", TPS).offsets == {("t", 0): 10}


def test_a_chain_of_restores_follows_each_back_to_a_ledger_commit(table):
    ledger_commit(table, 1, {("t", 0): 10})  # v1
    ledger_commit(table, 2, {("t", 0): 20})  # v2
    ledger_commit(table, 3, {("t", 0): 30})  # v3
    DeltaTable(table.uri).restore(2)  # v4: ledger as of v2 (20)
    DeltaTable(table.uri).restore(1)  # v5: ledger as of v1 (10)

    assert read_ledger(table, DeltaTable(table.uri), "p", TPS).offsets == {("t", 0): 10}
    # As of v4 the ledger was v2's, and v4 itself did not know of the later restore.
    assert ledger_at(table, "p", TPS, 4).offsets == {("t", 0): 20}


def test_history_of_a_stale_or_time_travelled_object_is_truly_numbered(table):
    for batch in (1, 2, 3):
        ledger_commit(table, batch, {("t", 0): batch * 10})
    stale = DeltaTable(table.uri, version=1)
    ledger_commit(table, 4, {("t", 0): 40})

    versions = [e["version"] for e in commit_history(table, stale)]

    assert versions == [1, 0]  # only what version 1 had, numbered as in the log
    entries = pipeline_history(table, DeltaTable(table.uri), "p")
    assert [(h.version, h.meta.batch) for h in entries] == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_metadata_is_written_and_read_by_one_definition():
    meta = CommitMetadata(
        "p",
        "reset",
        batch=3,
        attempt="a1",
        reason="skip poison",
        from_={"t": {"0": 5}},
        offsets={"t": {"0": 9}},
        run=Run.here("dag", "run_1", 2),
    )
    raw = meta.to_json()

    assert '"from":{"t":{"0":5}}' in raw and '"offsetlake":' in raw and '"by":"airflow"' in raw
    assert CommitMetadata.parse(raw) == CommitMetadata.parse(CommitMetadata.parse(raw).to_json())
    parsed = CommitMetadata.parse(raw)
    assert (parsed.reason, parsed.run.dag_id, parsed.run.try_number) == ("skip poison", "dag", 2)
    # Tolerant reader: fields a newer writer adds are ignored; other tools' metadata is not ours.
    assert CommitMetadata.parse('{"pipeline":"p","kind":"ingest","batch":1,"new_field":[1]}').batch == 1
    assert CommitMetadata.parse('{"written_by":"someone else"}') is None
    assert CommitMetadata.parse('not json, "pipeline"') is None
    entry = HistoryEntry(7, 1, "WRITE", parsed)
    assert entry.as_dict()["from"] == {"t": {"0": 5}} and entry.as_dict()["version"] == 7


def history_reads(monkeypatch) -> list:
    """Record how many commits each history read asks delta-rs for (None: the whole log)."""
    from offsetlake.protocol import ledger

    asked, real = [], ledger._latest_history

    def spy(location, table, limit):
        asked.append(limit)
        return real(location, table, limit)

    monkeypatch.setattr(ledger, "_latest_history", spy)
    return asked


def test_reading_the_ledger_reads_only_the_newest_commits_however_old_the_table(table, monkeypatch):
    for batch in range(1, 41):
        ledger_commit(table, batch, {("t", 0): batch * 10})
    asked = history_reads(monkeypatch)

    ledger = read_ledger(table, DeltaTable(table.uri), "p", TPS)

    assert ledger.offsets == {("t", 0): 400}
    assert asked == [8]  # the newest commit is the pipeline's: one first page, never the 41 commits


def test_a_restore_behind_many_other_commits_is_still_found(table, monkeypatch):
    ledger_commit(table, 1, {("t", 0): 10})  # v1
    ledger_commit(table, 2, {("t", 0): 20})  # v2
    DeltaTable(table.uri).restore(1)  # v3
    for _ in range(40):  # another writer keeps committing after the restore
        other_write(table)
    asked = history_reads(monkeypatch)

    assert read_ledger(table, DeltaTable(table.uri), "p", TPS).offsets == {("t", 0): 10}
    assert asked[:3] == [8, 32, 128]  # pages grow until the pipeline's last commit is reached


def test_history_with_a_limit_reads_only_as_far_back_as_it_needs(table, monkeypatch):
    for batch in range(1, 31):
        ledger_commit(table, batch, {("t", 0): batch})
        other_write(table)
    asked = history_reads(monkeypatch)

    newest = pipeline_history(table, DeltaTable(table.uri), "p", limit=3)

    assert [h.meta.batch for h in newest] == [28, 29, 30]
    assert None not in asked and max(asked) <= 8
    assert [h.meta.batch for h in pipeline_history(table, DeltaTable(table.uri), "p")] == list(range(1, 31))


def test_history_since_a_moment_reads_no_further_back(table, monkeypatch):
    for batch in range(1, 41):
        ledger_commit(table, batch, {("t", 0): batch})
    time.sleep(0.05)
    since = int(time.time() * 1000)
    ledger_commit(table, 41, {("t", 0): 41})
    ledger_commit(table, 42, {("t", 0): 42})
    asked = history_reads(monkeypatch)

    recent = pipeline_history(table, DeltaTable(table.uri), "p", since_ms=since)

    assert [h.meta.batch for h in recent] == [41, 42]
    assert asked == [8]


def test_a_restore_whose_target_log_clean_up_removed_is_named_in_one_line_and_a_reset_goes_on(table, tmp_path):
    """A RESTORE by another writer, then log clean-up removing the restored version before any commit recorded
    the ledger as of then: reading the ledger says so in one line, naming the way out; a reset (a ledger commit
    of the offsets given) is that way, and the ledger reads again."""
    from offsetlake.errors import RewindOutOfReach

    ledger_commit(table, 1, {("t", 0): 10})  # v1
    ledger_commit(table, 2, {("t", 0): 20})  # v2
    DeltaTable(table.uri).restore(1)  # v3, not recorded
    DeltaTable(table.uri).create_checkpoint()
    for version in (0, 1, 2):  # what log clean-up removes once the checkpoint covers it
        (tmp_path / "table" / "_delta_log" / f"{version:020d}.json").unlink()

    with pytest.raises(
        RewindOutOfReach, match=r"RESTORE in version 3 took it back to version 1, .* `offsetlake reset`"
    ):
        read_ledger(table, DeltaTable(table.uri), "p", TPS)

    ledger_commit(table, 3, {("t", 0): 12}, kind="reset")  # what reset commits
    assert read_ledger(table, DeltaTable(table.uri), "p", TPS).offsets == {("t", 0): 12}


def delta_rs_asked(monkeypatch) -> list[str]:
    """The app ids delta-rs is asked for (each such call replays the log), as `txn_versions` asks them."""
    asked: list[str] = []
    real = DeltaTable.transaction_version

    def spy(self, app_id):
        asked.append(app_id)
        return real(self, app_id)

    monkeypatch.setattr(DeltaTable, "transaction_version", spy)
    return asked


def test_txn_versions_read_from_the_newest_commit_equal_delta_rs_replaying_the_log(table, monkeypatch):
    app_ids = [
        *(pipeline_app_id(p) for p in ("p", "q", "never")),
        *(partition_app_id(p, t, n) for p in ("p", "q", "never") for t, n in TPS),
    ]
    asked = delta_rs_asked(monkeypatch)
    assert txn_versions(table, DeltaTable(table.uri), app_ids) == dict.fromkeys(app_ids)  # version 0
    assert asked == []  # version 0's commit is the whole log

    ledger_commit(table, 1, {("t", 0): 10, ("t", 1): 5})
    ledger_commit(table, 1, {("t", 0): 3}, pipeline="q")
    ledger_commit(table, 2, {("t", 0): 20, ("t", 1): 7})
    for newest in ("p's batch commit", "another writer's commit"):
        if newest == "another writer's commit":
            other_write(table)
        latest = DeltaTable(table.uri)
        asked.clear()
        read = txn_versions(table, latest, app_ids)
        asked_by_txn_versions = set(asked)  # before the replay below asks delta-rs for every id
        replayed = {app_id: latest.transaction_version(app_id) for app_id in app_ids}
        assert read == replayed
        assert read[partition_app_id("p", "t", 0)] == 20 and read[pipeline_app_id("q")] == 1
        mine = [pipeline_app_id("p"), *(partition_app_id("p", t, n) for t, n in TPS)]
        left_to_delta_rs = set(app_ids) if newest == "another writer's commit" else set(app_ids) - set(mine)
        assert asked_by_txn_versions == left_to_delta_rs


def test_a_table_another_writer_set_to_expire_txn_actions_is_asked_of_delta_rs_alone(table, monkeypatch):
    ledger_commit(table, 1, {("t", 0): 10})
    DeltaTable(table.uri).alter.set_table_properties({LEDGER_EXPIRING_PROPERTY: "interval 7 days"})
    ledger_commit_unchecked(table, 2, {("t", 0): 20})
    asked = delta_rs_asked(monkeypatch)

    assert txn_versions(table, DeltaTable(table.uri), [pipeline_app_id("p")]) == {pipeline_app_id("p"): 2}
    assert asked == [pipeline_app_id("p")]


def ledger_commit_unchecked(uri: Location, batch: int, offsets: dict) -> None:
    """A ledger's txn actions written by delta-rs itself (offsetlake refuses such a table)."""
    DeltaTable(uri.uri).create_write_transaction(
        [],
        mode="append",
        schema=SCHEMA,
        commit_properties=CommitProperties(app_transactions=txn_actions("p", batch, offsets)),
    )
