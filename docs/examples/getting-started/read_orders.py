"""Read the orders table: the rows, and how each batch got there."""

import os

import polars as pl
from deltalake import DeltaTable

table = DeltaTable(os.path.join(os.environ.get("OFFSETLAKE_LAKE", "lake"), "orders"))
orders = pl.from_arrow(table.to_pyarrow_table())
print(orders.group_by("customer").agg(pl.len().alias("orders"), pl.col("amount").sum()).sort("customer"))
print(f"{orders.height} orders; table version {table.version()}")
