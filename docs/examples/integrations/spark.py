"""The orders table from Spark with delta-spark (`spark` is your session, Databricks' included)."""

import os

path = os.path.join(os.environ.get("OFFSETLAKE_LAKE", "lake"), "orders")
orders = spark.read.format("delta").load(path)  # noqa: F821 - your SparkSession
orders.groupBy("customer").count().orderBy("customer").show()
spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation", "userMetadata").show()  # noqa: F821
