"""offsetlake's Python workers in real Spark: they run without Spark's archives on sys.path
(offsetlake.spark.daemon), talk to their JVM over a Unix socket, and keep what they imported out of the
collector's walk after their first task (offsetlake.read.tasks.freeze_long_lived_objects).

Without these each task re-reads pyspark.zip's and the spark-core jar's directories, waits ~40 ms for its
input on loopback TCP, and waits for a full collection before it starts; only timings would show it,
so these tests look at the workers themselves.
"""

from __future__ import annotations

import sys

import pytest

from offsetlake.spark import daemon as spark_daemon


def test_spark_workers_import_pyspark_from_the_installation_with_no_zip_importer(spark):
    def worker_paths(index, _rows):  # nested: pickled by value, the workers cannot import this module
        import sys as worker_sys

        import pyspark

        zips = [key for key, finder in worker_sys.path_importer_cache.items() if type(finder).__name__ == "zipimporter"]
        yield {"path": list(worker_sys.path), "zip_importers": zips, "pyspark": pyspark.__file__}

    [seen] = spark.sparkContext.parallelize([0], 1).mapPartitionsWithIndex(worker_paths).collect()
    assert not any(spark_daemon._is_spark_archive(p) for p in seen["path"]), seen["path"]
    assert seen["zip_importers"] == []
    assert ".zip" not in seen["pyspark"] and ".jar" not in seen["pyspark"]


def test_workers_talk_to_their_jvm_over_a_unix_socket(spark):
    def jvm_socket(index, _rows):  # the socket pyspark's daemon handed this worker: a local of its `worker`
        import sys as worker_sys

        frame = worker_sys._getframe()
        while frame is not None and not (frame.f_code.co_name == "worker" and "sock" in frame.f_locals):
            frame = frame.f_back
        yield None if frame is None else frame.f_locals["sock"].family.name

    seen = spark.sparkContext.parallelize([0, 1], 2).mapPartitionsWithIndex(jvm_socket).collect()
    assert seen == ["AF_UNIX", "AF_UNIX"]  # AF_INET over loopback TCP


def test_a_worker_freezes_what_it_imported_after_its_first_task(spark):
    def after_a_task(index, _rows):
        import gc as worker_gc

        from offsetlake.read.tasks import collector_paused

        with collector_paused():
            worker_gc.collect()  # would not run: the collector is off inside a task
            paused = not worker_gc.isenabled()
        yield {"paused": paused, "enabled_after": worker_gc.isenabled(), "frozen": worker_gc.get_freeze_count()}

    seen = spark.sparkContext.parallelize([0, 1], 2).mapPartitionsWithIndex(after_a_task).collect()
    for worker in seen:
        # offsetlake.read.tasks, pyarrow and confluent_kafka alone hold tens of thousands of objects
        assert worker["paused"] and worker["enabled_after"] and worker["frozen"] > 10_000, seen


@pytest.mark.parametrize("importable", [True, False])
def test_the_archives_stay_when_pyspark_would_not_import_without_them(monkeypatch, importable):
    archives = [
        "/spark/python/lib/pyspark.zip",
        "/spark/python/lib/py4j-0.10.9.9-src.zip",
        "/spark/jars/spark-core_2.13-4.2.0.jar",
    ]
    path = [archives[0], "/work", archives[1], archives[2], "/venv/site-packages"]
    monkeypatch.setattr(sys, "path", list(path))
    monkeypatch.setattr(
        sys, "path_importer_cache", {archives[0]: object(), f"{archives[2]}/org": object(), "/work": object()}
    )
    monkeypatch.setattr(spark_daemon.importlib.util, "find_spec", lambda name: object() if importable else None)
    spark_daemon.drop_spark_archives()
    if importable:
        assert sys.path == ["/work", "/venv/site-packages"]
        assert list(sys.path_importer_cache) == ["/work"]
    else:
        assert sys.path == path
