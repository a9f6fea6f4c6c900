"""A table on S3 from Spark, through Hadoop's S3A: the settings for one bucket on an S3-compatible endpoint
(leave `endpoint` out for AWS itself). Credentials come from the usual AWS chain, or from
`fs.s3a.bucket.<bucket>.access.key` and `secret.key`."""

import os

bucket = os.environ.get("LAKE_BUCKET", "lake")
endpoint = os.environ.get("S3_ENDPOINT", "http://127.0.0.1:9000")

hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: F821 - your SparkSession
for key, value in {
    "endpoint": endpoint,
    "endpoint.region": "us-east-1",
    "path.style.access": "true",
    "connection.ssl.enabled": "false",  # an http:// endpoint
}.items():
    hadoop.set(f"fs.s3a.bucket.{bucket}.{key}", value)
