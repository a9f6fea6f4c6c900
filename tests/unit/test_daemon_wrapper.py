"""offsetlake.spark.daemon.quiet_on_closed_socket, the wrapper around pyspark.daemon's `worker`, on its own:
what it turns a BrokenPipeError into, and what it lets through. (That Spark's daemon runs through
offsetlake.spark.daemon at all is checked on real workers in tests/integration/test_spark_daemon.py.)"""

from __future__ import annotations

import pytest

from offsetlake.spark import daemon as spark_daemon


def test_a_broken_pipe_becomes_exit_code_1_and_other_outcomes_pass_through():
    def closed(sock, authenticated):
        raise BrokenPipeError(32, "Broken pipe")

    def served(sock, authenticated):
        return 0

    def failed(sock, authenticated):
        raise ValueError("a real failure")

    assert spark_daemon.quiet_on_closed_socket(closed)(None, True) == 1  # exits, as on any failure
    assert spark_daemon.quiet_on_closed_socket(served)(None, True) == 0  # stays for the next task
    with pytest.raises(ValueError):
        spark_daemon.quiet_on_closed_socket(failed)(None, True)  # still printed by pyspark's daemon
