"""Debezium's unavailable-value placeholder in each column type (offsetlake.protocol.unavailable): found
in Arrow, and kept out of a real Delta table by the MERGE's SQL."""

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from offsetlake.config import DELETED_COLUMN
from offsetlake.protocol.unavailable import holding_columns, holds, placeholder
from offsetlake.protocol.upsert import Merge

GONE = "__debezium_unavailable_value"
TYPES = {
    "note": pa.string(),
    "photo": pa.binary(),
    "tags": pa.list_(pa.string()),
    "codes": pa.list_(pa.int32()),
    "ranks": pa.list_(pa.int64()),
}
# What Debezium's PostgreSQL connector sends for each (its UnchangedToastedPlaceholder), written out here.
SENT = {
    "note": GONE,
    "photo": GONE.encode(),
    "tags": [GONE],
    "codes": [ord(c) for c in GONE],
    "ranks": [ord(c) for c in GONE],
}


def test_each_type_has_the_connectors_shape_of_the_placeholder_and_numbers_have_none():
    assert {name: placeholder(kind, GONE) for name, kind in TYPES.items()} == SENT
    assert placeholder(pa.int64(), GONE) is None and placeholder(pa.list_(pa.float64()), GONE) is None


def test_only_the_placeholder_itself_is_found_not_a_value_like_it_or_a_null():
    for name, kind in TYPES.items():
        like = SENT[name][:-1] if name != "tags" else [GONE, GONE]  # as long or one shorter, not equal
        values = pa.array([SENT[name], None, like], kind)
        assert holds(values, GONE).to_pylist() == [True, False, False], name
    rows = pa.table({"k": pa.array([GONE], pa.string()), "tags": pa.array([["x"]], TYPES["tags"])})
    assert holding_columns(rows, ["k"], GONE) == []  # a key is never a placeholder's


def test_a_merge_keeps_the_tables_value_for_each_placeholder_and_inserts_null_for_a_new_row(tmp_path):
    uri = str(tmp_path / "t")
    old = {"note": "n1", "photo": b"p1", "tags": ["a"], "codes": [1, 2], "ranks": [3]}
    new = {"note": "n2", "photo": b"p2", "tags": ["b"], "codes": [4], "ranks": [5, 6]}
    schema = pa.schema([pa.field("k", pa.int64()), *(pa.field(n, t) for n, t in TYPES.items())])
    write_deltalake(uri, pa.Table.from_pylist([{"k": 1, **old}, {"k": 2, **old}], schema))
    source = pa.Table.from_pylist(
        [
            {"k": 1, **SENT, DELETED_COLUMN: False},  # every large value left unchanged: all kept
            {"k": 2, **new, DELETED_COLUMN: False},  # every value sent: all replaced
            {"k": 3, **SENT, DELETED_COLUMN: False},  # a new row whose values were never seen: nulls
        ],
        schema.append(pa.field(DELETED_COLUMN, pa.bool_())),
    )
    merge = Merge(source, ["k"], unavailable=GONE)
    assert merge.unavailable_columns == list(TYPES)
    columns, target = source.column_names, schema.names
    (
        DeltaTable(uri)
        .merge(source, merge.predicate(), source_alias="s", target_alias="t")
        .when_matched_update(merge.assignments(columns, target, keep_target=True), merge.updates())
        .when_not_matched_insert(merge.assignments(columns, target, keep_target=False), f"NOT s.{DELETED_COLUMN}")
        .execute()
    )

    rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["k"])
    assert rows == [{"k": 1, **old}, {"k": 2, **new}, {"k": 3, **dict.fromkeys(TYPES)}]


def test_a_column_the_merge_adds_gets_null_for_the_placeholder_never_the_placeholder(tmp_path):
    # delta-rs (1.6) fills a column that merge_schema adds from the source, ignoring its assignment.
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"k": pa.array([1], pa.int64())}))
    schema = pa.schema([pa.field("k", pa.int64()), *(pa.field(n, t) for n, t in TYPES.items())])
    source = pa.Table.from_pylist(
        [{"k": 1, **SENT, DELETED_COLUMN: False}, {"k": 2, **SENT, "note": "sent", DELETED_COLUMN: False}],
        schema.append(pa.field(DELETED_COLUMN, pa.bool_())),
    )
    table = DeltaTable(uri)
    merge = Merge(source, ["k"], unavailable=GONE).for_target(table.schema().to_arrow().names)
    columns, target = source.column_names, ["k"]
    (
        table.merge(merge.source, merge.predicate(), source_alias="s", target_alias="t", merge_schema=True)
        .when_matched_update(merge.assignments(columns, target, keep_target=True), merge.updates())
        .when_not_matched_insert(merge.assignments(columns, target, keep_target=False), f"NOT s.{DELETED_COLUMN}")
        .execute()
    )

    rows = sorted(DeltaTable(uri).to_pyarrow_table().to_pylist(), key=lambda r: r["k"])
    assert rows == [{"k": 1, **dict.fromkeys(TYPES)}, {"k": 2, **dict.fromkeys(TYPES), "note": "sent"}]


def test_a_rebuild_keeps_the_tables_value_where_the_fold_holds_only_the_placeholder():
    from offsetlake.operations.fold import _unknown_from_table

    schema = pa.schema([pa.field("k", pa.int64()), pa.field("photo", TYPES["photo"]), pa.field("n", pa.int64())])
    rebuilt = pa.Table.from_pylist(
        [
            {"k": 1, "photo": SENT["photo"], "n": 1},
            {"k": 2, "photo": SENT["photo"], "n": 2},
            {"k": 3, "photo": b"x", "n": 3},
        ],
        schema,
    )
    current = pa.Table.from_pylist([{"k": 1, "photo": b"kept", "n": 0}, {"k": 3, "photo": b"old", "n": 0}], schema)

    assert _unknown_from_table(rebuilt, current, ["k"], GONE).to_pylist() == [
        {"k": 1, "photo": b"kept", "n": 1},  # the table's value
        {"k": 2, "photo": None, "n": 2},  # the table has no row of the key: nothing is known
        {"k": 3, "photo": b"x", "n": 3},  # a value the fold knows wins
    ]
