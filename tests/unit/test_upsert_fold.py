"""Upsert mode's pure logic: which row of a key wins in a batch, tombstones and null keys in a task's rows,
and the MERGE's conditions."""

import pyarrow as pa
import pytest

from offsetlake.config import DELETED_COLUMN, NEW_KEY_COLUMN, OLD_KEY_COLUMN, parse_pipeline
from offsetlake.errors import UpsertKeyError
from offsetlake.formats.records import convert
from offsetlake.protocol.key_changes import KeyChanges, carry_across_key_changes
from offsetlake.protocol.merge_batch import merge_of_batch
from offsetlake.protocol.upsert import (
    Merge,
    SnapshotEnd,
    after_last_truncate,
    after_snapshot_end,
    latest_per_key,
    stale_as_deleted,
)
from offsetlake.read.reader import MESSAGE_SCHEMA

UNAVAILABLE = "__debezium_unavailable_value"


def batch_rows(rows: list[tuple]) -> pa.Table:
    """(key, partition, offset, seq, deleted) per row."""
    key, partition, offset, seq, deleted = zip(*rows)
    return pa.table(
        {
            "k": pa.array(key, pa.string()),
            "seq": pa.array(seq, pa.int64()),
            "kafka_topic": pa.array(["t"] * len(rows)),
            "kafka_partition": pa.array(partition, pa.int32()),
            "kafka_offset": pa.array(offset, pa.int64()),
            DELETED_COLUMN: pa.array(deleted, pa.bool_()),
        }
    )


def test_the_highest_offset_of_a_key_wins_within_its_partition():
    rows = batch_rows([("a", 0, 5, 1, False), ("b", 0, 6, 2, False), ("a", 0, 9, 3, True), ("b", 0, 7, 4, False)])
    winners = latest_per_key(rows, ["k"], None)
    assert winners.select(["k", "kafka_offset", DELETED_COLUMN]).to_pylist() == [
        {"k": "a", "kafka_offset": 9, DELETED_COLUMN: True},
        {"k": "b", "kafka_offset": 7, DELETED_COLUMN: False},
    ]
    assert winners.column_names == rows.column_names  # every column of the winner, not only the key


def test_a_key_in_two_partitions_is_refused_naming_it():
    rows = batch_rows([("a", 0, 5, 1, False), ("a", 1, 2, 2, False), ("b", 0, 6, 1, False)])
    with pytest.raises(UpsertKeyError) as err:
        latest_per_key(rows, ["k"], None, batch=4)
    message = str(err.value)
    assert message.startswith("batch 4: key k='a' arrives in t[0] and t[1] (1 such keys)"), message
    assert "write.order_by" in message and "\n" not in message


def test_with_order_by_the_greatest_value_wins_across_partitions():
    rows = batch_rows([("a", 0, 5, 7, False), ("a", 1, 2, 9, False), ("a", 0, 8, 3, False)])
    (winner,) = latest_per_key(rows, ["k"], "seq").to_pylist()
    assert (winner["kafka_partition"], winner["kafka_offset"], winner["seq"]) == (1, 2, 9)


def test_a_merge_matches_on_every_key_column_quoted_and_orders_only_with_order_by():
    merge = Merge(
        pa.table({"userId": pa.array([], pa.int64()), "region": pa.array([], pa.string())}), ["userId", "region"]
    )
    assert merge.predicate() == 't."userId" = s."userId" AND t."region" = s."region"'
    assert merge.updates() == f"NOT s.{DELETED_COLUMN}"
    ordered = Merge(pa.table({"x": [1]}), ["id"], order_by="lsn")
    assert ordered.updates() == f'NOT s.{DELETED_COLUMN} AND (t."lsn" IS NULL OR s."lsn" >= t."lsn")'


def test_a_merge_bounds_integer_and_string_keys_by_the_batch_range_so_files_outside_it_are_pruned():
    source = pa.table(
        {
            "id": pa.array([7, -3, 12], pa.int64()),
            "name": ["b", "o'neil", "a"],
            "at": pa.array([1.5, 0.5, 2.5], pa.float64()),
        }
    )
    merge = Merge(source, ["id", "name", "at"])
    assert merge.key_ranges() == {
        "id": ("-3", "12"),
        "name": ("'a'", "'o''neil'"),
    }  # a float's text may not compare exactly
    assert merge.predicate() == (
        't."id" = s."id" AND t."name" = s."name" AND t."at" = s."at"'
        ' AND t."id" >= -3 AND t."id" <= 12 AND t."name" >= \'a\' AND t."name" <= \'o\'\'neil\''
    )


def pipeline(**write):
    return parse_pipeline(
        {
            "name": "p",
            "topics": ["t"],
            "kafka": {"bootstrap_servers": "x:1"},
            "table": {"path": "/tmp/x"},
            "format": {"type": "json", "schema": [{"name": "id", "type": "long"}], "key": {"type": "string"}},
            "write": {"mode": "upsert", "key": ["kafka_key"], **write},
        },
        "p.yaml",
    )


def messages(records: list[tuple[bytes | None, bytes | None]]) -> pa.Table:
    n = len(records)
    return pa.Table.from_arrays(
        [
            pa.array([k for k, _ in records], pa.binary()),
            pa.array([v for _, v in records], pa.binary()),
            pa.array(["t"] * n),
            pa.array([0] * n, pa.int32()),
            pa.array(range(10, 10 + n), pa.int64()),
            pa.array([1_700_000_000_000] * n, pa.timestamp("ms", tz="UTC")),
        ],
        schema=MESSAGE_SCHEMA,
    )


def test_a_tombstone_is_a_deleting_row_and_a_record_without_key_is_quarantined():
    rows, bad = convert(pipeline(), messages([(b"a", b'{"id": 1}'), (b"a", None), (None, b'{"id": 2}')]))
    assert rows.select(["kafka_key", "id", "kafka_offset", DELETED_COLUMN]).to_pylist() == [
        {"kafka_key": "a", "id": 1, "kafka_offset": 10, DELETED_COLUMN: False},
        {"kafka_key": "a", "id": None, "kafka_offset": 11, DELETED_COLUMN: True},
    ]
    assert bad.select(["kafka_offset", "value", "error"]).to_pylist() == [
        {"kafka_offset": 12, "value": b'{"id": 2}', "error": "write.key column 'kafka_key' is null"}
    ]


def test_with_deletes_ignore_a_tombstone_is_no_row_at_all():
    rows, bad = convert(pipeline(deletes="ignore"), messages([(b"a", None), (b"b", b'{"id": 3}')]))
    assert rows.select(["kafka_key", DELETED_COLUMN]).to_pylist() == [{"kafka_key": "b", DELETED_COLUMN: False}]
    assert bad.num_rows == 0


def change_rows(rows: list[tuple]) -> pa.Table:
    """(key, partition, offset, position, op, note) per row: Debezium events as the staging files hold them."""
    key, partition, offset, position, op, note = zip(*rows)
    return pa.table(
        {
            "k": pa.array(key, pa.string()),
            "note": pa.array(note, pa.string()),
            "_debezium_op": pa.array(op, pa.string()),
            "_debezium_position": pa.array(position, pa.int64()),
            "kafka_topic": pa.array(["t"] * len(rows)),
            "kafka_partition": pa.array(partition, pa.int32()),
            "kafka_offset": pa.array(offset, pa.int64()),
            DELETED_COLUMN: pa.array([o == "d" for o in op], pa.bool_()),
        }
    )


def test_a_truncate_drops_what_came_before_it_by_position_and_keeps_what_came_after():
    rows = change_rows(
        [("a", 0, 1, 10, "c", "x"), ("b", 1, 1, 30, "c", "y"), (None, 0, 2, 20, "t", None), ("a", 0, 3, 40, "u", "z")]
    )
    after, truncated = after_last_truncate(rows, "_debezium_position")
    assert truncated
    assert after.select(["k", "kafka_offset"]).to_pylist() == [
        {"k": "b", "kafka_offset": 1},  # another partition, but later at the source
        {"k": "a", "kafka_offset": 3},
    ]
    assert after_last_truncate(rows.slice(0, 2), "_debezium_position") == (rows.slice(0, 2), False)


def test_a_truncate_without_order_by_is_refused_beside_another_partition():
    rows = change_rows([("a", 0, 1, 10, "c", "x"), (None, 1, 2, 20, "t", None)])
    with pytest.raises(UpsertKeyError, match="a TRUNCATE and records of t.0. and t.1."):
        after_last_truncate(rows, None, batch=4)
    single = change_rows([("a", 0, 1, 10, "c", "x"), (None, 0, 2, 20, "t", None), ("b", 0, 3, 5, "c", "y")])
    after, _ = after_last_truncate(single, None)
    assert after.column("k").to_pylist() == ["b"]  # by offset: the position is not asked


def test_a_snapshots_end_deletes_the_rows_older_than_it_that_it_did_not_read():
    rows = change_rows(
        [
            ("a", 0, 1, 10, "c", "old"),  # before a connector lost its offsets
            ("b", 0, 2, 11, "c", "old"),  # deleted at the source while no change was captured: never read again
            ("a", 0, 3, 50, "r", "now"),  # the new snapshot, taken at position 50
            ("a", 0, 3, 50, "snapshot_end", None),  # its marker (formats/debezium.py): the same record
            ("c", 0, 4, 45, "u", "late"),  # a transaction open when the snapshot began: after it, kept
        ]
    )
    rows, ends = after_snapshot_end(rows)
    assert ends == (SnapshotEnd(50, "t", 0, 3),)
    assert "snapshot_end" not in rows.column("_debezium_op").to_pylist()
    winners = stale_as_deleted(latest_per_key(rows, ["k"], "_debezium_position"), ends)
    assert {r["k"]: r[DELETED_COLUMN] for r in winners.to_pylist()} == {"a": False, "b": True, "c": False}

    merge = Merge(winners, ["k"], "_debezium_position", snapshot_ends=ends)
    assert merge.predicate() == 't."k" = s."k"'  # every target row seen: one the batch lacks may be stale
    assert merge.stale() == """(t.kafka_topic = 't' AND t."_debezium_position" < 50)"""
    assert after_snapshot_end(rows) == (rows, ()) and stale_as_deleted(winners, ()) is winners


def test_a_snapshots_end_concerns_its_own_topic_only():
    rows = change_rows(
        [("a", 0, 1, 10, "c", "old"), ("b", 0, 2, 60, "r", "now"), ("b", 0, 2, 60, "snapshot_end", None)]
    )
    other = change_rows([("x", 0, 7, 5, "c", "other table")])  # another topic (source table), older
    other = other.set_column(other.schema.get_field_index("kafka_topic"), "kafka_topic", pa.array(["u"]))
    rows, ends = after_snapshot_end(pa.concat_tables([rows, other]))
    winners = stale_as_deleted(latest_per_key(rows, ["k"], "_debezium_position"), ends)
    assert {r["k"]: r[DELETED_COLUMN] for r in winners.to_pylist()} == {"a": True, "b": False, "x": False}


def test_an_unavailable_value_takes_the_keys_latest_earlier_value_else_stays_for_the_merge():
    gone = "__debezium_unavailable_value"
    rows = change_rows(
        [
            ("a", 0, 1, 10, "c", "first"),
            ("a", 0, 2, 11, "u", gone),
            ("b", 0, 3, 12, "u", gone),  # no earlier value of b in the batch: the table's is kept
            ("a", 0, 4, 13, "u", "second"),
            ("a", 0, 5, 14, "u", gone),
            ("c", 0, 6, 15, "u", None),  # a real null is a value
        ]
    )
    winners = latest_per_key(rows, ["k"], "_debezium_position", unavailable=gone)
    assert winners.select(["k", "note"]).to_pylist() == [
        {"k": "b", "note": gone},
        {"k": "a", "note": "second"},
        {"k": "c", "note": None},
    ]
    merge = Merge(winners, ["k"], "_debezium_position", unavailable=gone)
    assert merge.unavailable_columns == ["note"]
    update = merge.assignments(winners.column_names, ["k", "note"], keep_target=True)
    assert update['"note"'] == f"""CASE WHEN s."note" = '{gone}' THEN t."note" ELSE s."note" END"""
    insert = merge.assignments(winners.column_names, ["k", "note"], keep_target=False)
    assert insert['"note"'] == f"""CASE WHEN s."note" = '{gone}' THEN NULL ELSE s."note" END"""
    assert insert['"k"'] == 's."k"' and f'"{DELETED_COLUMN}"' not in insert


def key_change_rows(rows: list[tuple], first_offset: int = 0) -> pa.Table:
    """(id, position, note, old key header, new key header, deleted) per row, one partition, offsets in list
    order from `first_offset`: a Debezium table's staging rows with the keys a primary-key change names."""
    ids, position, note, old, new, deleted = zip(*rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "note": pa.array(note, pa.string()),
            "_debezium_position": pa.array(position, pa.int64()),
            "kafka_topic": pa.array(["t"] * len(rows)),
            "kafka_partition": pa.array([0] * len(rows), pa.int32()),
            "kafka_offset": pa.array(range(first_offset, first_offset + len(rows)), pa.int64()),
            OLD_KEY_COLUMN: pa.array([None if o is None else o.encode() for o in old], pa.binary()),
            NEW_KEY_COLUMN: pa.array([None if n is None else n.encode() for n in new], pa.binary()),
            DELETED_COLUMN: pa.array(deleted, pa.bool_()),
        }
    )


def moved_rows(rows: list[tuple]) -> pa.Table:
    """(id, position, note, old key header, deleted) per row: `key_change_rows` without the new keys."""
    return key_change_rows([(i, at, note, old, None, deleted) for i, at, note, old, deleted in rows]).drop_columns(
        [NEW_KEY_COLUMN]
    )


def carried(rows: pa.Table, table: dict | None = None):
    lookups = []

    def old_rows(keys):
        lookups.append(sorted(keys))
        return {k: row for k, row in (table or {}).items() if k in keys}

    out, changes = carry_across_key_changes(rows, ["id"], "_debezium_position", UNAVAILABLE, old_rows)
    assert OLD_KEY_COLUMN not in out.column_names
    return {r["kafka_offset"]: r["note"] for r in out.to_pylist()}, changes, lookups


def test_a_key_changes_create_takes_what_it_lacks_from_the_old_keys_row_earlier_in_the_batch():
    rows = moved_rows(
        [
            (1, 10, "big", None, False),  # inserted with its value
            (1, 11, UNAVAILABLE, None, False),  # updated, the value left alone
            (1, 12, None, None, True),  # the key change: delete of the old key...
            (2, 12, UNAVAILABLE, '{"id":1}', False),  # ...and create of the new one, without the value
            (2, 13, UNAVAILABLE, None, False),  # a later update of the new key
        ]
    )
    notes, changes, lookups = carried(rows)
    assert notes[3] == "big" and notes[4] == "big" and notes[1] == "big"
    assert changes == KeyChanges(carried=1, left_null=0) and lookups == []  # the batch had it: no table read


def test_an_old_row_only_in_the_table_gives_its_value_and_a_chain_of_changes_follows_it():
    rows = moved_rows(
        [
            (1, 12, None, None, True),
            (2, 12, UNAVAILABLE, '{"schema": {}, "payload": {"id": 1}}', False),  # the converter's schemas
            (2, 14, None, None, True),
            (3, 14, UNAVAILABLE, '{"id":2}', False),  # changed again: from the first change's new row
        ]
    )
    notes, changes, lookups = carried(rows, table={(1,): {"id": 1, "note": "in the table"}})
    assert notes[1] == notes[3] == "in the table"
    assert changes == KeyChanges(carried=2, left_null=0) and lookups == [[(1,), (2,)]]


def test_a_value_no_row_holds_stays_for_the_merge_and_is_counted():
    rows = moved_rows([(5, 20, None, None, True), (6, 20, UNAVAILABLE, '{"id":5}', False)])
    notes, changes, _ = carried(rows, table={})
    assert notes[1] == UNAVAILABLE and changes == KeyChanges(carried=0, left_null=1)
    # A real null in the old row is carried as null, not left out.
    notes, changes, _ = carried(rows, table={(5,): {"id": 5, "note": None}})
    assert notes[1] is None and changes == KeyChanges(carried=1, left_null=0)


def test_a_header_that_names_no_key_of_the_pipeline_carries_nothing():
    rows = moved_rows([(5, 20, None, None, True), (6, 20, UNAVAILABLE, '{"other":5}', False)])
    notes, changes, _ = carried(rows, table={(5,): {"id": 5, "note": "x"}})
    assert notes[1] == UNAVAILABLE and changes == KeyChanges(carried=0, left_null=1)


def merged_batches(batches: list[pa.Table], deletes: bool = True) -> tuple[dict, list[KeyChanges]]:
    """The table {id: row} after each batch's Merge is applied as the MERGE does (the test's own model of it:
    a row not older than the target's replaces it or deletes it, a placeholder keeps the target's value), and
    what each batch's key changes carried."""
    table: dict[tuple, dict] = {}
    changes = []
    for number, rows in enumerate(batches, 1):
        old_rows = lambda keys: {k: dict(table[k]) for k in keys if k in table}  # noqa: E731
        merge, moved = merge_of_batch(rows, ["id"], "_debezium_position", UNAVAILABLE, number, old_rows, deletes)
        changes.append(moved)
        for row in merge.source.to_pylist():
            now = table.get((row["id"],))
            if now is not None and row["_debezium_position"] < now["_debezium_position"]:
                continue
            if row[DELETED_COLUMN]:
                table.pop((row["id"],), None)
                continue
            kept = {c: (now or {}).get(c) if v == UNAVAILABLE else v for c, v in row.items()}
            table[(row["id"],)] = {c: kept[c] for c in ("id", "note", "_debezium_position")}
    return table, changes


# A key change 1 -> 2 in one transaction after an update of 1's large value: the update, the old key's delete
# naming the new key, and the new key's create naming the old one, without the value.
KEY_CHANGE = [
    (1, 11, "changed", None, None, False),
    (1, 12, None, None, '{"id":2}', True),
    (2, 12, UNAVAILABLE, '{"id":1}', None, False),
]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_key_change_cut_by_a_batch_anywhere_moves_the_row_with_its_latest_values(cut):
    """Wherever a batch ends (before the delete, between the delete and the create, after both), the new key
    holds the value updated just before the move, and the old key is gone once the create is applied."""
    first = key_change_rows([(1, 10, "big", None, None, False)])
    rows = key_change_rows(KEY_CHANGE, first_offset=1)
    table, changes = merged_batches([first, rows.slice(0, cut), rows.slice(cut)])
    assert table == {(2,): {"id": 2, "note": "changed", "_debezium_position": 12}}
    assert sum(c.carried for c in changes) == 1 and sum(c.left_null for c in changes) == 0


def test_between_the_delete_and_the_create_the_old_row_stays_with_its_latest_values():
    first = key_change_rows([(1, 10, "big", None, None, False)])
    table, _ = merged_batches([first, key_change_rows(KEY_CHANGE[:2], first_offset=1)])
    assert table == {(1,): {"id": 1, "note": "changed", "_debezium_position": 11}}


def test_the_old_key_inserted_again_before_the_create_is_kept_and_not_taken_from():
    """The old key inserted again after the change, and read in a batch before the change's create (another
    partition's record, seen first): the new row stays, and is no source for the moved row's value."""
    first = key_change_rows([(1, 10, "big", None, None, False)])
    before = key_change_rows([KEY_CHANGE[1], (1, 13, "again", None, None, False)], first_offset=1)
    table, changes = merged_batches([first, before, key_change_rows([KEY_CHANGE[2]], first_offset=3)])
    assert table[(1,)]["note"] == "again" and table[(2,)]["note"] is None
    assert changes[-1] == KeyChanges(carried=0, left_null=1)


def test_with_deletes_ignored_a_key_change_keeps_the_old_row_and_the_new_takes_its_value():
    first = key_change_rows([(1, 10, "big", None, None, False)])
    rows = key_change_rows([KEY_CHANGE[0], KEY_CHANGE[2]], first_offset=1)  # the reader dropped the delete
    table, _ = merged_batches([first, rows.slice(0, 1), rows.slice(1)], deletes=False)
    assert table[(1,)]["note"] == table[(2,)]["note"] == "changed"
