"""The lock offsetlake's delta-spark writers take around a commit (engine/spark_transaction.log_lock): held by
one process, another cannot take it until it is let go. delta-spark's own log store on a file system keeps
writers apart only inside one JVM."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from offsetlake.engine.spark_transaction import LOCK_FILE, log_lock
from offsetlake.storage.location import Location


def other_process_can_lock(log_dir) -> bool:
    probe = textwrap.dedent(
        f"""
        import fcntl, sys
        with open({str(log_dir / LOCK_FILE)!r}, "a") as f:
            try:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                sys.exit(1)
        """
    )
    return subprocess.run([sys.executable, "-c", probe], timeout=60).returncode == 0


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_a_commit_holds_the_tables_log_lock_against_other_processes(tmp_path, prefix):
    (tmp_path / "_delta_log").mkdir()
    location = Location.of(prefix + str(tmp_path))
    with log_lock(location):
        assert not other_process_can_lock(tmp_path / "_delta_log")
    assert other_process_can_lock(tmp_path / "_delta_log")


def test_no_lock_is_taken_before_the_table_exists_or_on_an_object_store(tmp_path):
    with log_lock(Location.of(str(tmp_path / "not-yet"))):
        assert not (tmp_path / "not-yet").exists()  # nothing created where the table will be
    with log_lock(Location.of("s3://lake/orders")):
        pass
