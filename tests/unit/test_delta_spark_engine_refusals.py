"""What the delta-spark engine (engine/delta_spark.py) refuses before it asks for a Spark session."""

from __future__ import annotations

import pytest

from offsetlake.config import parse_pipeline
from offsetlake.engine.delta_spark import DeltaSpark
from offsetlake.errors import TableError


def test_the_delta_spark_engine_refuses_a_table_in_an_object_store_before_anything_is_written():
    """delta-spark makes no conditional put, so on S3 two writers of one version would not be kept apart: the
    engine refuses such a table in one line, before a Spark session is even asked for."""
    cfg = parse_pipeline(
        {
            "name": "orders",
            "topics": ["orders"],
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "format": {"type": "raw"},
            "table": {
                "path": "s3://lake/orders",
                "engine": "delta-spark",
                "storage_options": {"conditional_put": "etag"},
            },
        },
        "orders.yaml",
    )
    with pytest.raises(TableError, match=r"^table s3://lake/orders: the delta-spark engine writes tables on a local"):
        DeltaSpark(cfg, spark=None).open()
    with pytest.raises(TableError, match="Use `table.engine: delta-rs` for this table"):
        DeltaSpark(cfg, spark=object()).session  # noqa: B018 - the property refuses
