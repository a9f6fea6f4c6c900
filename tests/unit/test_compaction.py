"""Compaction's pure parts: which files go together, and the Z-order of rows."""

from __future__ import annotations

import pyarrow as pa

from offsetlake.operations.compaction import _bins, zorder_indices

MB = 1024 * 1024


def actions(*files) -> pa.Table:
    return pa.Table.from_pylist([{"path": p, "size_bytes": size, "partition.day": day} for p, size, day in files])


def test_small_files_are_packed_per_partition_up_to_the_target_and_lone_files_left_alone():
    files = actions(
        ("a1", 10 * MB, "d1"),
        ("a2", 10 * MB, "d1"),
        ("a3", 10 * MB, "d1"),
        ("b1", 10 * MB, "d2"),  # alone in its partition: nothing to merge it with
        ("c1", 200 * MB, "d1"),
    )  # already above the target
    bins = _bins(files, ["day"], target=25 * MB)
    assert [[f["path"] for f in b] for b in bins] == [["a1", "a2"]]  # a3 would pass 25 MB: next bin, alone
    bins = _bins(files, ["day"], target=128 * MB)
    assert [[f["path"] for f in b] for b in bins] == [["a1", "a2", "a3"]]


def test_only_the_files_asked_for_are_compacted():
    files = actions(("a1", MB, "d1"), ("a2", MB, "d1"), ("a3", MB, "d1"))
    assert [[f["path"] for f in b] for b in _bins(files, ["day"], 128 * MB, only={"a2", "a3"})] == [["a2", "a3"]]
    assert _bins(files, ["day"], 128 * MB, only={"a1"}) == []


def test_z_order_keeps_rows_close_in_every_column():
    # A 4x4 grid: sorted by x alone, y jumps around; along the Z curve each 2x2 quadrant stays together.
    rows = pa.table({"x": [x for x in range(4) for _ in range(4)], "y": [y for _ in range(4) for y in range(4)]})
    order = rows.take(zorder_indices(rows, ["x", "y"])).to_pylist()
    quadrants = [(r["x"] // 2, r["y"] // 2) for r in order]
    groups = [quadrants[i : i + 4] for i in range(0, 16, 4)]
    assert all(len(set(g)) == 1 for g in groups), quadrants  # four rows of one quadrant, then the next
    assert len({g[0] for g in groups}) == 4
    assert sorted(map(tuple, (r.values() for r in order))) == sorted(map(tuple, (r.values() for r in rows.to_pylist())))


def test_z_order_handles_nulls_strings_and_a_single_value():
    rows = pa.table({"s": ["b", None, "a", "b"], "n": [1, 1, 1, 1]})
    order = rows.take(zorder_indices(rows, ["s", "n"]))
    assert order.num_rows == 4 and order["s"].to_pylist()[:3] == ["a", "b", "b"]
