"""A full disk while a batch writes its data files: the batch fails with one line naming the path,
nothing is committed, the attempt's files are removed, and once space is freed the next run is exact.

The lake lives on a small tmpfs the test mounts (root, as CI runs) and unmounts; a filler file
takes the space a batch needs.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from deltalake import DeltaTable

from hosts import require
from offsetlake.table import committed_files
from support import assert_exactly_once, data_files_on_disk, ingest_process, new_pipeline, produce

pytestmark = pytest.mark.slow
SIZE_MB = 16


@pytest.fixture
def small_disk(tmp_path):
    require(os.geteuid() == 0, "root", "mounting a small tmpfs needs root (CI runs as root)")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def fill(disk, leave_bytes: int):
    """A filler file that leaves `leave_bytes` free on `disk`; returns its path."""
    filler = disk / "filler"
    stats = os.statvfs(disk)
    left = stats.f_bavail * stats.f_frsize - leave_bytes
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as out:  # written, not truncated: tmpfs counts only the pages written
        while left > 0:
            left -= out.write(chunk[: min(len(chunk), left)])
    return filler


def test_a_full_disk_fails_the_batch_in_one_line_and_the_next_run_is_exact(spark, bootstrap, pipelines_dir, small_disk):
    from offsetlake.batch import ingest

    cfg, topic = new_pipeline(bootstrap, pipelines_dir, small_disk, partitions=2, records=300)
    ingest(spark, cfg)
    version = DeltaTable(cfg.table_path).version()
    files_before = data_files_on_disk(cfg.table_path)
    produce(cfg.kafka, topic, 40_000, seed=3)
    filler = fill(small_disk, leave_bytes=64 * 1024)

    job = ingest_process(cfg, pipelines_dir)
    out, err = job.communicate(timeout=300)

    assert job.returncode != 0, out
    lines = err.strip().splitlines()
    assert lines[-1].startswith("offsetlake: error: "), err[-3000:]
    assert cfg.table_path in lines[-1] and "No space left on device" in lines[-1], lines[-1]
    assert DeltaTable(cfg.table_path).version() == version  # nothing committed
    assert data_files_on_disk(cfg.table_path) == files_before  # the attempt's files are gone

    filler.unlink()
    ingest(spark, cfg)
    assert_exactly_once(cfg)
    assert committed_files(cfg.table_location) <= data_files_on_disk(cfg.table_path)
