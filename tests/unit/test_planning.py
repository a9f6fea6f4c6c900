"""Batch planning is pure logic: caps, splits, data loss, starting offsets."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offsetlake.errors import DataLossError
from offsetlake.protocol.planning import BatchPlan, apply_data_loss, assign_slots, cap_ends, split_ranges, start_offsets
from offsetlake.protocol.ranges import OffsetRange

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def test_cap_shares_the_batch_fairly_and_never_exceeds_it():
    ends = cap_ends({A: 0, B: 0, C: 0}, {A: 1000, B: 10, C: 1000}, 300)
    assert ends == {A: 145, B: 10, C: 145}


def test_cap_gives_everything_when_the_backlog_fits():
    assert cap_ends({A: 5, B: 7}, {A: 10, B: 7}, 100) == {A: 10, B: 7}


@given(
    st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1),
    st.integers(1, 5000),
)
def test_cap_properties(spans, cap):
    starts = {("t", p): lo for p, (lo, _) in spans.items()}
    targets = {("t", p): lo + n for p, (lo, n) in spans.items()}
    ends = cap_ends(starts, targets, cap)
    granted = sum(ends[tp] - starts[tp] for tp in starts)
    backlog = sum(targets[tp] - starts[tp] for tp in starts)
    assert granted == min(cap, backlog)
    assert all(starts[tp] <= ends[tp] <= targets[tp] for tp in starts)


def test_split_ranges_tiles_each_partition():
    tasks = split_ranges([OffsetRange("t", 0, 10, 35), OffsetRange("t", 1, 0, 5)], 10)
    assert [(r.partition, r.start, r.end) for r in tasks] == [(0, 10, 20), (0, 20, 30), (0, 30, 35), (1, 0, 5)]


def test_start_offsets_first_batch_and_new_partitions():
    log_starts, ends = {A: 3, B: 0, C: 7}, {A: 50, B: 60, C: 70}
    assert start_offsets({}, True, "earliest", log_starts, ends) == {A: 3, B: 0, C: 7}
    assert start_offsets({}, True, "latest", log_starts, ends) == {A: 50, B: 60, C: 70}
    # later batches: known partitions from the ledger, a new partition from its earliest offset
    assert start_offsets({A: 40, B: 41}, False, "latest", log_starts, ends) == {A: 40, B: 41, C: 7}


def test_data_loss_fails_naming_the_range():
    with pytest.raises(DataLossError, match=r"t\[1\] offsets \[5, 9\) were deleted"):
        apply_data_loss({A: 10, B: 5}, {A: 0, B: 9}, "fail")


def test_data_loss_skip_moves_to_the_log_start_and_records_it():
    starts, lost = apply_data_loss({A: 10, B: 5}, {A: 0, B: 9}, "skip")
    assert starts == {A: 10, B: 9} and lost == {B: (5, 9)}


def test_plan_ranges_and_commit_need():
    plan = BatchPlan("p", 1, starts={A: 0, B: 5}, ends={A: 10, B: 5})
    assert [(r.partition, r.start, r.end) for r in plan.ranges] == [(0, 0, 10)]
    assert plan.needs_commit and plan.span == 10
    assert not BatchPlan("p", 1, starts={A: 5}, ends={A: 5}).needs_commit
    assert BatchPlan("p", 1, starts={A: 5}, ends={A: 5}, rewind={"restored_version": 1}).needs_commit


def test_assign_slots_gives_each_slot_tasks_to_run_in_order_and_evens_out_the_records():
    assert assign_slots([250, 250, 250, 250], 2) == [[0, 2], [1, 3]]
    assert assign_slots([100, 10, 10, 80], 2) == [[0], [1, 2, 3]]
    sizes = [5, 9, 3, 7, 1, 8]
    slots = assign_slots(sizes, 3)
    assert sorted(i for s in slots for i in s) == list(range(6))  # every task exactly once
    assert all(s == sorted(s) for s in slots)
    loads = [sum(sizes[i] for i in s) for s in slots]
    assert max(loads) - min(loads) <= 2, loads  # 11 each at best


def test_assign_slots_gives_each_task_its_own_slot_when_slots_are_unknown_or_enough():
    assert assign_slots([3, 4], None) == [[0], [1]]
    assert assign_slots([3, 4], 8) == [[0], [1]]
    assert assign_slots([], 2) == []
