"""offsetlake.spark_daemon in real Spark: the workers run without Spark's archives on sys.path.

Without it each task re-reads pyspark.zip's and the spark-core jar's directories (see the module);
nothing else would notice if a Spark upgrade stopped honouring `spark.python.daemon.module`.
"""
from __future__ import annotations

import sys

import pytest

from offsetlake import spark_daemon


def test_spark_workers_import_pyspark_from_the_installation_with_no_zip_importer(spark):
    def worker_paths(index, _rows):  # nested: pickled by value, the workers cannot import this module
        import sys as worker_sys
        import pyspark
        zips = [key for key, finder in worker_sys.path_importer_cache.items()
                if type(finder).__name__ == "zipimporter"]
        yield {"path": list(worker_sys.path), "zip_importers": zips, "pyspark": pyspark.__file__}

    [seen] = spark.sparkContext.parallelize([0], 1).mapPartitionsWithIndex(worker_paths).collect()
    assert not any(spark_daemon._is_spark_archive(p) for p in seen["path"]), seen["path"]
    assert seen["zip_importers"] == []
    assert ".zip" not in seen["pyspark"] and ".jar" not in seen["pyspark"]


@pytest.mark.parametrize("importable", [True, False])
def test_the_archives_stay_when_pyspark_would_not_import_without_them(monkeypatch, importable):
    archives = ["/spark/python/lib/pyspark.zip", "/spark/python/lib/py4j-0.10.9.9-src.zip",
                "/spark/jars/spark-core_2.13-4.1.3.jar"]
    path = [archives[0], "/work", archives[1], archives[2], "/venv/site-packages"]
    monkeypatch.setattr(sys, "path", list(path))
    monkeypatch.setattr(sys, "path_importer_cache", {archives[0]: object(), f"{archives[2]}/org": object(),
                                                     "/work": object()})
    monkeypatch.setattr(spark_daemon.importlib.util, "find_spec", lambda name: object() if importable else None)
    spark_daemon.drop_spark_archives()
    if importable:
        assert sys.path == ["/work", "/venv/site-packages"]
        assert list(sys.path_importer_cache) == ["/work"]
    else:
        assert sys.path == path
