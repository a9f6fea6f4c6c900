"""The orders table from Polars (its Delta reader is delta-rs)."""

import os

import polars as pl

orders = pl.read_delta(os.path.join(os.environ.get("OFFSETLAKE_LAKE", "lake"), "orders"))
print(orders.select("order_id", "customer", "amount", "kafka_partition", "kafka_offset").head())
