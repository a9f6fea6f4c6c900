"""A Spark session that reads Delta tables: delta-spark from Maven Central, at the release that pairs with
your Spark (here pyspark 4.2 and delta-spark 4.4.0)."""

from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.config("spark.jars.packages", "io.delta:delta-spark_4.2_2.13:4.4.0")
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .getOrCreate()
)
