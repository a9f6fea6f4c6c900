"""offsetlake.spark.jvm_archive with a real JVM: the archive is built, a session's driver maps Spark's classes
from it, and a failed build leaves nothing a JVM could map (a truncated archive crashes the JVM).

Each session runs in a child Python: driver JVM options count only when PySpark first launches a JVM,
and this test process may have one already.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from offsetlake.spark import jvm_archive

# A child that starts a local session with offsetlake's settings plus a class-loading log, runs a job, stops.
SESSION = """
import sys
from offsetlake.spark.session import build_session, spark_conf
options = spark_conf("local[1]").get("spark.driver.extraJavaOptions", "")
spark = build_session("jvm-archive-test", "local[1]", extra_conf={
    "spark.driver.extraJavaOptions": f"{options} -Xlog:class+load=info:file={sys.argv[1]}"})
spark.sparkContext.parallelize(range(2), 2).collect()
spark.stop()
"""


def spark_classes_loaded(log: Path) -> dict[str, int]:
    """How many org.apache.spark classes the driver took from the archive ("top" layer) and read from jars
    (lambda classes, made at run time, are neither)."""
    counts = {"archive": 0, "jars": 0}
    for line in log.read_text().splitlines():
        if " org.apache.spark." in line and "shared objects file (top)" in line:
            counts["archive"] += 1
        elif " org.apache.spark." in line and ("source: file:" in line or "source: jar:" in line):
            counts["jars"] += 1
    return counts


def run_session(tmp_path: Path, name: str) -> dict[str, int]:
    log = tmp_path / f"{name}.log"
    subprocess.run([sys.executable, "-c", SESSION, str(log)], check=True, timeout=300)
    return spark_classes_loaded(log)


def test_a_built_archive_gives_the_driver_sparks_classes_and_none_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFSETLAKE_JVM_ARCHIVE_DIR", str(tmp_path / "none"))
    without = run_session(tmp_path, "without")
    assert without["archive"] == 0 and without["jars"] > 1000, without

    monkeypatch.setenv("OFFSETLAKE_JVM_ARCHIVE_DIR", str(tmp_path / "archives"))
    path = jvm_archive.build()
    assert path is not None and path.is_file() and path.parent == tmp_path / "archives"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial dump left beside it
    built = path.stat().st_mtime_ns
    assert jvm_archive.build() == path and path.stat().st_mtime_ns == built  # an existing archive is kept

    with_archive = run_session(tmp_path, "with")
    # Nearly every Spark class the driver needs comes from the archive (6 of ~2,000 were read from jars).
    assert with_archive["archive"] >= 0.95 * without["jars"], (with_archive, without)
    assert with_archive["jars"] <= 0.05 * without["jars"], (with_archive, without)


def fake_java(tmp_path: Path, exit_code: int) -> Path:
    """A JAVA_HOME whose java exits at once: Spark's launcher fails as with a broken JDK."""
    home = tmp_path / f"jdk-{exit_code}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'broken java' >&2\nexit {exit_code}\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return home


def test_a_failed_dump_raises_and_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFSETLAKE_JVM_ARCHIVE_DIR", str(tmp_path / "archives"))
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, 3)))
    with pytest.raises(RuntimeError, match="could not dump the JVM class archive"):
        jvm_archive.build()
    assert list((tmp_path / "archives").iterdir()) == []
    assert jvm_archive.driver_java_options() == ""


def test_the_archive_name_changes_with_the_jvm_and_the_jars(tmp_path, monkeypatch):
    spark_home = tmp_path / "spark"
    (spark_home / "jars").mkdir(parents=True)
    (spark_home / "jars" / "spark-core_2.13-4.2.0.jar").write_bytes(b"")
    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, 0)))
    first = jvm_archive.archive_path()
    (spark_home / "jars" / "spark-sql_2.13-4.2.0.jar").write_bytes(b"")
    second = jvm_archive.archive_path()
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, 1)))
    third = jvm_archive.archive_path()
    rewritten = spark_home / "jars" / "spark-sql_2.13-4.2.0.jar"  # the same jar installed again
    os.utime(rewritten, ns=(rewritten.stat().st_atime_ns, rewritten.stat().st_mtime_ns + 1_000_000_000))
    fourth = jvm_archive.archive_path()
    assert len({first, second, third, fourth}) == 4
    assert jvm_archive.archive_path() == fourth  # and the same files, the same name
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert jvm_archive.archive_path() is None and jvm_archive.driver_java_options() == ""
