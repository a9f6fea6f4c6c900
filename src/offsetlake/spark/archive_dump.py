"""The child process that dumps the driver JVM's class archive: `python -m offsetlake.spark.archive_dump
<target>` (jvm_archive.build runs it). Apart from jvm_archive so that the session set-up, which reads the
archive's path from jvm_archive, is not imported by it."""

from __future__ import annotations

import sys
from pathlib import Path

from offsetlake.spark.jvm_archive import DUMP_TIMEOUT_SECONDS, QUIET
from offsetlake.spark.session import build_session


def dump(target: Path) -> int:
    """Start a local session whose JVM writes its classes to `target` when it exits, use it as a batch
    does (a JVM job, then Python tasks that return small results), then stop it and wait for that exit."""
    spark = build_session(
        "offsetlake-jvm-archive",
        "local[*]",
        extra_conf={"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={target} {QUIET}"},
    )
    context = spark.sparkContext
    context.parallelize(range(2), 2).collect()
    for _ in range(2):
        context.parallelize(range(2), 2).mapPartitionsWithIndex(lambda i, rows: [{"task": i}]).collect()
    jvm = context._gateway.proc
    spark.stop()
    jvm.stdin.close()  # PySpark's JVM exits when its standard input closes; the archive is written then
    return jvm.wait(timeout=DUMP_TIMEOUT_SECONDS)


if __name__ == "__main__":
    sys.exit(dump(Path(sys.argv[1])))
