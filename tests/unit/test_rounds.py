"""each_at_once: a round's tables a few at a time, each outcome in its table's place."""

import threading
import time

from offsetlake.rounds import NOT_STARTED, each_at_once, one_at_a_time


def test_outcomes_keep_the_items_order_and_a_failure_stays_in_its_place():
    def work(n: int) -> int:
        time.sleep(0.01 * (5 - n))  # the later items finish first
        if n == 2:
            raise ValueError("two")
        return n * 10

    outcomes = each_at_once([0, 1, 2, 3, 4], work, at_once=3)
    assert [o if not isinstance(o, Exception) else str(o) for o in outcomes] == [0, 10, "two", 30, 40]


def test_at_once_items_run_together_and_no_more():
    running, most, lock = 0, 0, threading.Lock()
    first_three = threading.Barrier(3, timeout=30)  # broken (an outcome in place) unless three run together

    def work(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        if n < 3:
            first_three.wait()
        time.sleep(0.01)
        with lock:
            running -= 1
        return n

    assert each_at_once(list(range(12)), work, at_once=3) == list(range(12))
    assert most == 3


def test_one_at_a_time_runs_in_the_calling_thread_in_order():
    seen: list[tuple[int, str]] = []
    each_at_once([1, 2, 3], lambda n: seen.append((n, threading.current_thread().name)), at_once=1)
    assert seen == [(n, threading.current_thread().name) for n in (1, 2, 3)]


def test_items_whose_turn_comes_after_stop_are_not_started():
    stop = threading.Event()
    started: list[int] = []

    def work(n: int) -> int:
        started.append(n)
        if n == 1:
            stop.set()
        return n

    outcomes = each_at_once([0, 1, 2, 3], work, at_once=1, stop=stop)
    assert outcomes == [0, 1, NOT_STARTED, NOT_STARTED]
    assert started == [0, 1]


def test_reports_from_tables_at_once_come_one_at_a_time():
    inside, overlapped = threading.Lock(), []

    def report(n: int) -> None:
        if not inside.acquire(blocking=False):
            overlapped.append(n)
            return
        time.sleep(0.005)
        inside.release()

    whole = one_at_a_time(report)
    each_at_once(list(range(40)), whole, at_once=4)
    assert overlapped == []  # unguarded, four threads sleeping inside `report` would find it taken
