"""The one commit path against real delta-rs tables on disk (no Kafka, no Spark).

What these prove: a commit holds data, ledger and metadata in one version; a
change decided against a snapshot that someone else moved past is decided
again, never rebased; a retry or zombie of a committed batch writes nothing and
its files go; running out of tries is one typed error; clean-up never deletes
a file a landed commit references.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from offsetlake.errors import CommitConflictError, StorageError
from offsetlake.protocol import commit as commit_module
from offsetlake.protocol.commit import (
    Change,
    Committed,
    Settled,
    add_actions,
    attempt_files,
    commit,
    new_attempt_id,
    verdict,
)
from offsetlake.protocol.ledger import Ledger, pipeline_history, read_ledger, txn_actions
from offsetlake.protocol.metadata import CommitMetadata, Records, Run
from offsetlake.protocol.planning import BatchPlan
from offsetlake.storage.location import Location
from offsetlake.storage.parquet import write_file
from offsetlake.table import open_table

SCHEMA = pa.schema([("kafka_partition", pa.int32()), ("kafka_offset", pa.int64())])
TP0 = ("t", 0)


@pytest.fixture
def table(tmp_path) -> Location:
    uri = Location.of(str(tmp_path / "table"))
    open_table(uri, SCHEMA, [], "test")
    return uri


def plan(batch: int, start: int, end: int, seen: int | None) -> BatchPlan:
    return BatchPlan("p", batch, {TP0: start}, {TP0: end}, ledger_offsets={TP0: seen})


def data_file(uri: Location, attempt: str, start: int, end: int):
    rows = pa.table(
        {
            "kafka_partition": pa.array([0] * (end - start), pa.int32()),
            "kafka_offset": pa.array(range(start, end), pa.int64()),
        }
    )
    return write_file(uri, f"part-00000001-{attempt}-t00000-a0-000.zstd.parquet", rows, {})


def ingest_change(uri: Location, p: BatchPlan, attempt: str, files) -> commit_module.Decide:
    """What ingest decides: the verdict on the ledger of the snapshot, then data + txn + metadata."""

    def decide(snapshot) -> Change | Settled:
        refused = verdict(read_ledger(uri, snapshot, "p", [TP0]), p)
        if refused is not None:
            return refused
        meta = CommitMetadata(
            "p",
            "ingest",
            batch=p.batch,
            attempt=attempt,
            ranges={"t": {"0": [p.starts[TP0], p.ends[TP0]]}},
            records=Records(rows=sum(f.num_records for f in files)),
            run=Run.here(),
        )
        return Change(meta, add_actions(files), txn_actions("p", p.batch, p.ends), SCHEMA)

    return decide


def test_verdict_refuses_a_committed_batch_and_a_moved_ledger_only():
    assert verdict(Ledger(None, {}), plan(1, 0, 10, None)) is None
    assert verdict(Ledger(1, {TP0: 10}), plan(2, 10, 20, 10)) is None
    done = verdict(Ledger(2, {TP0: 20}), plan(2, 10, 20, 10))
    assert done is not None and done.status == "already_committed"
    moved = verdict(Ledger(1, {TP0: 15}), plan(2, 10, 20, 10))  # a reset moved the ledger meanwhile
    assert moved is not None and moved.status == "superseded"


def test_data_offsets_and_metadata_land_in_one_version(table):
    attempt = new_attempt_id()
    f = data_file(table, attempt, 0, 10)

    outcome = commit(table, ingest_change(table, plan(1, 0, 10, None), attempt, [f]), "batch 1")

    assert isinstance(outcome, Committed) and outcome.version == 1
    assert outcome.added_paths() == {f.path}
    loaded = DeltaTable(table.uri)
    assert loaded.version() == 1
    ledger = read_ledger(table, loaded, "p", [TP0])
    assert (ledger.batch, ledger.offsets) == (1, {TP0: 10})
    entry = pipeline_history(table, loaded, "p")[-1]
    assert entry.version == 1 and entry.meta.attempt == attempt and entry.meta.records.rows == 10
    assert [a for a in loaded.get_add_actions(flatten=True).column("path").to_pylist()] == [f.path]


def test_a_retry_of_a_committed_batch_writes_nothing_and_its_files_go(table):
    first, retry = new_attempt_id(), new_attempt_id()
    with attempt_files(first, table) as files:
        f1 = data_file(table, first, 0, 10)
        files.written[table].add(f1.path)
        files.kept[table] = commit(table, ingest_change(table, plan(1, 0, 10, None), first, [f1]), "b1").added_paths()
    with attempt_files(retry, table) as files:  # the zombie: same batch, planned from the same ledger
        f2 = data_file(table, retry, 0, 10)
        files.written[table].add(f2.path)
        outcome = commit(table, ingest_change(table, plan(1, 0, 10, None), retry, [f2]), "batch 1")

    assert isinstance(outcome, Settled) and outcome.status == "already_committed"
    assert DeltaTable(table.uri).version() == 1
    on_disk = {p.name for p in Path(table.uri).glob("*.parquet")}
    assert on_disk == {f1.path}  # the zombie's file is gone, the committed one stays


def test_a_commit_that_lost_the_race_is_decided_again_never_rebased(table):
    """Someone commits the same batch between our snapshot and our commit: Delta refuses ours,
    we decide again against the new snapshot, and find the batch committed."""
    ours, theirs = new_attempt_id(), new_attempt_id()
    f_ours, f_theirs = data_file(table, ours, 0, 10), data_file(table, theirs, 0, 10)
    decisions = []
    inner = ingest_change(table, plan(1, 0, 10, None), ours, [f_ours])

    def decide(snapshot):
        decisions.append(snapshot.version())
        change = inner(snapshot)
        if len(decisions) == 1:  # the other writer lands after our snapshot
            commit(table, ingest_change(table, plan(1, 0, 10, None), theirs, [f_theirs]), "their batch 1")
        return change

    outcome = commit(table, decide, "batch 1")

    assert decisions == [0, 1]
    assert isinstance(outcome, Settled) and outcome.status == "already_committed"
    history = pipeline_history(table, DeltaTable(table.uri), "p")
    assert [h.meta.attempt for h in history] == [theirs]  # one commit of batch 1: theirs


def test_a_commit_records_how_many_commits_landed_before_it(table):
    """Two unrelated writers land between our snapshots and our commit: ours says `conflicts: 2`."""
    rivals = iter(range(1, 3))

    def decide(snapshot):
        change = Change(CommitMetadata("p", "reset", attempt=new_attempt_id()), schema=SCHEMA)
        batch = next(rivals, None)
        if batch is not None:
            commit(
                table,
                lambda t: Change(
                    CommitMetadata("q", "reset", attempt=new_attempt_id()),
                    txns=txn_actions("q", batch, {}),
                    schema=SCHEMA,
                ),
                "rival",
            )
        return change

    outcome = commit(table, decide, "reset")

    assert [(m.pipeline, m.conflicts) for m in offsetlake_commits(table)] == [("q", 0), ("q", 0), ("p", 2)]
    assert outcome.change.metadata.conflicts == 2


def test_running_out_of_tries_is_one_typed_error_and_writes_nothing(table, monkeypatch):
    monkeypatch.setattr(commit_module, "MAX_ATTEMPTS", 3)
    rivals = iter(range(1, 100))

    def decide(snapshot):
        change = Change(CommitMetadata("p", "reset", attempt=new_attempt_id()), schema=SCHEMA)
        batch = next(rivals)  # an unrelated writer commits after every snapshot we take
        commit(
            table,
            lambda t: Change(
                CommitMetadata("q", "reset", attempt=new_attempt_id()), txns=txn_actions("q", batch, {}), schema=SCHEMA
            ),
            "rival",
        )
        return change

    with pytest.raises(CommitConflictError) as err:
        commit(table, decide, "reset")

    assert str(err.value) == (
        "reset: gave up after 3 commit conflicts with concurrent writers; nothing was written, run it again"
    )
    assert [m.pipeline for m in offsetlake_commits(table)] == ["q", "q", "q"]


def test_an_error_after_the_commit_landed_still_reports_it_committed(table, monkeypatch):
    """An object store can time out after the write succeeded: we look for our attempt before giving up,
    so the caller keeps the committed files instead of deleting them."""
    real_apply = commit_module._apply

    def apply_then_fail(snapshot, change):
        real_apply(snapshot, change)
        raise OSError("connection reset while reading the response")

    monkeypatch.setattr(commit_module, "_apply", apply_then_fail)
    attempt = new_attempt_id()
    f = data_file(table, attempt, 0, 5)

    outcome = commit(table, ingest_change(table, plan(1, 0, 5, None), attempt, [f]), "batch 1")

    assert isinstance(outcome, Committed) and outcome.version == 1 and outcome.added_paths() == {f.path}


@pytest.mark.parametrize(
    "error, raised, message",
    [
        # the store's: one line
        (
            OSError("no space left on device"),
            StorageError,
            "^batch 1: the commit to .* did not land: no space left on device$",
        ),
        # of another kind, with no other writer to explain it: not taken for a conflict
        (DeltaError("Invalid table version: 1"), DeltaError, "^Invalid table version: 1$"),
    ],
    ids=["store", "another kind"],
)
def test_an_error_before_anything_landed_is_raised(table, monkeypatch, error, raised, message):
    def fail(snapshot, change):
        raise error

    monkeypatch.setattr(commit_module, "_apply", fail)
    with pytest.raises(raised, match=message):
        commit(table, ingest_change(table, plan(1, 0, 5, None), new_attempt_id(), []), "batch 1")
    assert DeltaTable(table.uri).version() == 0


def test_a_conflict_with_our_own_landed_commit_is_our_commit(table, monkeypatch):
    """An object store lost the answer to our put; the client's retry met our own log entry and reported a
    conflict. That is our commit (found by its attempt id), not another writer's: deciding again would
    settle as `already_committed` and the caller would delete the files the commit references."""
    apply = commit_module._apply

    def lands_then_conflicts(snapshot, change):
        apply(snapshot, change)
        raise CommitFailedError("Version 1 already exists")

    monkeypatch.setattr(commit_module, "_apply", lands_then_conflicts)
    outcome = commit(table, ingest_change(table, plan(1, 0, 5, None), new_attempt_id(), []), "batch 1")

    assert isinstance(outcome, Committed) and outcome.version == 1
    assert DeltaTable(table.uri).version() == 1


def test_an_error_of_another_kind_while_another_writer_landed_is_decided_again(table, monkeypatch):
    """delta-rs can report a lost race as something else (`Invalid table version: N`, from its check of the
    versions landed since our snapshot): ours did not land and the table moved on, so we decide again."""
    apply, raced = commit_module._apply, []

    def rival_lands_then_error(snapshot, change):
        if not raced:
            raced.append(True)
            rival = Change(CommitMetadata("q", "reset", attempt=new_attempt_id()), txns=txn_actions("q", 1, {}))
            commit(table, lambda t: replace(rival, schema=SCHEMA), "rival")
            raise DeltaError(f"Invalid table version: {snapshot.version() + 1}")
        return apply(snapshot, change)

    monkeypatch.setattr(commit_module, "_apply", rival_lands_then_error)
    attempt = new_attempt_id()
    outcome = commit(table, ingest_change(table, plan(1, 0, 5, None), attempt, []), "batch 1")

    assert isinstance(outcome, Committed) and outcome.version == 2 and outcome.change.metadata.conflicts == 1
    assert [(m.pipeline, m.attempt == attempt) for m in offsetlake_commits(table)] == [("q", False), ("p", True)]


def files_on_disk(table: str) -> list[str]:
    return sorted(str(p.relative_to(table.uri)) for p in Path(table.uri).rglob("*.parquet"))


def test_attempt_files_deletes_what_the_attempt_wrote_and_no_commit_kept(table):
    mine, other = new_attempt_id(), new_attempt_id()
    kept_file = write_file(table, f"a/part-1-{mine}-t00000-a1-000.zstd.parquet", pa.table({"x": [1]}), {})
    dropped = write_file(table, f"a/part-1-{mine}-t00001-a2-000.zstd.parquet", pa.table({"x": [1]}), {})
    write_file(table, f"part-1-{other}-t00000-a0-000.zstd.parquet", pa.table({"x": [1]}), {})

    with attempt_files(mine, table) as files:
        files.written[table] |= {kept_file.path, dropped.path}
        files.kept[table] = {kept_file.path}

    # A few deletes by name, whatever the size of the table: no listing on the way of every batch.
    assert files_on_disk(table) == sorted([kept_file.path, f"part-1-{other}-t00000-a0-000.zstd.parquet"])


def test_after_an_error_every_file_of_the_attempt_is_found_by_its_id(table):
    mine, other = new_attempt_id(), new_attempt_id()
    kept_file = write_file(table, f"a/part-1-{mine}-t00000-a1-000.zstd.parquet", pa.table({"x": [1]}), {})
    write_file(table, f"a/part-1-{mine}-t00000-a2-000.zstd.parquet", pa.table({"x": [1]}), {})  # never reported
    write_file(table, f"part-1-{other}-t00000-a0-000.zstd.parquet", pa.table({"x": [1]}), {})

    with pytest.raises(RuntimeError):
        with attempt_files(mine, table) as files:
            files.kept[table] = {kept_file.path}
            raise RuntimeError("the Spark job failed half-way")

    assert files_on_disk(table) == sorted([kept_file.path, f"part-1-{other}-t00000-a0-000.zstd.parquet"])


def offsetlake_commits(uri: Location) -> list[CommitMetadata]:
    """The metadata of every offsetlake commit in the table, any pipeline, oldest first."""
    metas = (CommitMetadata.parse(e.get("userMetadata")) for e in reversed(DeltaTable(uri).history()))
    return [m for m in metas if m is not None]
