"""delta-spark, the Delta engine of Spark and Databricks, beside offsetlake's writer (delta-rs) in the tests'
Spark session: its jars (src/offsetlake_local/poms/delta-spark.xml, resolved by `make jars`), its SQL
extension and catalog, as a Databricks or Spark user's session has them."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from offsetlake.storage.location import Location
from offsetlake.storage.parquet import plain_types
from offsetlake_local.jars import delta_spark_stack, spark_jars


def delta_spark_conf() -> dict[str, str]:
    return {
        "spark.jars": ",".join(spark_jars(delta_spark_stack())),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def reader(spark) -> Callable[[Location | str], pa.Table]:
    """The oracle's `read` (oracle.check): a table's current version as delta-spark reads it."""

    def read(location: Location | str) -> pa.Table:
        return plain_types(spark.read.format("delta").load(str(location)).toArrow())

    return read


def sql(spark, statement: str) -> list:
    """One SQL statement through delta-spark; its rows."""
    return spark.sql(statement).collect()


def change_reader(spark) -> Callable[[Location | str, int], pa.Table]:
    """The oracle's `read_changes` (oracle.assert_exactly_once): a table's change feed from a version on, as
    delta-spark's `readChangeFeed` reads it (delta-rs' load_cdf refuses a table with column mapping)."""

    def read_changes(location: Location | str, starting_version: int) -> pa.Table:
        feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", starting_version)
        return plain_types(feed.load(str(location)).toArrow())

    return read_changes
