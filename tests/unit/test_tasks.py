"""offsetlake.tasks outside Spark: the collector is paused for the task and nothing is frozen, so a
driver or a test that runs a task in its own process keeps collecting everything it holds."""
from __future__ import annotations

import gc

from offsetlake.tasks import collector_paused, in_spark_worker


def test_outside_spark_the_collector_is_paused_for_the_task_and_nothing_is_frozen():
    frozen = gc.get_freeze_count()
    assert not in_spark_worker()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
