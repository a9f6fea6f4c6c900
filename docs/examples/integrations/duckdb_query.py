"""The orders table from DuckDB, through delta-rs: DuckDB queries the table's Arrow dataset in place."""

import os

import duckdb
from deltalake import DeltaTable

orders = DeltaTable(os.path.join(os.environ.get("OFFSETLAKE_LAKE", "lake"), "orders")).to_pyarrow_dataset()
print(duckdb.sql("SELECT customer, count(*) AS orders, sum(amount) AS amount FROM orders GROUP BY 1 ORDER BY 1"))
