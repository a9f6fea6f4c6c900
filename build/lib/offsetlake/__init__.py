"""offsetlake: Kafka to Delta Lake, exactly once, as Spark micro-batches driven by Airflow."""

__version__ = "0.1.0"
